"""A worker of a multi-worker test job: trains under
MultiWorkerMirroredStrategy and, on the same data, plain single-device Keras
from the same initial weights; writes the comparison to OUT/worker<i>.json.

argv: OUT_DIR DEVICES_PER_WORKER NUM_SAMPLES BATCH_SIZE [callbacks|callbacks+tensorboard|tfdata] [custom]
With "callbacks", fit also runs Keras' file-writing callbacks on the user's
paths in OUT_DIR/files (and a ScalingReport) with a progress bar, and saves the model there;
"callbacks+tensorboard" adds TensorBoard (it writes with tf.summary: needs
tensorflow, also on JAX). With "tfdata", every worker passes the same
batched tf.data datasets instead of NumPy arrays (each worker reads its
share: auto-shard by data). With "custom", the worker then also runs the
custom training loop of examples/custom_loop_<backend>.py on the same
strategy and under the default strategy (one device) from the same initial
weights, and writes that comparison to OUT/custom_worker<i>.json (one job
checks both, instead of one job each). With "threads", it then trains
400 more steps (timeout_seconds=60, as the multi-worker guide advises)
and writes the process's OS thread count along the way to
OUT/threads<i>.json (tf's per-collective timeout leaked ~4 threads a step).
"""

import json
import os
import sys

out_dir, devices, num_samples, batch_size = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
run_custom_loop = "custom" in sys.argv[5:]
count_threads = "threads" in sys.argv[5:]
mode = [arg for arg in sys.argv[5:] if arg not in ("custom", "threads")]
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(devices)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.worker_index

rng = np.random.default_rng(0)  # the same data on every worker
x = rng.normal(size=(num_samples, 8)).astype("float32")
y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")


def make():  # deliberately unseeded: workers start from different weights
    return keras.Sequential(
        [
            keras.Input((8,)),
            # swish, not relu: the weights start unseeded, and where round-off
            # moves an input across relu's kink the gradient jumps (0 -> 1),
            # past float32 round-off; a smooth activation keeps it round-off.
            keras.layers.Dense(16, activation="swish", kernel_regularizer="l2"),
            keras.layers.BatchNormalization(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


def compile_model(model):
    # SGD with momentum, not Adam: the weights start unseeded (from the chief),
    # and Adam normalises each parameter's step, so on some starting points
    # it turns float32 round-off from the different summation order into
    # differences past 1e-5 (seen once in 20+ runs: 1.25e-5). SGD keeps
    # round-off at round-off, so 1e-5 is a real bound.
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="binary_crossentropy", metrics=["accuracy", keras.metrics.AUC(name="auc")])


with strategy.scope():
    model = make()
    compile_model(model)
model.predict(x[:2], verbose=0)  # first use: weights synced from the chief
initial = model.get_weights()

reference = make()
reference.set_weights(initial)
compile_model(reference)

with_callbacks = mode in (["callbacks"], ["callbacks+tensorboard"])
if mode == ["tfdata"]:
    import tensorflow as tf

    def inputs(*arrays):
        return {"x": tf.data.Dataset.from_tensor_slices(arrays if len(arrays) > 1 else arrays[0]).batch(batch_size)}

else:

    def inputs(*arrays):
        return dict(zip(["x", "y"], arrays), batch_size=batch_size)


callbacks = []
if with_callbacks:
    files = os.path.join(out_dir, "files")
    if strategy.extended.should_checkpoint:
        os.makedirs(files, exist_ok=True)
    callbacks = [
        keras.callbacks.ModelCheckpoint(os.path.join(files, "ckpt.weights.h5"), save_weights_only=True),
        keras.callbacks.CSVLogger(os.path.join(files, "log.csv")),
        keras.callbacks.BackupAndRestore(os.path.join(files, "backup"), delete_checkpoint=False),
    ]
    if mode == ["callbacks+tensorboard"]:
        callbacks.append(keras.callbacks.TensorBoard(os.path.join(files, "logs")))
    callbacks.append(keras_dist.callbacks.ScalingReport(plot_path=os.path.join(files, "scaling.png")))
fit = model.fit(
    **inputs(x, y), epochs=2, shuffle=False, verbose=2 if with_callbacks else 0, callbacks=callbacks
).history
if with_callbacks:
    model.save(os.path.join(out_dir, "files", "model.keras"))
fit_ref = reference.fit(**inputs(x, y), epochs=2, shuffle=False, verbose=0).history
logs = model.evaluate(**inputs(x, y), verbose=0, return_dict=True)
logs_ref = reference.evaluate(**inputs(x, y), verbose=0, return_dict=True)
predicted = model.predict(**inputs(x), verbose=0)
predicted_ref = reference.predict(**inputs(x), verbose=0)

result = {
    "worker": index,
    "num_replicas": strategy.num_replicas_in_sync,
    "should_checkpoint": strategy.extended.should_checkpoint,
    "initial_checksum": float(sum(np.sum(w) for w in initial)),
    "weight_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())),
    "fit": {k: v[-1] for k, v in fit.items()},
    "fit_ref": {k: v[-1] for k, v in fit_ref.items()},
    "evaluate": logs,
    "evaluate_ref": logs_ref,
    "predict_shape": list(predicted.shape),
    "predict_diff": float(np.max(np.abs(predicted - predicted_ref))),
}
if keras.backend.backend() == "jax":  # which program an even batch trains through
    from keras_dist.backends import _gloo
    from keras_dist.backends.jax._step import JaxStep

    step = JaxStep(model, strategy.extended.engine, "train")  # as fit builds it
    even = (x[: strategy.num_replicas_in_sync], y[: strategy.num_replicas_in_sync])
    result["even_batch_per_replica"] = step.program_for(even)[0] is step.replica_program
    result["gloo_event_loops_idle"] = [os.sched_getscheduler(t) == os.SCHED_IDLE for t in _gloo.gloo_event_loop_threads()]


def write(name, result):
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(result, handle)
    os.replace(path + ".tmp", path)
    print(json.dumps(result))


write(f"worker{index}.json", result)

if run_custom_loop:  # the example's custom loop (run/reduce, partial last batch of 37)
    import importlib

    sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples"))
    example = importlib.import_module(f"custom_loop_{keras.config.backend()}")
    data = example.load_data()
    custom_model, history = example.train(strategy, "multi-worker", data, 1)
    single, single_history = example.train(keras_dist.get_strategy(), "single", data, 1)
    write(f"custom_worker{index}.json", {
        "worker": index,
        "num_replicas": strategy.num_replicas_in_sync,
        "weight_diff": example.max_weight_diff(custom_model, single),
        "loss": history[-1],
        "loss_ref": single_history[-1],
    })

if count_threads:  # a long job: the thread count must stay flat

    def os_threads():
        with open("/proc/self/status") as handle:
            return int(next(line for line in handle if line.startswith("Threads:")).split()[1])

    class Count(keras.callbacks.Callback):
        counts = {}

        def on_train_batch_end(self, batch, logs=None):
            if batch in (49, 199, 399):
                self.counts[batch + 1] = os_threads()

    steps = 400  # tf's leak: ~4 threads a step, each living 60 s (+1400 here)
    long_x = np.tile(x[:8], (steps, 1))
    long_y = np.tile(y[:8], (steps, 1))
    with strategy.scope():
        small = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        small.compile(optimizer=keras.optimizers.SGD(0.01), loss="mse")
    small.fit(long_x, long_y, batch_size=8, epochs=1, shuffle=False, verbose=0, callbacks=[Count()])
    write(f"threads{index}.json", {"worker": index, "threads_after_steps": Count.counts})
