"""A worker of the "first hour" job (tests/test_first_hour.py): what a new
user's first multi-worker program gets wrong, each answered before any
state changes, on one 2-worker job of any backend.

- a one-process strategy (Mirrored, OneDevice) made in a worker of the job;
- `strategy.gather` of uneven shards along axis 0 (exact) and axis 1 (one
  clear error on every worker; the job's collectives still work after it);
- `save_weights` and `save` called by every worker on one path, three
  times: only the chief writes, the file loads whole in plain Keras;
- `fit` with fewer rows, or other `epochs`, on one worker: one clear error
  on every worker, and no weight changed;
- a different model on one worker: one clear error on every worker.

argv: OUT_DIR. Writes OUT_DIR/worker<i>.json.
"""

import json
import os
import sys

out_dir = sys.argv[1]

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.extended.worker_index
report = {"replicas": strategy.num_replicas_in_sync}


def outcome(fn):
    try:
        fn()
        return ["ok"]
    except Exception as error:  # noqa: BLE001 - the error is the outcome
        return ["raised", type(error).__name__, str(error)]


def barrier():
    """Every worker reaches this point before any goes on (a gather)."""
    strategy.gather(strategy.run(lambda: keras.ops.ones((1,))), axis=0)


def numpy(value):
    return np.asarray(keras.ops.convert_to_numpy(value))


# A one-process strategy in a worker of the job.
report["mirrored"] = outcome(lambda: keras_dist.MirroredStrategy())
report["one_device"] = outcome(lambda: keras_dist.OneDeviceStrategy("cpu:0"))

# gather of uneven shards (7 rows over the replicas).
x = np.arange(42, dtype="float32").reshape(7, 6)
(xb,) = next(iter(strategy.experimental_distribute_dataset([(x,)])))
doubled = strategy.run(lambda a: a * 2.0, args=(xb,))
report["gather_axis0"] = numpy(strategy.gather(doubled, axis=0)).tolist()
report["gather_axis1"] = outcome(lambda: strategy.gather(doubled, axis=1))
report["gather_after_error"] = numpy(strategy.gather(doubled, axis=0)).tolist()

# Every worker saves to one path.
rng = np.random.RandomState(0)
features = rng.randn(64, 5).astype("float32")
targets = (features @ rng.randn(5, 1)).astype("float32")


def make(units=8):
    keras.utils.set_random_seed(1)
    model = keras.Sequential([
        keras.Input((5,)), keras.layers.Dense(units), keras.layers.BatchNormalization(), keras.layers.Dense(1)
    ])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


with strategy.scope():
    model = make()
model.fit(features, targets, batch_size=16, epochs=1, shuffle=False, verbose=0)
weights_path = os.path.join(out_dir, "shared.weights.h5")
for _ in range(3):
    model.save_weights(weights_path)
    model.save(os.path.join(out_dir, "shared.keras"))
barrier()  # the chief's files are in place
plain = make()
plain.load_weights(weights_path)
report["save_weights_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(plain.get_weights(), model.get_weights()))
loaded = keras.saving.load_model(os.path.join(out_dir, "shared.keras"), compile=False)
report["save_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(loaded.get_weights(), model.get_weights()))
barrier()  # every worker has read them
report["files"] = sorted(name for name in os.listdir(out_dir) if not name.startswith("worker"))

# fit with other input or arguments on one worker.
before = model.get_weights()
rows = 64 if index == 0 else 48
report["rows_differ"] = outcome(lambda: model.fit(features[:rows], targets[:rows], batch_size=16, epochs=1,
                                                  shuffle=False, verbose=0))
report["epochs_differ"] = outcome(lambda: model.fit(features, targets, batch_size=16, epochs=1 + index,
                                                    shuffle=False, verbose=0))
report["unchanged"] = max(float(np.max(np.abs(a - b))) for a, b in zip(before, model.get_weights()))
report["same_call_trains"] = outcome(lambda: model.fit(features, targets, batch_size=16, epochs=1, shuffle=False,
                                                       verbose=0))

# torch: several batches per call under processes is one clear error on every worker.
if keras.config.backend() == "torch":
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", steps_per_execution=2)
    before = model.get_weights()
    report["steps_per_execution"] = outcome(lambda: model.fit(features, targets, batch_size=16, epochs=1,
                                                              shuffle=False, verbose=0))
    report["steps_per_execution_unchanged"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(before, model.get_weights()))

# keras.callbacks.OrbaxCheckpoint (Keras >= 3.13): every worker would write
# its own checkpoint into one directory; one clear error before any step.
if hasattr(keras.callbacks, "OrbaxCheckpoint"):
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/, for _helpers
    from _helpers import orbax_checkpoint as make_orbax_checkpoint

    orbax_dir = os.path.join(out_dir, "orbax")
    orbax_checkpoint = make_orbax_checkpoint(orbax_dir)
    before = model.get_weights()
    report["orbax"] = outcome(lambda: model.fit(features, targets, batch_size=16, epochs=1, shuffle=False, verbose=0,
                                                callbacks=[orbax_checkpoint]))
    report["orbax_unchanged"] = max(float(np.max(np.abs(a - b))) for a, b in zip(before, model.get_weights()))
    report["orbax_wrote"] = sorted(os.listdir(orbax_dir)) if os.path.isdir(orbax_dir) else []

# A different model on one worker.
with strategy.scope():
    report["architecture"] = outcome(lambda: make(8 if index == 0 else 6))

with open(os.path.join(out_dir, f"worker{index}.json.tmp"), "w") as handle:
    json.dump(report, handle)
os.replace(os.path.join(out_dir, f"worker{index}.json.tmp"), os.path.join(out_dir, f"worker{index}.json"))
