"""Worker: the user's random state after creating a strategy.

    mw_random.py OUT_DIR seeded|unseeded [numpy|tfdata]

Seeded: seeds everything (keras.utils.set_random_seed) *before* creating
MultiWorkerMirroredStrategy, then records NumPy / Python draws made
afterwards and trains on shuffled input: with "numpy" (the default) fit's
own shuffle of NumPy arrays; with "tfdata" also a seeded tf.data draw, and
training on a seeded tf.data shuffle (the tensorflow docs'
multi_worker_with_keras shape; needs tensorflow, also on JAX). Run without
TF_CONFIG it is the single-process reference. Unseeded: records the initial
weights right after the scope, to show every worker starts from the same
ones.
"""

import hashlib
import json
import os
import random
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
out_dir, mode = sys.argv[1], sys.argv[2]
tf_data = sys.argv[3:] == ["tfdata"]

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

if mode == "seeded":
    keras.utils.set_random_seed(1234)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.worker_index if os.environ.get("TF_CONFIG") else "single"

result = {
    "numpy": np.random.rand(3).tolist(),
    "python": [random.random() for _ in range(3)],
}
if tf_data:
    import tensorflow as tf

rng = np.random.default_rng(0)
x = rng.normal(size=(60, 8)).astype("float32")
y = (x[:, :1] - 0.5 * x[:, 1:2] > 0).astype("float32")
if tf_data:
    shuffled = tf.data.Dataset.from_tensor_slices(np.arange(60)).shuffle(60, seed=0)
    result["tf_data_order"] = [int(v) for v in shuffled.as_numpy_iterator()]

with strategy.scope():
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
initial = model.get_weights()
if os.environ.get("TF_CONFIG"):  # the adapter's broadcast: every worker gets the chief's
    from keras_dist.backends import get_adapter

    (value,) = get_adapter().values_from_chief([np.full((2,), float(index) + 7.0, "float32")])
    result["from_chief"] = np.asarray(value).tolist()
result["initial_checksum"] = hashlib.sha256(b"".join(w.tobytes() for w in initial)).hexdigest()
if mode == "seeded":
    if tf_data:
        dataset = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(60, seed=0).batch(10)
        model.fit(dataset, epochs=2, verbose=0)
    else:
        model.fit(x, y, batch_size=10, epochs=2, shuffle=True, verbose=0)
    result["weights"] = [w.tolist() for w in model.get_weights()]

path = os.path.join(out_dir, f"random_{index}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(result, handle)
os.replace(path + ".tmp", path)
