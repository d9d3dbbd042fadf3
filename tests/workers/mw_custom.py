"""A worker of a multi-worker test job: runs the custom training loop of
examples/custom_loop_<backend>.py under MultiWorkerMirroredStrategy and under
the default strategy (one device) from the same initial weights, and writes
the comparison to OUT/worker<i>.json.

argv: OUT_DIR DEVICES_PER_WORKER
"""

import importlib
import json
import os
import sys

out_dir, devices = sys.argv[1], int(sys.argv[2])
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(devices)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
example = importlib.import_module(f"custom_loop_{keras.config.backend()}")
data = example.load_data()
model, history = example.train(strategy, "multi-worker", data, 1)
single, single_history = example.train(keras_dist.get_strategy(), "single", data, 1)

index = strategy.cluster_resolver.worker_index
result = {
    "worker": index,
    "num_replicas": strategy.num_replicas_in_sync,
    "weight_diff": example.max_weight_diff(model, single),
    "loss": history[-1],
    "loss_ref": single_history[-1],
}
path = os.path.join(out_dir, f"worker{index}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(result, handle)
os.replace(path + ".tmp", path)
print(json.dumps(result))
