"""Bad input: one clear error, raised before any state changes."""

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import FEATURES, compile_model, make_data, mlp


def _snapshot(model):
    weights = [w.copy() for w in model.get_weights()]
    optimizer = getattr(model, "optimizer", None)
    steps = int(optimizer.iterations.numpy()) if optimizer is not None else None
    return weights, steps


def _assert_unchanged(model, snapshot):
    weights, steps = _snapshot(model)
    for before, after in zip(snapshot[0], weights):
        np.testing.assert_array_equal(before, after)
    assert steps == snapshot[1]


@pytest.fixture
def data():
    return make_data(40)


def _distributed_model(strategy):
    with strategy.scope():
        return compile_model(mlp(), "sgd")


def test_variables_created_outside_the_scope(mirrored, data):
    x, y = data
    outside = keras.layers.Dense(4)
    outside.build((None, FEATURES))
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), outside, keras.layers.Dense(1, activation="sigmoid")]
        )
        model.compile(optimizer="sgd", loss="binary_crossentropy")
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=r"created outside the scope.*strategy.scope\(\)"):
        model.fit(x, y, batch_size=10, verbose=0)
    _assert_unchanged(model, snapshot)


def test_optimizer_created_outside_the_scope(mirrored):
    optimizer = keras.optimizers.Adam()
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
        with pytest.raises(ValueError, match=r"Optimizer variable .* outside"):
            model.compile(optimizer=optimizer, loss="mse")
    assert not getattr(model, "compiled", False)


def test_metric_created_outside_the_scope(mirrored):
    auc = keras.metrics.AUC()
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
    with pytest.raises(ValueError, match=r"Metric variable .* outside"):
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy", auc])
    assert not getattr(model, "compiled", False)


def test_model_trained_under_another_strategys_scope(mirrored, data):
    x, y = data
    model = _distributed_model(mirrored(2))
    snapshot = _snapshot(model)
    other = mirrored(4)
    with other.scope():
        with pytest.raises(ValueError, match="created under MirroredStrategy"):
            model.fit(x, y, batch_size=10, verbose=0)
        with pytest.raises(ValueError, match="created under"):
            model.predict(x, verbose=0)
    _assert_unchanged(model, snapshot)


def test_plain_model_used_under_a_scope(mirrored, data):
    x, y = data
    model = compile_model(mlp(), "sgd")
    snapshot = _snapshot(model)
    with mirrored(2).scope():
        with pytest.raises(ValueError, match="created outside any strategy scope"):
            model.fit(x, y, batch_size=10, verbose=0)
    _assert_unchanged(model, snapshot)


def test_nested_scope_of_a_different_strategy(mirrored):
    first, second = mirrored(2), mirrored(4)
    with first.scope():
        with pytest.raises(ValueError, match="inside the scope of"):
            with second.scope():
                pass
        assert keras_dist.get_strategy() is first  # first scope intact
        with first.scope():  # re-entering the same strategy is fine
            assert keras_dist.get_strategy() is first
    assert not keras_dist.has_strategy()


@pytest.mark.parametrize(
    "devices, pattern",
    [
        (["cpu:9"], r"not visible.*Visible devices: \['cpu:0'"),
        (["gpu:0"], "not visible"),
        (["cpu:0", "cpu:0"], "Duplicate"),
        ([], "empty"),
        (["not a device"], "Cannot parse device name"),
    ],
)
def test_bad_devices(devices, pattern):
    with pytest.raises(ValueError, match=pattern):
        keras_dist.MirroredStrategy(devices)


def test_bad_one_device():
    with pytest.raises(ValueError, match="not visible"):
        keras_dist.OneDeviceStrategy("/gpu:3")
    with pytest.raises(TypeError, match="one device name"):
        keras_dist.OneDeviceStrategy(["cpu:0"])


