"""A worker of the torch backend's multi-process test job (tests/test_torch_backend.py).

Runs, under MultiWorkerMirroredStrategy (one replica per process, gloo),
and then again as plain one-device Keras from the same seed (the chief's
initial values are the seed's: every worker takes them):

- fit / evaluate / predict of an MLP with BatchNormalization and Dropout,
  SGD with clipnorm, 50 rows in global batches of 16 (uneven, a partial
  last batch of 2), evaluate and predict in batches of 7 (a last batch of
  1 row: one replica gets none); built lazily or eagerly (argv);
- a custom loop: experimental_distribute_dataset, strategy.run with
  autograd and optimizer.apply, compute_average_loss, a metric updated
  inside run, strategy.reduce and strategy.gather.

argv: OUT_DIR BUILD(lazy|eager) [HOOKS]. Writes OUT_DIR/worker<i>.json: the
largest differences from one device, the logs of both, and the gathered
rows. With HOOKS (targets of keras_dist._hooks.HOOKS, comma-separated), the
run is repeated with each one reverted alone to Keras' original (the hooks'
liveness probe on torch), under "reverted".
"""

import json
import os
import sys

out_dir, build = sys.argv[1], sys.argv[2]

import numpy as np  # noqa: E402
import keras  # noqa: E402
import torch  # noqa: E402

import keras_dist  # noqa: E402

strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.task_id
rng = np.random.RandomState(0)
x = rng.randn(50, 5).astype("float32")
y = (x @ rng.randn(5, 1) + 0.1).astype("float32")


#: Rows each model call saw, by phase (evaluate and predict: this worker's share).
rows_seen = {"phase": None}


class CountRows(keras.layers.Layer):
    def call(self, inputs):
        phase = rows_seen["phase"]
        if phase is not None:
            rows_seen[phase] = rows_seen.get(phase, 0) + int(inputs.shape[0])
        return inputs


def make_model(seed=7):
    keras.utils.set_random_seed(seed)
    layers = [
        CountRows(),
        keras.layers.Dense(8, activation="relu", kernel_regularizer=keras.regularizers.L2(0.01)),
        keras.layers.BatchNormalization(),
        keras.layers.Dropout(0.25),
        keras.layers.Dense(1),
    ]
    model = keras.Sequential(([keras.Input((5,))] if build == "eager" else []) + layers)
    model.compile(optimizer=keras.optimizers.SGD(0.05, clipnorm=1.0), loss="mse", metrics=["mae"])
    return model


def fit_evaluate_predict(model):
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    rows_seen["phase"] = "evaluate"
    evaluated = model.evaluate(x, y, batch_size=7, verbose=0)
    rows_seen["phase"] = "predict"
    predicted = model.predict(x, batch_size=7, verbose=0)
    rows_seen["phase"] = None
    return history, evaluated, predicted, model.get_weights()


def custom_loop(model, run_strategy):
    """tf's custom-loop recipe on the torch backend: autograd in each replica."""
    optimizer = keras.optimizers.SGD(0.1)
    metric = keras.metrics.Mean()
    global_batch = 12
    dataset = [(x[i : i + global_batch], y[i : i + global_batch]) for i in range(0, 50, global_batch)]
    loss_fn = keras.losses.MeanSquaredError(reduction=None)

    def step(xb, yb):
        predictions = model(xb, training=False)
        per_example = loss_fn(yb, predictions)
        loss = keras_dist.compute_average_loss(per_example, global_batch_size=global_batch)
        model.zero_grad()
        loss.backward()
        variables = model.trainable_weights
        optimizer.apply([v.value.grad for v in variables], variables)
        metric.update_state(per_example.detach())
        return loss.detach()

    losses = []
    gathered = None
    for epoch in range(2):
        for xb, yb in run_strategy.experimental_distribute_dataset(dataset):
            per_replica = run_strategy.run(step, args=(xb, yb))
            losses.append(float(run_strategy.reduce("SUM", per_replica, axis=None)))
        rows = run_strategy.experimental_distribute_dataset([(x[:7],)])
        for (xb,) in rows:
            gathered = run_strategy.gather(run_strategy.run(lambda a: a * 2.0, args=(xb,)), axis=0)
    return losses, float(metric.result()), keras.ops.convert_to_numpy(gathered), model.get_weights()


