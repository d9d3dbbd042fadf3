"""The coordinator (chief) of a parameter-server test job, started by
`keras-dist launch --workers N --ps M`; writes what it measured to OUT.json.

argv: OUT MODES, MODES being MODE[:STEPS] (STEPS 40 if not given) or
several of them joined by commas: each mode runs in turn on the one
strategy and cluster of the job (so a test module starts one job per
cluster shape, not one per test) and writes its report to OUT.MODE.json as
soon as it ends (a temp file, then a rename). The modes of one job all use
a partitioner (sharded-*) or none do.
MODE:
- "loop": a ClusterCoordinator loop of STEPS scheduled SGD steps (a
  deterministic dataset); reports optimizer.iterations, a per-step counter
  variable, where every variable lives, and (1 worker) the max difference
  from the same steps on one device.
- "fit": model.fit with a DatasetCreator and a plain dataset function,
  validation, evaluate and predict, ModelCheckpoint/BackupAndRestore/
  TensorBoard on the coordinator; reports accuracy next to single-device fit.
- "adam-loop": "loop" with Adam under a learning-rate schedule (both read
  `iterations`) and BatchNormalization (its statistics written by assign).
- "fit-loop-inside": 1-worker fit with steps_per_execution=4 (a loop
  inside each scheduled function) against one device.
- "replay": "loop" with every function scheduled twice under one id (the
  two runs race on the two workers); reports the writes skipped.
- "kill": a loop during which worker 1's server process is killed (found
  by its port) with steps in flight; reports iterations and the counter.
- "bad-inputs": fit's bad inputs, each error, and that nothing changed.
- "ps-dies": a loop during which ps 0 is killed; reports the error and the
  seconds it took.
- "sharded-loop" / "sharded-fit": "loop" / a short fit under
  `FixedShardsPartitioner(2)`: variables split over the ps tasks; reports
  where each shard lives, the weights' shapes, and (sharded-loop, 1
  worker) the difference from one device and a save/load round trip into
  an unsharded model.
"""

import json
import os
import signal
import sys
import time

OUT = sys.argv[1]
JOBS = [(part.split(":")[0], int(part.split(":")[1]) if ":" in part else 40) for part in sys.argv[2].split(",")]
if len({name.startswith("sharded") for name, _ in JOBS}) != 1:
    sys.exit(f"ps_job: modes with and without a partitioner in one job: {sys.argv[2]}")
mode = JOBS[0][0]  # the mode running now (make_model and make_optimizer read it)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np  # noqa: E402
import keras  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_dist  # noqa: E402

BATCH = 8
rng = np.random.default_rng(0)
X = rng.normal(size=(256, 8)).astype("float32")
Y = (X[:, :1] + 0.5 * X[:, 1:2] - 0.25 * X[:, 2:3] > 0).astype("float32")


def dataset_fn(input_context=None):
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH).repeat()


def make_model():
    keras.utils.set_random_seed(1)
    if mode == "adam-loop":  # BatchNorm's statistics are written with assign
        return keras.Sequential([
            keras.Input((8,)), keras.layers.Dense(16, use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.Activation("tanh"), keras.layers.Dense(1, activation="sigmoid"),
        ])
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")])


def make_optimizer():
    if mode == "adam-loop":  # bias correction and the schedule read iterations
        return keras.optimizers.Adam(keras.optimizers.schedules.ExponentialDecay(0.02, 10, 0.5))
    return keras.optimizers.SGD(0.05)


partitioner = keras_dist.experimental.partitioners.FixedShardsPartitioner(2) if mode.startswith("sharded") else None
strategy = keras_dist.ParameterServerStrategy(
    keras_dist.cluster_resolver.TFConfigClusterResolver(), variable_partitioner=partitioner
)
REPR = repr(strategy)


def placement(variable):
    """The device of a variable's value, or its shards' devices (a list)."""
    shards = getattr(variable.value, "variables", None)  # tf's ShardedVariable
    return [shard.device for shard in shards] if shards is not None else variable.value.device


def scheduled_training():
    """The coordinator, a model, its optimizer (built in the scope), a
    per-step counter, a per-worker iterator and the scheduled training step
    of the loop modes."""
    coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        model = make_model()
        optimizer = make_optimizer()
        optimizer.build(model.trainable_variables)
        counter = keras.Variable(0.0, name="counter", trainable=False)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function
    def step(iterator):
        def replica(batch):
            x, y = batch
            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.losses.binary_crossentropy(y, model(x, training=True)))
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply(grads, model.trainable_variables)
            counter.assign_add(1.0)
            return loss

        return strategy.run(replica, args=(next(iterator),))

    return coordinator, model, optimizer, counter, iterator, step


