"""Worker: tensorflow.org `tutorials/distribute/multi_worker_with_keras`'s
`main.py` (its `mnist_setup.py` is mnist_setup.py here), as written but for
these changes:

- renamed: `tf.distribute` -> `keras_dist`, `tf.keras` -> `keras`;
- in mnist_setup.py, MNIST is `tests/_helpers.py::mnist_like` (no downloads);
- at the end, a report for the test: `OUT_DIR/worker<i>.json` with the
  loss per epoch, `optimizer.iterations` and a hash of the weights.

    TF_CONFIG=... mw_tutorial.py OUT_DIR

TF_CONFIG is the tutorial's: a `worker` list, no `chief`, no coordinator
address (on JAX keras_dist's coordinator then listens on worker 0's port).
"""

import hashlib
import json
import os
import sys

import numpy as np
import keras

import keras_dist
import mnist_setup


per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])

strategy = keras_dist.MultiWorkerMirroredStrategy()

global_batch_size = per_worker_batch_size * num_workers
multi_worker_dataset = mnist_setup.mnist_dataset(global_batch_size)

with strategy.scope():
    # Model building/compiling need to be within `strategy.scope()`.
    multi_worker_model = mnist_setup.build_and_compile_cnn_model()


history = multi_worker_model.fit(multi_worker_dataset, epochs=3, steps_per_epoch=70)

# ---- the test's report
weights = multi_worker_model.get_weights()
report = {
    "backend": keras.backend.backend(),
    "num_replicas_in_sync": strategy.num_replicas_in_sync,
    "task": [strategy.cluster_resolver.task_type, strategy.cluster_resolver.task_id],
    "loss": history.history["loss"],
    "accuracy": history.history["accuracy"],
    "iterations": int(keras.ops.convert_to_numpy(multi_worker_model.optimizer.iterations)),
    "weights_sha256": hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest(),
}
path = os.path.join(sys.argv[1], f"worker{tf_config['task']['index']}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(report, handle)
os.replace(path + ".tmp", path)
