"""A custom training loop on TensorFlow with keras_dist, checked against one device.

An MLP learns scikit-learn's digits (8x8 images as 64 features, 10 classes)
with a hand-written loop in the `tf.distribute` style: ``tf.GradientTape``
and ``optimizer.apply_gradients`` inside ``strategy.run``, wrapped in a
``tf.function``; ``keras_dist.compute_average_loss`` and
``keras_dist.scale_regularization_loss`` scale the loss, and
``strategy.reduce`` collects the loss and the number of correct
predictions. The same loop runs twice, from the same initial weights on the
same global batches:

1. under ``keras_dist.MirroredStrategy`` over 4 simulated CPU devices, and
2. under ``keras_dist.get_strategy()``, the default strategy: one device.

The global batch size is 50, which does not divide by 4, and the 1437
training images leave a partial last batch of 37. The script prints the
loss and accuracy of every epoch for both runs, then ``MATCH: ...`` (exit
status 0) if they end with the same weights, else ``MISMATCH: ...`` (exit
status 1).

Run it (about 10 s on 2 CPU cores)::

    .venv/bin/python examples/custom_loop_tensorflow.py
    .venv/bin/python examples/custom_loop_tensorflow.py --epochs 5

The JAX version of the same loop is ``examples/custom_loop_jax.py``; the
guide is ``guides/custom_training_loops.md``.
"""

import argparse
import os
import sys
import time

os.environ["KERAS_BACKEND"] = "tensorflow"  # this example is the TensorFlow one
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
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


def make_dataset(x, y, shuffle_seed=None):
    """Global batches; shuffled with a fixed seed, so both runs see the same."""
    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle_seed is not None:
        dataset = dataset.shuffle(len(x), seed=shuffle_seed, reshuffle_each_iteration=False)
    return dataset.batch(GLOBAL_BATCH_SIZE)


def batch_sizes(num_examples):
    return [
        min(GLOBAL_BATCH_SIZE, num_examples - start)
        for start in range(0, num_examples, GLOBAL_BATCH_SIZE)
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

    def train_step(inputs):  # replica context: this replica's rows
        images, labels = inputs
        with tf.GradientTape() as tape:
            logits = model(images, training=True)
            loss = keras_dist.compute_average_loss(loss_object(labels, logits))
            loss += keras_dist.scale_regularization_loss(sum(model.losses))
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss, correct(labels, logits)

    def test_step(inputs):
        images, labels = inputs
        logits = model(images, training=False)
        loss = keras_dist.compute_average_loss(loss_object(labels, logits))
        return loss, correct(labels, logits)

    @tf.function
    def distributed_train_step(dist_inputs):
        losses, corrects = strategy.run(train_step, args=(dist_inputs,))
        return (
            strategy.reduce("SUM", losses, axis=None),  # the global batch's mean loss
            strategy.reduce("SUM", corrects, axis=0),  # correct predictions in it
        )

    @tf.function
    def distributed_test_step(dist_inputs):
        losses, corrects = strategy.run(test_step, args=(dist_inputs,))
        return (
            strategy.reduce("SUM", losses, axis=None),
            strategy.reduce("SUM", corrects, axis=0),
        )

    def run_epoch(step, dataset, num_examples):
        total_loss = total_correct = 0.0
        dist_dataset = strategy.experimental_distribute_dataset(dataset)
        for dist_inputs, rows in zip(dist_dataset, batch_sizes(num_examples), strict=True):
            loss, num_correct = step(dist_inputs)
            total_loss += float(loss) * rows
            total_correct += float(num_correct)
        return total_loss / num_examples, total_correct / num_examples

    history = []
    start = time.perf_counter()
    for epoch in range(epochs):
        epoch_start = time.perf_counter()
        train_dataset = make_dataset(x_train, y_train, shuffle_seed=SEED + epoch)
        loss, accuracy = run_epoch(distributed_train_step, train_dataset, len(x_train))
        test_loss, test_accuracy = run_epoch(
            distributed_test_step, make_dataset(x_test, y_test), len(x_test)
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
