"""Multi-worker training on the digits dataset, checked against one device.

Run two workers on this machine (on JAX and TensorFlow each worker
simulates 2 CPU devices, so 4 replicas in all; on torch a replica is a
process, so 2), on any backend:

    keras-dist launch -n 2 --backend jax examples/multi_worker.py
    keras-dist launch -n 2 --backend tensorflow examples/multi_worker.py
    keras-dist launch -n 2 --backend torch examples/multi_worker.py

With ``--seed N`` every run trains bit-identical weights (the chief prints
their sha256). With ``--backup-dir DIR`` the distributed run keeps a BackupAndRestore
backup there: relaunched after a crash (``keras-dist launch --max-restarts
2 ...``), it resumes from the last finished epoch.

Every worker trains the same CNN under MultiWorkerMirroredStrategy on the
same global batches (50 rows, not a multiple of the 4 replicas, and a
partial last batch), then plain Keras on one device from the same initial
weights. The chief prints the metrics and MATCH / MISMATCH.
"""

import argparse
import hashlib
import os
import sys

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
from sklearn.datasets import load_digits  # noqa: E402

import keras_dist  # noqa: E402


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument(
        "--devices", type=int, default=1 if keras.config.backend() == "torch" else 2,
        help="simulated CPU devices per worker (torch: 1, its replicas are processes)",
    )
    parser.add_argument("--backup-dir", help="BackupAndRestore directory (shared by the workers)")
    parser.add_argument("--seed", type=int, help="seed everything first (keras.utils.set_random_seed)")
    args = parser.parse_args(argv)
    if args.seed is not None:  # then every run trains bit-identical weights
        keras.utils.set_random_seed(args.seed)

    keras_dist.simulate_cpu_devices(args.devices)
    strategy = keras_dist.MultiWorkerMirroredStrategy(
        communication_options=keras_dist.CommunicationOptions(timeout_seconds=120)
    )
    chief = strategy.extended.should_checkpoint

    digits = load_digits()
    x = (digits.images[:1437, :, :, None] / 16.0).astype("float32")
    y = digits.target[:1437]

    def make():
        return keras.Sequential(
            [
                keras.Input((8, 8, 1)),
                # No bias before BatchNorm: its true gradient is zero, and Adam
                # would turn float32 round-off in it into learning-rate-sized
                # steps in either run (an ill-conditioned comparison).
                keras.layers.Conv2D(16, 3, use_bias=False),
                keras.layers.BatchNormalization(momentum=0.9),
                # A smooth activation, not ReLU: right after BatchNorm many
                # inputs sit near 0, and when round-off moves one across
                # ReLU's kink its gradient jumps from 0 to 1. Measured over 80
                # starting points, one such flip put a run 1.1e-5 off one
                # device (and 3.5e-3 once in CI); with swish, at most 4.2e-7.
                keras.layers.Activation("swish"),
                keras.layers.Flatten(),
                keras.layers.Dense(10),
            ]
        )

    def compile_model(model):
        model.compile(
            # SGD with momentum: Adam normalises each parameter's step, so on
            # some (unseeded) starting weights it turns float32 round-off in
            # near-zero gradients into visible differences (measured on TF:
            # 3.2e-4 once); SGD keeps round-off at round-off.
            optimizer=keras.optimizers.SGD(0.05, momentum=0.9),
            loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            metrics=["accuracy"],
        )

    with strategy.scope():
        model = make()
        compile_model(model)
    model.predict(x[:1], verbose=0)  # first use: weights agree with the chief's
    single = make()
    single.set_weights(model.get_weights())
    compile_model(single)

    callbacks = [keras.callbacks.BackupAndRestore(args.backup_dir)] if args.backup_dir else []
    history = model.fit(
        x, y, batch_size=50, epochs=args.epochs, shuffle=False, verbose=0, callbacks=callbacks
    ).history
    single.fit(x, y, batch_size=50, epochs=args.epochs, shuffle=False, verbose=0)
    diff = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), single.get_weights()))
    if chief:
        print(f"{strategy.cluster_resolver.num_workers} workers, {strategy.num_replicas_in_sync} replicas in sync")
        for epoch in range(args.epochs):
            print(f"epoch {epoch + 1}: loss {history['loss'][epoch]:.4f} accuracy {history['accuracy'][epoch]:.4f}")
        # 1e-5: float32 round-off from summing the batch in a different
        # order, after 29 SGD steps per epoch; with no bias before BatchNorm
        # and no Adam, round-off stays round-off.
        weights = hashlib.sha256(b"".join(w.tobytes() for w in model.get_weights())).hexdigest()[:16]
        print(f"weights sha256: {weights}")
        verdict = "MATCH" if diff <= 1e-5 else "MISMATCH"
        print(f"{verdict}: multi-worker training vs one device, max weight diff {diff:.2e}")
    return 0 if diff <= 1e-5 else 1


if __name__ == "__main__":
    sys.exit(main())
