"""One worker of the weak-scaling benchmark; prints one JSON line (chief).

Usage: python benchmarks/_weak_worker.py BACKEND PER_WORKER_BATCH STEPS REPEATS
The cluster comes from TF_CONFIG (none: a one-worker job). Each worker has
one simulated device; the global batch is PER_WORKER_BATCH x workers.
"""

import json
import os
import statistics
import sys
import time

backend, per_worker, steps, repeats = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
os.environ["KERAS_BACKEND"] = backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(1)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=120)
)
workers = strategy.cluster_resolver.num_workers
global_batch = per_worker * workers

rng = np.random.default_rng(0)  # the same data on every worker
x = rng.normal(size=(global_batch * steps, 784)).astype("float32")
y = rng.integers(0, 10, size=(global_batch * steps,))

with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [
            keras.Input((784,)),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(512, activation="relu"),
            keras.layers.Dense(10),
        ]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))


class Timer(keras.callbacks.Callback):
    def __init__(self):
        self.epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.start = time.perf_counter()

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append(time.perf_counter() - self.start)


timer = Timer()
# epoch 0 compiles (warm-up); each further epoch is one timed measurement
model.fit(x, y, batch_size=global_batch, epochs=repeats + 1, shuffle=False, verbose=0, callbacks=[timer])
seconds = statistics.median(timer.epochs[1:])
idle = None  # JAX: whether gloo's event loops were moved to SCHED_IDLE (one core each)
if backend == "jax" and workers > 1:
    from keras_dist.backends.jax import _gloo

    idle = [os.sched_getscheduler(t) == os.SCHED_IDLE for t in _gloo.gloo_event_loop_threads()]
if strategy.extended.should_checkpoint:
    print(json.dumps({
        "gloo_event_loops_idle": idle,
        "backend": backend,
        "workers": workers,
        "per_worker_batch": per_worker,
        "steps": steps,
        "epoch_seconds": seconds,
        "samples_per_second": global_batch * steps / seconds,
    }), flush=True)
