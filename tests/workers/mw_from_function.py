"""Worker: `distribute_datasets_from_function` in a 2-worker job (2
devices each): the tf-docs `dataset_fn` idiom (shard by input pipeline,
then batch to the per-replica size) over `tf.data.Dataset.range(22)` with
a global batch of 8, so each worker holds 11 rows and the last step is
partial (6 rows). Records the rows each local replica gets per step and
the job's sum of a `run` over each step.

    mw_from_function.py OUT_DIR
"""

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(2)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
GLOBAL = 8
contexts = []


def dataset_fn(context):
    contexts.append([context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync])
    dataset = tf.data.Dataset.range(22).shard(context.num_input_pipelines, context.input_pipeline_id)
    return dataset.batch(context.get_per_replica_batch_size(GLOBAL))


distributed = strategy.distribute_datasets_from_function(dataset_fn)
rows, sums, counts = [], [], set()
for _ in range(2):  # two passes: the second must give the same
    steps = []
    for batch in distributed:
        parts = strategy.experimental_local_results(batch)  # this worker's 2 replicas' parts
        counts.add(len(parts))
        steps.append([np.asarray(part).tolist() for part in parts])
        total = strategy.run(lambda x: keras.ops.sum(keras.ops.cast(x, "float32")), args=(batch,))
        sums.append(float(keras.ops.convert_to_numpy(strategy.reduce("SUM", total, axis=None))))
    rows.append(steps)
# fit refuses it, with the fix, before training
with strategy.scope():
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
try:
    model.fit(strategy.distribute_datasets_from_function(dataset_fn), epochs=1, verbose=0)
    fit_error = None
except NotImplementedError as error:
    fit_error = str(error)
fit_iterations = int(keras.ops.convert_to_numpy(model.optimizer.iterations))

report = {
    "fit_error": fit_error,
    "fit_iterations": fit_iterations,
    "contexts": contexts,
    "rows": rows,
    "sums": sums,
    "replicas": strategy.num_replicas_in_sync,
    "local_results": sorted(counts),
}
path = os.path.join(sys.argv[1], f"worker{strategy.cluster_resolver.worker_index}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(report, handle)
os.replace(path + ".tmp", path)
