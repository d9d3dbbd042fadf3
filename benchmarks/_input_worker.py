"""One worker of the per-worker-input benchmark; prints one JSON line (chief).

Usage: python benchmarks/_input_worker.py BACKEND GLOBAL_BATCH STEPS REPEATS DATA_DIR
Two workers (TF_CONFIG), one simulated device each. The same MLP trains on
the CSV files in DATA_DIR with each multi-worker tf.data policy (DATA: every
worker reads every global batch and keeps its rows; FILE: each reads its
own files, a step's rows all-gathered; OFF: each reads every file), then
with plain Keras on one device (no strategy), all in this process.
"""

import glob
import json
import os
import statistics
import sys
import time

backend, global_batch, steps, repeats, data_dir = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
os.environ["KERAS_BACKEND"] = backend
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(1)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=120)
)
FILES = sorted(glob.glob(os.path.join(data_dir, "part-*.csv")))
FEATURES = 64


def parse(line):
    fields = tf.io.decode_csv(line, [0.0] * (FEATURES + 1))
    return tf.stack(fields[:FEATURES]), tf.cast(fields[FEATURES], tf.int32)


def dataset(policy):
    lines = tf.data.Dataset.from_tensor_slices(FILES).interleave(tf.data.TextLineDataset, cycle_length=1)
    data = lines.map(parse).batch(global_batch).take(steps).cache()
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return data.with_options(options)


def make_model():
    keras.utils.set_random_seed(0)
    model = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(256, activation="relu"), keras.layers.Dense(10)]
    )
    model.compile(optimizer="adam", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model


class Timer(keras.callbacks.Callback):
    def __init__(self):
        self.epochs, self.steps = [], 0

    def on_epoch_begin(self, epoch, logs=None):
        self.start, self.steps = time.perf_counter(), 0

    def on_train_batch_end(self, batch, logs=None):
        self.steps += 1

    def on_epoch_end(self, epoch, logs=None):
        self.epochs.append((time.perf_counter() - self.start) / max(self.steps, 1))


def time_fit(model, data):
    timer = Timer()
    model.fit(data, epochs=1 + repeats, verbose=0, callbacks=[timer])  # epoch 1 compiles
    return statistics.median(timer.epochs[1:]), timer.steps


result = {"backend": backend, "global_batch": global_batch, "workers": strategy.cluster_resolver.num_workers}
for policy in ("DATA", "FILE", "OFF"):
    with strategy.scope():
        model = make_model()
    step_s, count = time_fit(model, dataset(policy))
    result[policy] = {"step_s": step_s, "steps_per_epoch": count}
step_s, count = time_fit(make_model(), dataset("DATA"))  # plain Keras, one device, no strategy
result["plain_keras"] = {"step_s": step_s, "steps_per_epoch": count}
print(json.dumps(result), flush=True)
