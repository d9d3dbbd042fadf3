"""Train a small CNN on scikit-learn's digits with keras_dist, and check it.

The model (Conv2D + BatchNormalization + pooling + Dense) is trained twice
from the same initial weights on the same global batches:

1. with ``keras_dist.MirroredStrategy`` over ``--devices`` simulated CPU
   devices (4 by default), and
2. with plain Keras on one device, no strategy at all.

The global batch size is 50, which does not divide by 4, and the 1437
training images leave a partial last batch of 37: keras_dist splits both
across the replicas exactly. The script prints the per-epoch metrics of
both runs, the largest weight difference between the two models and their
test accuracy, then ``MATCH: ...`` (exit status 0) or ``MISMATCH: ...``
(exit status 1).

Run it (JAX is the default backend; 10-15 s on 2 CPU cores)::

    make demo                                   # KERAS_BACKEND=jax
    KERAS_BACKEND=tensorflow .venv/bin/python examples/digits_cnn.py
    .venv/bin/python examples/digits_cnn.py --epochs 5 --devices 2
"""

import argparse
import os
import sys
import time

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402
from sklearn.model_selection import train_test_split  # noqa: E402

import keras_dist  # noqa: E402

SEED = 1234
GLOBAL_BATCH_SIZE = 50  # deliberately not a multiple of the replica count
LEARNING_RATE = 0.05
TOLERANCE = 1e-5  # float32 round-off


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="epochs (default 3)")
    parser.add_argument(
        "--devices",
        type=int,
        default=4,
        help="simulated CPU devices = replicas of the MirroredStrategy (default 4)",
    )
    args = parser.parse_args(argv)
    if args.epochs < 1 or args.devices < 1:
        parser.error("--epochs and --devices must be positive")
    return args


def load_data():
    """Digits as (N, 8, 8, 1) floats in [0, 1]; a fixed stratified split."""
    digits = load_digits()
    x = (digits.images / 16.0).astype("float32")[..., None]
    y = digits.target.astype("int32")
    return train_test_split(x, y, test_size=0.2, random_state=0, stratify=y)


def build_model():
    keras.utils.set_random_seed(SEED)
    return keras.Sequential(
        [
            keras.Input(shape=(8, 8, 1)),
            keras.layers.Conv2D(16, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9),
            # A smooth activation, not ReLU: right after BatchNorm many inputs
            # sit near 0, and where float32 round-off (summing the batch in
            # another order) moves one across ReLU's kink its gradient jumps
            # from 0 to 1; compiled at XLA's -O0 on one CPU that put the runs
            # 2.9e-3 apart under Adam. Smooth, round-off stays round-off.
            keras.layers.Activation("swish"),
            keras.layers.AveragePooling2D(2),  # 4x4 (max pooling has the same kink between near-ties)
            keras.layers.Conv2D(32, 3, padding="same", use_bias=False),
            keras.layers.BatchNormalization(momentum=0.9),
            keras.layers.Activation("swish"),
            keras.layers.AveragePooling2D(2),  # 2x2
            keras.layers.Flatten(),
            keras.layers.Dense(10, activation="softmax"),
        ],
        name="digits_cnn",
    )


def compile_model(model):
    model.compile(
        # SGD with momentum: Adam divides each step by the root of its
        # gradients' second moment, so it turns round-off in near-zero
        # gradients into visible steps; SGD keeps round-off at round-off.
        optimizer=keras.optimizers.SGD(learning_rate=LEARNING_RATE, momentum=0.9),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )


class EpochPrinter(keras.callbacks.Callback):
    """One line per epoch: loss, accuracy, val_loss, val_accuracy, time."""

    def __init__(self, label, epochs):
        super().__init__()
        self.label, self.epochs = label, epochs

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        seconds = time.perf_counter() - self.start
        print(
            f"  [{self.label}] epoch {epoch + 1}/{self.epochs}: "
            f"loss {logs['loss']:.4f}  accuracy {logs['accuracy']:.4f}  "
            f"val_loss {logs['val_loss']:.4f}  "
            f"val_accuracy {logs['val_accuracy']:.4f}  ({seconds:.1f} s)",
            flush=True,
        )


