"""A worker of a multi-worker test job whose tf.data input asks for
AutoShardPolicy FILE, OFF or HINT: each worker reads its own stream and a
step's global batch is every worker's rows that step.

It trains with `fit` (validation included) and evaluates under
MultiWorkerMirroredStrategy, and trains plain single-device Keras on the
same global batches (every worker's stream, rebuilt here for each worker,
concatenated step by step) from the same initial weights; runs a custom
loop over `experimental_distribute_dataset`; on TensorFlow also reads tf's
own distributed dataset (the oracle) for this worker's rows per step.
Writes OUT/worker<i>.<POLICY>.json. Several policies run in turn on one
strategy (one job start for all of them).

argv: OUT_DIR DEVICES_PER_WORKER POLICY[,POLICY...] (FILE, OFF, HINT)
The CSV files OUT/data/part-*.csv are written by the test beforehand.
"""

import glob
import json
import os
import sys

out_dir, devices, policies = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_dist  # noqa: E402
from keras_dist import _tf_data  # noqa: E402

keras_dist.simulate_cpu_devices(devices)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
extended = strategy.extended
index, num_workers, num_replicas = extended.worker_index, extended.num_workers, strategy.num_replicas_in_sync
GLOBAL_BATCH = 16
FILES = sorted(glob.glob(os.path.join(out_dir, "data", "part-*.csv")))


def parse(line):
    fields = tf.io.decode_csv(line, [0.0] * 5)
    return tf.stack(fields[:4]), tf.reshape(fields[4], [1])


def make_dataset(policy):
    files = tf.data.Dataset.from_tensor_slices(FILES)
    if policy == "HINT":  # the user's mark: shard the files here
        files = files.shard(tf.data.experimental.SHARD_HINT, tf.data.experimental.SHARD_HINT)
    lines = files.interleave(tf.data.TextLineDataset, cycle_length=1)
    dataset = lines.map(parse).batch(GLOBAL_BATCH)
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = getattr(tf.data.experimental.AutoShardPolicy, policy)
    return dataset.with_options(options)


def streams(policy):
    """Every worker's stream, as each worker reads it."""
    return [
        [tuple(np.asarray(part) for part in batch) for batch in _tf_data.worker_dataset(make_dataset(policy), num_workers, w, num_replicas)]
        for w in range(num_workers)
    ]


def global_batches(policy):
    every = streams(policy)
    batches = []
    for step in range(max(len(s) for s in every)):
        parts = [s[step] for s in every if step < len(s)]
        batches.append(tuple(np.concatenate(p) for p in zip(*parts)))
    return every, batches


def make():
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((4,)), keras.layers.Dense(8, activation="swish"), keras.layers.BatchNormalization(), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.9), loss="binary_crossentropy", metrics=["accuracy"])
    return model


for policy in policies:
    with strategy.scope():
        model = make()
    reference = make()
    reference.set_weights(model.get_weights())

    every, batches = global_batches(policy)
    result = {
        "worker": index,
        "num_replicas": num_replicas,
        "stream_steps": [len(s) for s in every],
        "global_rows": [len(b[0]) for b in batches],
    }

    # the oracle: tf's own per-worker input, read by tf's distributed dataset
    if keras.backend.backend() == "tensorflow":
        engine = extended.engine
        tf_rows = []
        # tf.distribute.Strategy's own method (the engine's keeps Keras' input global)
        for element in tf.distribute.Strategy.experimental_distribute_dataset(engine, make_dataset(policy)):
            labels = engine.experimental_local_results(element[1])
            rows = np.concatenate([np.asarray(v) for v in labels])
            if len(rows):
                tf_rows.append(rows.ravel().tolist())
        ours = [b[1].ravel().tolist() for b in every[index]]
        result["tf_stream_equal"] = tf_rows == ours

    history = model.fit(make_dataset(policy), validation_data=make_dataset(policy), epochs=2, verbose=0).history
    for _ in range(2):
        for x, y in batches:
            reference.train_on_batch(x, y)
    result["weight_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights()))
    union_x = np.concatenate([b[0] for b in batches])
    union_y = np.concatenate([b[1] for b in batches])
    result["evaluate"] = model.evaluate(make_dataset(policy), verbose=0, return_dict=True)
    result["evaluate_ref"] = reference.evaluate(union_x, union_y, batch_size=GLOBAL_BATCH, verbose=0, return_dict=True)
    result["val_accuracy"] = history["val_accuracy"][-1]
    result["epochs"] = len(history["loss"])

    # a custom loop: the labels' sum of each step, over every worker's rows
    sums = []
    for x, y in strategy.experimental_distribute_dataset(make_dataset(policy)):
        total = strategy.reduce("SUM", strategy.run(lambda a, b: keras.ops.sum(b), args=(x, y)), axis=None)
        sums.append(float(total))
    result["custom_sums"] = sums
    result["custom_sums_ref"] = [float(np.sum(b[1])) for b in batches]

    path = os.path.join(out_dir, f"worker{index}.{policy}.json")
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)
    print(policy, json.dumps(result))
