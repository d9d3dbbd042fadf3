"""A custom training loop on JAX with keras_dist, checked against one device.

An MLP learns scikit-learn's digits (8x8 images as 64 features, 10 classes)
with a hand-written loop. The step is a pure function of arrays:
``model.stateless_call``, ``jax.value_and_grad`` and
``optimizer.stateless_apply``, run on every replica by ``strategy.run``
inside ``jax.jit``; ``keras_dist.compute_average_loss`` and
``keras_dist.scale_regularization_loss`` scale the loss, and
``strategy.reduce`` collects the loss and the number of correct
predictions. The gradients are not all-reduced by hand: under
``strategy.run`` on JAX they come out of ``jax.value_and_grad`` already
summed over the replicas. The same loop runs twice, from the same initial
weights on the same global batches:

1. under ``keras_dist.MirroredStrategy`` over 4 simulated CPU devices, and
2. under ``keras_dist.get_strategy()``, the default strategy: one device.

The global batch size is 50, which does not divide by 4, and the 1437
training images leave a partial last batch of 37. The input is a list of
NumPy batches (no tf.data). The script prints the loss and accuracy of every
epoch for both runs, then ``MATCH: ...`` (exit status 0) if they end with
the same weights, else ``MISMATCH: ...`` (exit status 1).

Run it (about 10 s on 2 CPU cores)::

    .venv/bin/python examples/custom_loop_jax.py
    .venv/bin/python examples/custom_loop_jax.py --epochs 5

The TensorFlow version of the same loop is
``examples/custom_loop_tensorflow.py``; the guide is
``guides/custom_training_loops.md``.
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "jax"  # this example is the JAX one
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import jax  # noqa: E402
import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_dist  # noqa: E402

SEED = 1234
GLOBAL_BATCH_SIZE = 50  # deliberately not a multiple of the replica count
LEARNING_RATE = 3e-3
L2 = 1e-4
TOLERANCE = 1e-5  # float32 round-off


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    args = parser.parse_args(argv)
    if args.epochs < 1:
        parser.error("--epochs must be positive")
    return args


def load_data():
    """Digits as (N, 64) floats in [0, 1]; a fixed stratified split."""
    digits = load_digits()
    x = (digits.data / 16.0).astype("float32")
    y = digits.target.astype("int32")
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def build_model():
    keras.utils.set_random_seed(SEED)  # the same initial weights for both runs
    return keras.Sequential(
        [
            keras.Input(shape=(64,)),
            keras.layers.Dense(
                64, activation="relu", kernel_regularizer=keras.regularizers.L2(L2)
            ),
            keras.layers.Dense(10),  # logits
        ],
        name="digits_mlp",
    )


def make_batches(x, y, shuffle_seed=None):
    """Global (x, y) batches of NumPy arrays; shuffled with a fixed seed."""
    if shuffle_seed is not None:
        order = np.random.default_rng(shuffle_seed).permutation(len(x))
        x, y = x[order], y[order]
    return [
        (x[start : start + GLOBAL_BATCH_SIZE], y[start : start + GLOBAL_BATCH_SIZE])
        for start in range(0, len(x), GLOBAL_BATCH_SIZE)
    ]


def shards(batch, replicas):
    """Rows each replica gets of a batch (the sizes differ by at most one)."""
    base, extra = divmod(batch, replicas)
    return [base + (r < extra) for r in range(replicas)]


def train(strategy, label, data, epochs):
    """The custom loop under `strategy`; returns the model and epoch losses."""
    x_train, x_test, y_train, y_test = data
    with strategy.scope():
        model = build_model()
        optimizer = keras.optimizers.Adam(learning_rate=LEARNING_RATE)
        optimizer.build(model.trainable_variables)
    loss_object = keras.losses.SparseCategoricalCrossentropy(
        from_logits=True, reduction="none"
    )

    def correct(labels, logits):
        """1.0 per example predicted right (per example: reduce it outside)."""
        predicted = keras.ops.argmax(logits, axis=-1)
        return keras.ops.cast(keras.ops.equal(predicted, labels), "float32")

    def train_step(state, inputs):  # replica context: this replica's rows
        trainable, non_trainable, optimizer_state = state
        images, labels = inputs

        def loss_fn(trainable):
            logits, non_trainable_out, losses = model.stateless_call(
                trainable, non_trainable, images, training=True, return_losses=True
            )
            loss = keras_dist.compute_average_loss(loss_object(labels, logits))
            loss += keras_dist.scale_regularization_loss(sum(losses))
            return loss, (logits, non_trainable_out)

        (loss, (logits, non_trainable)), gradients = jax.value_and_grad(
            loss_fn, has_aux=True
        )(trainable)
        # No all-reduce here: `gradients` are already summed over replicas.
        trainable, optimizer_state = optimizer.stateless_apply(
            optimizer_state, gradients, trainable
        )
        return (trainable, non_trainable, optimizer_state), loss, correct(labels, logits)

    def test_step(state, inputs):
        trainable, non_trainable, _ = state
        images, labels = inputs
        logits, _ = model.stateless_call(trainable, non_trainable, images, training=False)
        loss = keras_dist.compute_average_loss(loss_object(labels, logits))
        return loss, correct(labels, logits)

    @jax.jit
    def distributed_train_step(state, dist_inputs):
        state, losses, corrects = strategy.run(train_step, args=(state, dist_inputs))
        return (
            state,  # the same on every replica: plain replicated arrays
            strategy.reduce("SUM", losses, axis=None),  # the global batch's mean loss
            strategy.reduce("SUM", corrects, axis=0),  # correct predictions in it
        )

    @jax.jit
    def distributed_test_step(state, dist_inputs):  # `state` passes through unchanged
        losses, corrects = strategy.run(test_step, args=(state, dist_inputs))
        return (
            state,
            strategy.reduce("SUM", losses, axis=None),
            strategy.reduce("SUM", corrects, axis=0),
        )

    def run_epoch(step, state, batches, num_examples):
        total_loss = total_correct = 0.0
        dist_dataset = strategy.experimental_distribute_dataset(batches)
        for dist_inputs, (images, _) in zip(dist_dataset, batches, strict=True):
            state, loss, num_correct = step(state, dist_inputs)
            total_loss += float(loss) * len(images)
            total_correct += float(num_correct)
        return state, total_loss / num_examples, total_correct / num_examples

    # The state lives in arrays for the whole run and goes back into the
    # Keras variables once, at the end.
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )
    history = []
    start = time.perf_counter()
    for epoch in range(epochs):
        epoch_start = time.perf_counter()
        train_batches = make_batches(x_train, y_train, shuffle_seed=SEED + epoch)
        state, loss, accuracy = run_epoch(
            distributed_train_step, state, train_batches, len(x_train)
        )
        _, test_loss, test_accuracy = run_epoch(
            distributed_test_step, state, make_batches(x_test, y_test), len(x_test)
        )
        history.append(loss)
        print(
            f"  [{label}] epoch {epoch + 1}/{epochs}: loss {loss:.4f}  "
            f"accuracy {accuracy:.4f}  test_loss {test_loss:.4f}  "
            f"test_accuracy {test_accuracy:.4f}  "
            f"({time.perf_counter() - epoch_start:.1f} s)",
            flush=True,
        )
    print(f"  [{label}] trained in {time.perf_counter() - start:.1f} s", flush=True)
    groups = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)
    for variables, values in zip(groups, state, strict=True):
        for variable, value in zip(variables, values, strict=True):
            variable.assign(value)
    return model, history


def max_weight_diff(a, b):
    return max(
        float(np.max(np.abs(wa - wb)))
        for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True)
    )


def main(argv=None):
    args = parse_args(argv)
    keras_dist.simulate_cpu_devices(4)  # before any computation
    data = load_data()
    x_train, x_test = data[0], data[1]
    strategy = keras_dist.MirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    full, last = divmod(len(x_train), GLOBAL_BATCH_SIZE)

    print(f"keras {keras.version()}, backend {keras.config.backend()}")
    print(f"{strategy!r}: {replicas} replica(s)")
    print(
        f"digits: {len(x_train)} training / {len(x_test)} test images, "
        "64 features, 10 classes"
    )
    print(
        f"global batch size {GLOBAL_BATCH_SIZE} over {replicas} replicas: shards of "
        f"{shards(GLOBAL_BATCH_SIZE, replicas)} rows; {len(x_train)} = {full} x "
        f"{GLOBAL_BATCH_SIZE} + a partial last batch of {last}, split {shards(last, replicas)}"
    )

    print(f"\ncustom loop, MirroredStrategy, {replicas} replicas:", flush=True)
    mirrored_model, mirrored_history = train(strategy, "mirrored", data, args.epochs)
    print("\nthe same loop, default strategy (one device):", flush=True)
    default_strategy = keras_dist.get_strategy()  # no scope entered: one device
    single_model, single_history = train(default_strategy, "single", data, args.epochs)

    diff = max_weight_diff(mirrored_model, single_model)
    loss_diff = max(abs(a - b) for a, b in zip(mirrored_history, single_history))
    print(
        f"\nmax |weight difference|: {diff:.3g}; "
        f"max |epoch loss difference|: {loss_diff:.3g}"
    )
    if diff <= TOLERANCE:
        print(
            "MATCH: the distributed custom loop equals the single-device loop "
            f"(max weight diff {diff:.3g} <= {TOLERANCE:g})"
        )
        return 0
    print(
        "MISMATCH: the distributed custom loop differs from the single-device loop "
        f"(max weight diff {diff:.3g} > {TOLERANCE:g})"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