def custom_loop(n):
    coordinator, model, optimizer, counter, iterator, step = scheduled_training()
    report["devices"] = {v.path: placement(v) for v in [*model.variables, *optimizer.variables, counter]}
    start = time.monotonic()
    gates = coordinator._engine._keras_dist_gates
    skipped_before = gates.skipped_writes  # earlier modes of this job ran on these gates too
    if mode == "replay":
        # every function scheduled twice under one id: the two runs race on
        # the two workers, as a re-run races a dead worker's late writes
        # (ids above any an earlier mode of this job used; replay runs last)
        base = int(gates.next_id().numpy()) + 1
        ids = iter([base + i // 2 for i in range(2 * n)])
        gates.next_id = lambda: tf.constant(next(ids), tf.int64)
        n = 2 * n
    try:
        results = [coordinator.schedule(step, args=(iterator,)) for _ in range(n)]
        coordinator.join()
    finally:
        gates.__dict__.pop("next_id", None)  # the class's own again, for the modes after this one
    report["skipped_writes"] = gates.skipped_writes - skipped_before
    report["claimed_after_join"] = gates.claimed()
    report["seconds"] = time.monotonic() - start
    report["done"] = coordinator.done()
    report["losses"] = [float(r.fetch()) for r in results[-3:]]
    report["iterations"] = int(optimizer.iterations.numpy())
    report["counter"] = float(counter.numpy())
    return model


def single_device_accuracy(epochs, steps):
    """Accuracy of the same model fit with Adam on one device (the band an
    asynchronous run must land in)."""
    reference = make_model()
    reference.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["accuracy"])
    reference.fit(dataset_fn(), epochs=epochs, steps_per_epoch=steps, verbose=0)
    return reference.evaluate(X, Y, verbose=0, return_dict=True)["accuracy"]


def single_device_weights(n):
    model = make_model()
    optimizer = make_optimizer()
    batches = iter(dataset_fn())
    for _ in range(n):
        x, y = next(batches)
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.binary_crossentropy(y, model(x, training=True)))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply(grads, model.trainable_variables)
    return [np.asarray(w) for w in model.get_weights()]


