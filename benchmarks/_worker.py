"""Times one benchmark configuration in this process; prints one JSON line.

Usage: python benchmarks/_worker.py BACKEND IMPL DEVICES MODEL STEPS REPEATS
IMPL: keras (plain, one device) | one_device (keras_dist.OneDeviceStrategy)
      | mirrored (keras_dist.MirroredStrategy) | data_parallel (Keras'
      keras.distribution.DataParallel, JAX) | tf_mirrored (tf.distribute +
      Keras 3, TensorFlow).
"""

import json
import os
import sys
import time

backend, impl, devices, model_name, steps, repeats = sys.argv[1:7]
devices, steps, repeats = int(devices), int(steps), int(repeats)
os.environ["KERAS_BACKEND"] = backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(max(devices, 1))

MODELS = {
    # name: (builder, global batch size, input maker)
    "mlp": 256,
    "cnn": 128,
    "text": 256,
}


def build(name):
    keras.utils.set_random_seed(0)
    if name == "mlp":
        return keras.Sequential(
            [
                keras.Input((784,)),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(512, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
    if name == "cnn":
        return keras.Sequential(
            [
                keras.Input((28, 28, 1)),
                keras.layers.Conv2D(16, 3, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.MaxPooling2D(),
                keras.layers.Conv2D(32, 3, activation="relu"),
                keras.layers.BatchNormalization(),
                keras.layers.GlobalAveragePooling2D(),
                keras.layers.Dense(10),
            ]
        )
    return keras.Sequential(
        [
            keras.Input((64,), dtype="int32"),
            keras.layers.Embedding(5000, 64),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(64, activation="relu"),
            keras.layers.Dense(10),
        ]
    )


def data(name, rows):
    rng = np.random.default_rng(0)
    y = rng.integers(0, 10, size=rows)
    if name == "mlp":
        x = rng.random((rows, 784), dtype=np.float32)
    elif name == "cnn":
        x = rng.random((rows, 28, 28, 1), dtype=np.float32)
    else:
        x = rng.integers(0, 5000, size=(rows, 64)).astype("int32")
    return x, y


#: "cpu" (simulated CPU devices) or "gpu" (`benchmarks/run.py --device-kind gpu`:
#: every implementation, the plain-Keras anchor included, on the GPUs).
DEVICE_KIND = os.environ.get("KERAS_DIST_BENCH_DEVICE_KIND", "cpu")


def strategy_scope():
    names = [f"{DEVICE_KIND}:{i}" for i in range(devices)]
    if impl == "keras":
        return None
    if impl == "one_device":
        return keras_dist.OneDeviceStrategy(names[0]).scope()
    if impl == "mirrored":
        return keras_dist.MirroredStrategy(names).scope()
    if impl == "data_parallel":
        distribution = keras.distribution.DataParallel(devices=names)
        return distribution.scope()
    if impl == "tf_mirrored":
        import tensorflow as tf

        return tf.distribute.MirroredStrategy([f"/{DEVICE_KIND}:{i}" for i in range(devices)]).scope()
    raise SystemExit(f"unknown implementation {impl}")


def main():
    batch = MODELS[model_name]
    x, y = data(model_name, batch * steps)
    scope = strategy_scope()
    if scope is not None:
        scope.__enter__()
    model = build(model_name)
    model.compile(
        optimizer="adam",
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        metrics=["accuracy"],
    )
    start = time.perf_counter()
    model.fit(x[:batch], y[:batch], batch_size=batch, epochs=1, verbose=0, shuffle=False)
    first_step = time.perf_counter() - start  # includes compilation
    epoch_times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.fit(x, y, batch_size=batch, epochs=1, verbose=0, shuffle=False)
        epoch_times.append(time.perf_counter() - start)
    if scope is not None:
        scope.__exit__(None, None, None)
    step_times = sorted(t / steps for t in epoch_times)
    print(
        json.dumps(
            {
                "backend": backend,
                "impl": impl,
                "devices": devices,
                "model": model_name,
                "device_kind": DEVICE_KIND,
                "batch": batch,
                "steps": steps,
                "first_step_s": first_step,
                "step_s_median": step_times[len(step_times) // 2],
                "step_s_all": step_times,
            }
        )
    )


main()
