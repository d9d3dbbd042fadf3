"""A worker of a two-worker job in which one worker is stopped (SIGSTOP:
alive and silent), killed (SIGKILL) or raises an uncaught exception
(RAISE) at a chosen phase; the test checks that the survivor ends within
the collective timeout with a clear error (RAISE: that the job ends at
once, whatever the timeout).

Phases:
  join     - before MultiWorkerMirroredStrategy() joins the job (the peer
             never arrives)
  compile  - while the first training step is traced and compiled
  step     - inside a training step, while it executes on the device
  checkpoint - while the chief writes a BackupAndRestore backup
  predict  - in the middle of the final `predict` (whose outputs are
             gathered from every worker)
RAISE only:
  startup  - right after the strategy joined the job
  fit      - inside a training step (a host callback raises)
  evaluate - in the middle of `evaluate` after `fit`
  callback - in a Keras callback's `on_epoch_end`
  exit     - at the end of the script, after everything ran

Every worker writes its pid to OUT/pid<i>; the dying one writes the time
of its death to OUT/death_time just before the signal.

argv: OUT_DIR PHASE HOW(STOP|KILL|RAISE) DYING_WORKER TIMEOUT_SECONDS
"""

import json
import os
import signal
import sys
import time

out_dir, phase, how, dying, timeout = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), float(sys.argv[5])
PHASES = {
    "STOP": ("join", "compile", "step", "checkpoint", "predict"),
    "RAISE": ("startup", "fit", "evaluate", "callback", "exit"),
}
assert phase in PHASES.get(how, PHASES["STOP"]), (how, phase)
index = json.loads(os.environ["TF_CONFIG"])["task"]["index"]
attempt = int(os.environ.get("KERAS_DIST_RESTART", "0"))
doomed = index == dying and attempt == 0
with open(os.path.join(out_dir, f"pid{index}"), "w") as handle:
    handle.write(str(os.getpid()))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")


def die(where):
    if not doomed:
        return
    with open(os.path.join(out_dir, "death_time"), "w") as handle:
        handle.write(repr(time.time()))
    if how == "RAISE":
        raise RuntimeError(f"planted failure at {where} in worker {index}")
    print(f"worker {index}: SIG{how} at {where}", flush=True)
    os.kill(os.getpid(), getattr(signal, "SIG" + how))


import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(1)
if phase == "join":
    die("join")
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=timeout)
)
if phase == "startup":
    die("startup")


def host_callback(fn):
    """Runs `fn` on the host while the compiled step executes."""
    if keras.config.backend() == "jax":
        import jax

        def call(x):
            jax.debug.callback(fn)
            return x

        return call
    import tensorflow as tf

    def call(x):
        token = tf.numpy_function(lambda: np.float32(fn() or 0.0), [], tf.float32, stateful=True)
        return x + 0.0 * tf.ensure_shape(token, [])

    return call


class Phase(keras.layers.Layer):
    """Identity; dies while traced (compile) or executed (step)."""

    def __init__(self):
        super().__init__()
        self.calls = 0
        self.on_device = host_callback(self._executed)

    def _executed(self):
        self.calls += 1
        if phase in ("step", "fit") and self.calls == 4:
            die(phase)

    def call(self, x, training=None):
        if phase == "compile" and training:
            die("compile")
        if phase in ("step", "fit") and training:
            return self.on_device(x)
        return x


class Checkpoint(keras.callbacks.Callback):
    def on_predict_batch_end(self, batch, logs=None):
        if phase == "predict" and batch == 1:
            die("predict")

    def on_test_batch_end(self, batch, logs=None):
        if phase == "evaluate" and batch == 1:
            die("evaluate")

    def on_epoch_end(self, epoch, logs=None):
        if phase == "callback" and epoch == 0:
            die("callback")


rng = np.random.default_rng(0)
x = rng.normal(size=(96, 8)).astype("float32")
y = (x[:, :1] - x[:, 2:3] > 0).astype("float32")
with strategy.scope():
    keras.utils.set_random_seed(7)
    model = keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), Phase(), keras.layers.Dense(1, activation="sigmoid")]
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy")

if phase == "checkpoint":
    original_save = keras.Model.save_weights

    def save_weights(self, filepath, *args, **kwargs):
        result = original_save(self, filepath, *args, **kwargs)
        die("checkpoint")  # the backup is on disk; the rename is not done
        return result

    keras.Model.save_weights = save_weights

callbacks = [keras.callbacks.BackupAndRestore(os.path.join(out_dir, "backup")), Checkpoint()]
model.fit(x, y, batch_size=16, epochs=3, shuffle=False, verbose=0, callbacks=callbacks)
if phase == "evaluate":
    model.evaluate(x, y, batch_size=16, verbose=0, callbacks=[Checkpoint()])
model.predict(x, batch_size=16, verbose=0, callbacks=[Checkpoint()])
print(f"worker {index}: done", flush=True)
if phase == "exit":
    die("exit")