for mode, steps in JOBS:
    out = f"{OUT}.{mode}.json"
    report = {"repr": REPR}
    if mode in ("loop", "adam-loop", "replay"):
        model = custom_loop(steps)
        if strategy.extended.num_remote_workers == 1:
            reference = single_device_weights(steps)
            report["max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference))
    elif mode == "fit":
        files = out + ".files"
        os.makedirs(files, exist_ok=True)
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["accuracy"])
        callbacks = [
            keras.callbacks.ModelCheckpoint(os.path.join(files, "ckpt.weights.h5"), save_weights_only=True),
            keras.callbacks.BackupAndRestore(os.path.join(files, "backup")),
            keras.callbacks.TensorBoard(os.path.join(files, "tb")),
        ]
        history = model.fit(
            keras_dist.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=steps,
            validation_data=(X, Y), callbacks=callbacks, verbose=0,
        )
        report["history"] = {k: [float(v) for v in vs] for k, vs in history.history.items()}
        history2 = model.fit(dataset_fn, epochs=4, initial_epoch=3, steps_per_epoch=steps, verbose=0)
        report["history_plain_callable"] = {k: [float(v) for v in vs] for k, vs in history2.history.items()}
        report["iterations"] = int(model.optimizer.iterations.numpy())
        report["evaluate"] = model.evaluate(X, Y, batch_size=32, verbose=0, return_dict=True)
        report["predict_shape"] = list(model.predict(X, batch_size=32, verbose=0).shape)
        report["files"] = sorted(os.listdir(files))
        report["single_device_accuracy"] = single_device_accuracy(epochs=4, steps=steps)
    elif mode == "fit-loop-inside":
        # steps_per_execution 4: each scheduled function runs 4 train steps in a
        # tf.while_loop, its writes numbered per run (not per traced op)
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy", steps_per_execution=4)
        model.fit(dataset_fn, epochs=1, steps_per_epoch=steps, verbose=0)
        report["iterations"] = int(model.optimizer.iterations.numpy())
        reference = make_model()
        reference.compile(optimizer=keras.optimizers.SGD(0.05), loss="binary_crossentropy")
        reference.fit(dataset_fn(), epochs=1, steps_per_epoch=steps, verbose=0)
        report["max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights()))
    elif mode == "sharded-loop":
        model = custom_loop(steps)
        report["shapes"] = [list(w.shape) for w in model.get_weights()]
        report["trainable_shapes"] = [list(v.shape) for v in model.trainable_variables]
        report["listed_shapes"] = {
            name: [list(v.shape) for v in getattr(model, name)]
            for name in ("weights", "trainable_weights", "non_trainable_weights")
        }
        if strategy.extended.num_remote_workers == 1:
            reference = single_device_weights(steps)
            report["max_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference))
            path = out + ".weights.h5"
            model.save_weights(path)
            plain = make_model()
            plain.load_weights(path)
            report["reloaded_diff"] = max(float(np.max(np.abs(a - b))) for a, b in zip(plain.get_weights(), model.get_weights()))
    elif mode == "sharded-fit":
        with strategy.scope():
            model = make_model()
            model.compile(optimizer=keras.optimizers.Adam(0.02), loss="binary_crossentropy", metrics=["accuracy"])
        report["devices"] = {v.path: placement(v) for v in model.variables}
        model.fit(keras_dist.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=steps, verbose=0)
        report["iterations"] = int(model.optimizer.iterations.numpy())
        report["evaluate"] = model.evaluate(X, Y, batch_size=32, verbose=0, return_dict=True)
        report["single_device_accuracy"] = single_device_accuracy(epochs=3, steps=steps)
    elif mode == "bad-inputs":
        with strategy.scope():
            model = make_model()
            model.compile(optimizer="sgd", loss="binary_crossentropy")
        outside = make_model()  # outside the scope
        outside.compile(optimizer="sgd", loss="binary_crossentropy")
        outside_metric = keras.metrics.BinaryAccuracy()

        def _in_scope(call):
            with strategy.scope():
                return call()

        before = [np.asarray(w) for w in model.get_weights()]
        errors = {}
        cases = {
            "missing steps_per_epoch": lambda: model.fit(dataset_fn, epochs=1),
            "a list, not a function": lambda: model.fit([(X[:8], Y[:8])], steps_per_epoch=2),
            "arrays, not a function": lambda: model.fit(X, Y, steps_per_epoch=2),
            "batch_size with a function": lambda: model.fit(dataset_fn, steps_per_epoch=2, batch_size=8),
            "train_on_batch": lambda: model.train_on_batch(X[:8], Y[:8]),
            "model made outside the scope": lambda: _in_scope(lambda: outside.fit(dataset_fn, steps_per_epoch=2)),
            "model made outside every scope": lambda: outside.fit(
                keras_dist.experimental.DatasetCreator(dataset_fn), steps_per_epoch=2
            ),
            "a function returning arrays": lambda: model.fit(
                keras_dist.experimental.DatasetCreator(lambda context: (X, Y)), steps_per_epoch=2
            ),
            "metric made outside the scope": lambda: model.compile(
                optimizer="sgd", loss="binary_crossentropy", metrics=[outside_metric]
            ),
            "jit_compile function": lambda: keras_dist.coordinator.ClusterCoordinator(strategy).schedule(
                tf.function(lambda: model.optimizer.iterations.assign_add(1), jit_compile=True)
            ),
        }
        if hasattr(keras.callbacks, "OrbaxCheckpoint"):  # Keras >= 3.13
            sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/, for _helpers
            from _helpers import orbax_checkpoint as make_orbax_checkpoint

            orbax_checkpoint = make_orbax_checkpoint(f"{OUT}.orbax")
            cases["OrbaxCheckpoint"] = lambda: model.fit(dataset_fn, steps_per_epoch=2, callbacks=[orbax_checkpoint])
        for name, call in cases.items():
            try:
                call()
                errors[name] = None
            except Exception as error:  # noqa: BLE001 - reported
                errors[name] = f"{type(error).__name__}: {error}"
        report["errors"] = errors
        # compile adopted the metric made outside the scope, as it adopts an unused optimizer
        report["metric_adopted"] = all(strategy.extended.variable_created_in_scope(v) for v in outside_metric.variables)
        report["unchanged"] = all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
        report["iterations"] = int(model.optimizer.iterations.numpy())
        report["built_optimizer"] = model.optimizer.built
    elif mode in ("kill", "ps-dies"):
        target = "worker" if mode == "kill" else "ps"
        coordinator, model, optimizer, counter, iterator, step = scheduled_training()  # SGD(0.05), no BatchNorm
        address = strategy.cluster_resolver.cluster_spec().task_address(target, 1 if target == "worker" else 0)
        port = address.rsplit(":", 1)[1]
        start = time.monotonic()
        try:
            for i in range(steps):
                coordinator.schedule(step, args=(iterator,))
                if i == steps // 3:  # steps are in flight on both workers
                    # the server listening on the task's port: find its pid
                    import subprocess

                    pid = subprocess.run(["fuser", f"{port}/tcp"], capture_output=True, text=True).stdout.split()
                    pid = [int(p) for p in pid if p.strip().isdigit() and int(p) != os.getpid()]
                    report["killed"] = pid
                    for p in pid:
                        os.kill(p, signal.SIGKILL)
                    killed_at = time.monotonic()
            coordinator.join()
            report["iterations"] = int(optimizer.iterations.numpy())
            report["counter"] = float(counter.numpy())
            report["skipped_writes"] = coordinator._engine._keras_dist_gates.skipped_writes
        except Exception as error:  # noqa: BLE001 - reported
            report["error"] = f"{type(error).__name__}: {error}"[:2000]
            report["error_seconds"] = time.monotonic() - killed_at
    with open(out + ".tmp", "w") as f:
        json.dump(report, f)
    os.replace(out + ".tmp", out)