@pytest.mark.parametrize(
    "call",
    [
        lambda m, x, y: m.fit(x, y, batch_size=0, verbose=0),
        lambda m, x, y: m.fit(x, y, batch_size=-4, verbose=0),
        lambda m, x, y: m.fit(x, y, batch_size=2.5, verbose=0),
        lambda m, x, y: m.fit(x, y, batch_size=8, validation_batch_size=0, validation_data=(x, y), verbose=0),
        lambda m, x, y: m.evaluate(x, y, batch_size=0, verbose=0),
        lambda m, x, y: m.predict(x, batch_size=-1, verbose=0),
    ],
    ids=["fit-0", "fit-negative", "fit-float", "validation-0", "evaluate-0", "predict-negative"],
)
def test_non_positive_batch_size(mirrored, data, call):
    x, y = data
    model = _distributed_model(mirrored(4))
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match="must be a positive integer"):
        call(model, x, y)
    _assert_unchanged(model, snapshot)


def test_steps_per_execution_must_be_positive(mirrored):
    with mirrored(2).scope():
        model = mlp()
        for bad in (0, -1, 1.5, "2"):
            with pytest.raises(ValueError, match="steps_per_execution must be a positive integer"):
                model.compile(optimizer="sgd", loss="mse", steps_per_execution=bad)
    assert not getattr(model, "compiled", False)


@pytest.mark.parametrize("method", ["reduce", "gather"])
def test_reduce_and_gather_axis_out_of_range(mirrored, method):
    strategy = mirrored(2)
    x = np.ones((4, 3), "float32")
    for batch in strategy.experimental_distribute_dataset([x]):
        per_replica = strategy.run(lambda v: v * 2.0, args=(batch,))
        call = (lambda axis: strategy.reduce("SUM", per_replica, axis=axis)) if method == "reduce" else (
            lambda axis: strategy.gather(per_replica, axis=axis))
        with pytest.raises(ValueError, match=rf"strategy.{method}: axis=2 is out of range .*rank 2"):
            call(2)
        with pytest.raises(ValueError, match="out of range"):
            call(-3)
        with pytest.raises(TypeError, match="axis must be an integer"):
            call("0")
        assert np.asarray(call(0)).shape[0] in (3, 4)  # still works


def test_backup_to_a_directory_that_cannot_be_written(mirrored, data, tmp_path):
    x, y = data
    model = _distributed_model(mirrored(2))
    snapshot = _snapshot(model)
    blocker = tmp_path / "a_file"
    blocker.write_text("not a directory")
    backup = keras.callbacks.BackupAndRestore(str(blocker / "backup"))
    with pytest.raises(ValueError, match=r"BackupAndRestore cannot write its backup to .*backup_dir="):
        model.fit(x, y, batch_size=10, verbose=0, callbacks=[backup])
    _assert_unchanged(model, snapshot)


@pytest.mark.parametrize(
    "cluster, task, pattern",
    [
        ({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, None, r"task is not set.*\"task\": \{\"type\": \"worker\""),
        ({"worker": ["127.0.0.1:2222", "127.0.0.1:2222"]}, ("worker", 0), r"Tasks worker:0 and worker:1 have the same address"),
        ({"worker": ["127.0.0.1:2222", "127.0.0.1:70000"]}, ("worker", 0), r"port is not a number in 1..65535"),
        ({"worker": ["127.0.0.1:2222", "127.0.0.1:2223"]}, ("worker", 5), r"task worker:5, which is not a worker"),
    ],
    ids=["no_task", "same_address", "port_out_of_range", "unknown_task"],
)
def test_bad_cluster_descriptions_fail_before_joining(cluster, task, pattern):
    """Checked before any process joins (no hang, no engine stack dump)."""
    from keras_dist.cluster_resolver import SimpleClusterResolver

    resolver = SimpleClusterResolver(cluster, task_type=task and task[0], task_id=task and task[1])
    with pytest.raises(ValueError, match=pattern):
        keras_dist.MultiWorkerMirroredStrategy(resolver)
