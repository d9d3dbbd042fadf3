"""A worker of a kill-and-resume job, run by `keras-dist launch
--max-restarts 1`: trains 3 epochs under MultiWorkerMirroredStrategy with
Keras' BackupAndRestore. In the first attempt, worker 1 (or DYING_WORKER) SIGKILLs itself in
the middle of epoch 2; the launcher relaunches the job, which resumes from
the chief's last backup. Then each worker trains the same model on one
device without interruption and writes the comparison to OUT/worker<i>.json.

argv: OUT_DIR DEVICES_PER_WORKER [TIMEOUT_SECONDS, default 60] [DYING_WORKER, default 1]
      [SIGNAL, default KILL; TERM asks it to stop]
"""

import json
import os
import signal
import sys
import time

out_dir, devices = sys.argv[1], int(sys.argv[2])
timeout = float(sys.argv[3]) if len(sys.argv) > 3 else 60
dying = int(sys.argv[4]) if len(sys.argv) > 4 else 1
death = getattr(signal, "SIG" + (sys.argv[5] if len(sys.argv) > 5 else "KILL"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(devices)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=timeout)
)
index = strategy.cluster_resolver.worker_index
attempt = int(os.environ.get("KERAS_DIST_RESTART", "0"))
EPOCHS, BATCH = 3, 10

rng = np.random.default_rng(0)
x = rng.normal(size=(123, 8)).astype("float32")
y = (x[:, :1] - x[:, 2:3] > 0).astype("float32")


def make():
    keras.utils.set_random_seed(7)  # the same initial weights in every attempt
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    return model


class KillMidEpoch(keras.callbacks.Callback):
    def on_train_batch_end(self, batch, logs=None):
        if attempt == 0 and index == dying and self.epoch == 1 and batch == 5:
            with open(os.path.join(out_dir, "death_time"), "w") as handle:
                handle.write(repr(time.time()))
            os.kill(os.getpid(), death)

    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch


class RecordEpochs(keras.callbacks.Callback):
    epochs = []

    def on_epoch_begin(self, epoch, logs=None):
        self.epochs.append(epoch)


with strategy.scope():
    model = make()
backup = keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup"))
model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0, callbacks=[backup, KillMidEpoch(), RecordEpochs()])

reference = make()
reference.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, verbose=0)
result = {
    "worker": index,
    "attempt": attempt,
    "epochs_run": RecordEpochs.epochs,
    "weight_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())),
}
path = os.path.join(out_dir, f"worker{index}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(result, handle)
os.replace(path + ".tmp", path)
print(json.dumps(result))