def shards(batch, replicas):
    """Rows each replica gets of a batch (the sizes differ by at most one)."""
    base, extra = divmod(batch, replicas)
    return [base + (r < extra) for r in range(replicas)]


def train(model, label, data, epochs):
    x_train, x_test, y_train, y_test = data
    start = time.perf_counter()
    model.fit(
        x_train,
        y_train,
        batch_size=GLOBAL_BATCH_SIZE,
        epochs=epochs,
        shuffle=False,  # the same batches, in the same order, for both runs
        validation_data=(x_test, y_test),
        callbacks=[EpochPrinter(label, epochs)],
        verbose=0,
    )
    _, test_accuracy = model.evaluate(
        x_test, y_test, batch_size=GLOBAL_BATCH_SIZE, verbose=0
    )
    print(f"  [{label}] trained in {time.perf_counter() - start:.1f} s", flush=True)
    return test_accuracy


def weights_sha256(model):
    """A fingerprint of every weight, bit for bit: the same on every run."""
    import hashlib

    return hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]


def max_weight_diff(a, b):
    return max(
        float(np.max(np.abs(wa - wb)))
        for wa, wb in zip(a.get_weights(), b.get_weights(), strict=True)
    )


def main(argv=None):
    args = parse_args(argv)
    keras_dist.simulate_cpu_devices(args.devices)  # before any computation

    data = load_data()
    x_train, x_test = data[0], data[1]
    strategy = keras_dist.MirroredStrategy()
    replicas = strategy.num_replicas_in_sync
    full, last = divmod(len(x_train), GLOBAL_BATCH_SIZE)

    print(f"keras {keras.version()}, backend {keras.config.backend()}")
    print(f"{strategy!r}: {replicas} replica(s)")
    print(
        f"digits: {len(x_train)} training / {len(x_test)} test images, 8x8x1, 10 classes"
    )
    print(
        f"global batch size {GLOBAL_BATCH_SIZE} over {replicas} replica(s): "
        f"shards of {shards(GLOBAL_BATCH_SIZE, replicas)} rows "
        f"({'uneven' if GLOBAL_BATCH_SIZE % replicas else 'even'})"
    )
    if last:
        print(
            f"{len(x_train)} = {full} x {GLOBAL_BATCH_SIZE} + a partial last batch "
            f"of {last} rows, split {shards(last, replicas)}"
        )

    with strategy.scope():
        distributed = build_model()
        compile_model(distributed)
    single = build_model()  # plain Keras: no strategy, one device
    single.set_weights(distributed.get_weights())
    compile_model(single)
    initial_diff = max_weight_diff(distributed, single)
    assert initial_diff == 0.0, initial_diff

    print(f"\nMirroredStrategy, {replicas} replica(s):", flush=True)
    distributed_accuracy = train(distributed, "mirrored", data, args.epochs)
    print("\nplain Keras, one device, no strategy:", flush=True)
    single_accuracy = train(single, "single", data, args.epochs)

    diff = max_weight_diff(distributed, single)
    print(f"\nweights sha256 (mirrored): {weights_sha256(distributed)}")
    print(
        f"test accuracy: mirrored {distributed_accuracy:.4f}, "
        f"single device {single_accuracy:.4f}"
    )
    print(
        f"max |weight difference| (all weights, BatchNorm moving statistics "
        f"included): {diff:.3g}"
    )
    if diff <= TOLERANCE:
        print(
            "MATCH: distributed training equals single-device training "
            f"(max weight diff {diff:.3g} <= {TOLERANCE:g})"
        )
        return 0
    print(
        "MISMATCH: distributed training differs from single-device training "
        f"(max weight diff {diff:.3g} > {TOLERANCE:g})"
    )
    return 1


if __name__ == "__main__":
    sys.exit(main())