def probes(run_strategy):
    """What the other torch hooks change: an increment and a decrement inside
    run (aggregation 'sum'), an averaging Loss inside run, a stateful LSTM
    in fit, and a two-output model's per-output losses."""
    out = {}
    with run_strategy.scope():
        counter = keras.Variable(10.0, aggregation="sum")
    data = run_strategy.experimental_distribute_dataset([(x[:6], y[:6])])
    for xb, yb in data:
        run_strategy.run(lambda a: counter.assign_add(keras.ops.sum(a[:, 0]) * 0 + 1.0), args=(xb,))
        run_strategy.run(lambda a: counter.assign_sub(keras.ops.cast(keras.ops.shape(a)[0], "float32")), args=(xb,))
        try:
            run_strategy.run(lambda a, b: keras.losses.MeanSquaredError()(b, a[:, :1]), args=(xb, yb))
            out["averaging_loss_in_run"] = "accepted"
        except ValueError as error:
            out["averaging_loss_in_run"] = f"refused: {str(error)[:40]}"
    out["counter"] = float(keras.ops.convert_to_numpy(counter.value))
    out["gather_plain_rows"] = int(run_strategy.gather(x[:2], axis=0).shape[0])  # not distributed: as it is
    try:
        run_strategy.reduce("SUM", x[:2], axis=None)
        out["sum_plain"] = "summed"
    except ValueError as error:
        out["sum_plain"] = f"refused: {str(error)[:60]}"
    with run_strategy.scope():
        keras.utils.set_random_seed(1)
        rnn = keras.Sequential([keras.Input((3, 2), batch_size=4), keras.layers.LSTM(2, stateful=True)])
        rnn.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    sequences = np.linspace(-1, 1, 24, dtype="float32").reshape(4, 3, 2)
    try:  # (one device: plain Keras 3.15 on torch fails to train a stateful LSTM itself, in autograd)
        rnn.fit(sequences, sequences[:, 0, :], batch_size=4, verbose=0)
        out["stateful_rnn"] = "trained"
    except ValueError as error:  # keras_dist's error, or Keras' own (its batch-size check)
        out["stateful_rnn"] = "refused: " + ("splits the batch" if "splits the batch over" in str(error) else "by Keras")
    except RuntimeError as error:
        out["stateful_rnn"] = f"failed: {str(error)[:40]}"
    with run_strategy.scope():
        keras.utils.set_random_seed(2)
        inputs = keras.Input((5,))
        two = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs), "b": keras.layers.Dense(1, name="b")(inputs)})
        two.compile(optimizer=keras.optimizers.SGD(0.05), loss={"a": "mse", "b": "mae"})
    logs = two.fit(x, {"a": y, "b": -y}, batch_size=16, epochs=1, shuffle=False, verbose=0).history
    out["two_output_logs"] = {key: value[-1] for key, value in sorted(logs.items())}
    return out



def distributed():
    """Everything above under the strategy: the values to compare."""
    with strategy.scope():  # unseeded workers, in effect: each its own seed; the chief's values win
        model = make_model(seed=7 + index)
    history, evaluated, predicted, weights = fit_evaluate_predict(model)
    # Keras 3.16 wraps a model in its own DDP where torch.distributed is up:
    # under keras_dist's step it must not (gradients reduced twice)
    keras_ddp = repr(getattr(model, "ddp_model", "absent (Keras before 3.16)"))
    shares = {phase: rows_seen.pop(phase, 0) for phase in ("evaluate", "predict")}
    with strategy.scope():
        loop_model = make_model()
        loop_model.build((None, 5))
    loop_losses, loop_metric, gathered, loop_weights = custom_loop(loop_model, strategy)
    return {
        "history": history, "evaluated": evaluated, "predicted": predicted, "weights": weights, "shares": shares,
        "loop": (loop_losses, loop_metric, gathered, loop_weights), "probes": probes(strategy), "keras_ddp": keras_ddp,
    }


# one device, the same seed
reference = make_model()
ref_history, ref_evaluated, ref_predicted, ref_weights = fit_evaluate_predict(reference)
rows_seen.pop("evaluate", None), rows_seen.pop("predict", None)
ref_loop_model = make_model()
ref_loop_model.build((None, 5))
ref_losses, ref_metric, ref_gathered, ref_loop_weights = custom_loop(ref_loop_model, keras_dist.get_strategy())
reference_probes = probes(keras_dist.get_strategy())


def largest(a, b):
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b))


def compared(run):
    loop_losses, loop_metric, gathered, loop_weights = run["loop"]
    return {
        "replicas": strategy.num_replicas_in_sync,
        "fit_weights": largest(run["weights"], ref_weights),
        "fit_loss": [run["history"]["loss"], ref_history["loss"]],
        "fit_mae": [run["history"]["mae"], ref_history["mae"]],
        "evaluate": [run["evaluated"], ref_evaluated],
        "predict": largest([run["predicted"]], [ref_predicted]),
        "predict_rows": int(run["predicted"].shape[0]),
        "rows_seen": run["shares"],
        "loop_weights": largest(loop_weights, ref_loop_weights),
        "loop_losses": [loop_losses, ref_losses],
        "loop_metric": [loop_metric, ref_metric],
        "gathered": gathered.tolist(),
        "probes": run["probes"],
        "reference_two_output_logs": reference_probes["two_output_logs"],
        "torch": torch.__version__,
        "keras_ddp": run["keras_ddp"],
    }


result = compared(distributed())
if len(sys.argv) > 3:  # the liveness battery: each hook reverted alone, the same run again
    from keras_dist import _hooks

    result["reverted"] = {}
    for target in sys.argv[3].split(","):
        if target == "keras_dist:install_step_functions":  # not a hook: the per-instance step function makers
            from keras_dist._hooks import _steps as owner

            name, live = "install_step_functions", owner.install_step_functions
            owner.install_step_functions = lambda model: None
        else:
            owner, name = _hooks.resolve(target)
            live = getattr(owner, name)
            setattr(owner, name, _hooks.ORIGINALS[target])
        try:
            result["reverted"][target] = compared(distributed())
        except Exception as error:  # noqa: BLE001 - every worker fails alike: the outcome
            result["reverted"][target] = {"raised": f"{type(error).__name__}: {str(error)[:300]}"}
        finally:
            setattr(owner, name, live)
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"worker{index}.json"), "w") as handle:
    json.dump(result, handle)
