"""A worker of the torch backend's shuffled-input job: `fit(shuffle=True)`
of NumPy arrays under MultiWorkerMirroredStrategy.

argv: OUT_DIR MODE. MODE "unseeded": no seed anywhere (the workers draw from
the chief's random state, taken when they joined); "seeded_apart": each
worker seeds itself differently after the strategy (its shuffles differ:
the step must refuse the mixed batch). Writes OUT_DIR/worker<i>.json.
"""

import json
import os
import sys

out_dir, mode = sys.argv[1], sys.argv[2]

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.task_id
if mode == "seeded_apart":
    keras.utils.set_random_seed(10 + index)
x = np.arange(60 * 3, dtype="float32").reshape(60, 3) / 100
y = x.sum(axis=1, keepdims=True)
with strategy.scope():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
history = model.fit(x, y, batch_size=8, epochs=2, shuffle=True, verbose=0).history
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"worker{index}.json"), "w") as handle:
    json.dump({"loss": history["loss"], "weights": [w.tolist() for w in model.get_weights()]}, handle)
