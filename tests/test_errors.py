"""Bad input: one clear error, raised before any state changes."""

import re

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import FEATURES, compile_model, make_data, mlp
from conftest import BACKEND


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
        # compile refuses it, as tf.keras 2's did, before compiling anything
        with pytest.raises(ValueError, match=r"not created in the distribution strategy scope.*created outside the scope.*strategy.scope\(\)"):
            model.compile(optimizer="sgd", loss="binary_crossentropy")
    assert not model.compiled and getattr(model, "optimizer", None) is None
    # a layer built outside, added after compile: fit refuses it
    with strategy.scope():
        model = keras.Sequential([keras.Input((FEATURES,))])
        model.compile(optimizer="sgd", loss="binary_crossentropy")
    model.add(outside)
    model.add(keras.layers.Dense(1, activation="sigmoid"))
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=r"created outside the scope.*strategy.scope\(\)"):
        model.fit(x, y, batch_size=10, verbose=0)
    _assert_unchanged(model, snapshot)


class _ConfigLacksFoo(keras.optimizers.SGD):
    """A custom optimizer whose get_config() leaves out its `foo`."""

    def __init__(self, learning_rate=0.1, foo=3, **kwargs):
        super().__init__(learning_rate, **kwargs)
        self.foo = foo


def _applied_once():
    optimizer = keras.optimizers.Adam(0.01)
    variable = keras.Variable(np.zeros((2,), "float32"))
    optimizer.apply_gradients([(np.ones((2,), "float32"), variable)])
    return optimizer


def _iterations_set():
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.iterations.assign(5)  # e.g. restored from a checkpoint
    return optimizer


def _extra_variable():
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.add_variable((2,), name="extra")
    return optimizer


@pytest.mark.parametrize(
    "make, reason",
    [
        (_applied_once, r"it has been built \(its slot variables exist\)"),
        (_iterations_set, r"its iterations counter is 5, not 0 \(it has been applied, or restored\)"),
        (_extra_variable, r"it holds variables its constructor does not make \(sgd\w*/extra\)"),
        (lambda: _ConfigLacksFoo(0.1, foo=5), r"its get_config\(\) does not give back its 'foo' \(5; re-made: 3\)"),
    ],
    ids=["applied", "iterations", "extra_variable", "incomplete_config"],
)
def test_used_optimizer_created_outside_the_scope(mirrored, data, make, reason):
    """An unused optimizer made outside the scope is adopted (tests/test_equivalence.py);
    one past its initial state is refused, saying why, before anything
    changes: neither it nor the model; the model then trains with one made
    in the scope."""
    x, y = data
    optimizer = make()
    before = [(v, np.array(v.numpy())) for v in optimizer.variables]
    state = dict(vars(optimizer))
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
    weights = model.get_weights()
    with pytest.raises(ValueError, match=rf"^Optimizer variable .* was created outside the scope of .*cannot be adopted by it: {reason}.*with strategy\.scope\(\)"):
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
    assert not getattr(model, "compiled", False)
    assert [v for v, _ in before] == optimizer.variables and dict(vars(optimizer)).keys() == state.keys()
    assert all(vars(optimizer)[name] is value for name, value in state.items())
    for variable, value in before:
        np.testing.assert_array_equal(variable.numpy(), value)
        assert not strategy.extended.variable_created_in_scope(variable)
    for a, b in zip(weights, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    with strategy.scope():
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    model.fit(x, y, batch_size=10, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 4
    assert any(not np.array_equal(a, b) for a, b in zip(weights, model.get_weights()))


@pytest.mark.parametrize("devices", [["cpu:1"], ["cpu:0", "cpu:1"]], ids=["one-replica", "two-replicas"])
def test_metric_created_outside_the_scope_is_adopted(devices):
    """A metric made outside the scope and given to compile is adopted, as
    an unused optimizer is (plain Keras 3 with tf.distribute takes it): the
    same object, its variables the strategy's, its totals kept, and it
    reports what a metric made in the scope reports."""
    x, y = make_data(24)
    y = (y > 0).astype("float32")
    auc = keras.metrics.AUC(name="auc")
    auc.update_state([0.0, 1.0], [0.2, 0.9])  # a used metric: its totals are carried over
    totals = [keras.ops.convert_to_numpy(v).copy() for v in auc.variables]
    strategy = keras_dist.MirroredStrategy(devices)
    results = []
    for metric in (auc, None):
        with strategy.scope():
            model = mlp()
            made_inside = keras.metrics.AUC(name="auc") if metric is None else None
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy", metric or made_inside])
        if metric is not None:
            assert all(strategy.extended.variable_created_in_scope(v) for v in auc.variables)
            for value, total in zip(auc.variables, totals):
                np.testing.assert_array_equal(keras.ops.convert_to_numpy(value), total)
        results.append(model.evaluate(x, y, batch_size=5, verbose=0, return_dict=True))
    assert results[0] == pytest.approx(results[1], abs=1e-6)
    assert model.compiled


class _Threshold(keras.metrics.Mean):
    """A metric whose get_config leaves out a constructor argument."""

    def __init__(self, threshold=0.5, **kwargs):
        super().__init__(**kwargs)
        self.threshold = threshold


def test_a_metric_made_outside_that_cannot_be_remade_is_refused(mirrored):
    """Refused by compile, in tf.keras 2's words too (which ported tests
    match), when a copy made from its config would differ; nothing changed."""
    metric = _Threshold(threshold=0.9)
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
    with pytest.raises(ValueError, match=r"Metric variable .* outside.*'threshold'.*All metrics must be created in the same distribution strategy scope"):
        model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=[metric])
    assert not getattr(model, "compiled", False)
    assert metric.threshold == 0.9 and not strategy.extended.variable_created_in_scope(metric.variables[0])


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


@pytest.mark.parametrize("damage", ["metadata-json", "metadata-epoch", "truncated-weights"])
def test_a_damaged_backup_is_refused_before_anything_loads(mirrored, data, tmp_path, damage):
    """A BackupAndRestore directory whose training_metadata.json is not JSON
    (or has no epoch number), or whose weights file was cut short: one
    clear error naming the file and the fix, before any weight changes
    (Keras raised JSONDecodeError after loading the weights, or h5py's
    OSError naming no path)."""
    x, y = data
    backup_dir = tmp_path / "backup"
    trained = _distributed_model(mirrored(2))
    trained.fit(x, y, batch_size=10, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False)])
    metadata, weights = backup_dir / "training_metadata.json", backup_dir / "latest.weights.h5"
    assert metadata.exists() and weights.exists()
    if damage == "metadata-json":
        metadata.write_text('{"epoch": ')
        damaged = metadata
    elif damage == "metadata-epoch":
        metadata.write_text('{"epoch": "one"}')
        damaged = metadata
    else:
        weights.write_bytes(weights.read_bytes()[:100])
        damaged = weights
    model = _distributed_model(mirrored(2))
    model.build((None, FEATURES))
    snapshot = _snapshot(model)
    with pytest.raises(ValueError, match=rf"cannot resume from '{re.escape(str(damaged))}'.*Delete the backup directory"):
        model.fit(x, y, batch_size=10, verbose=0, callbacks=[keras.callbacks.BackupAndRestore(str(backup_dir))])
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


@pytest.mark.needs_tensorflow
def test_unbatched_tf_data_dataset(mirrored, data):
    """A tf.data dataset of single examples (no `.batch`) is refused, by its
    element spec, before anything runs; the error names the fix."""
    tf = pytest.importorskip("tensorflow")
    x, y = data
    strategy = mirrored(2)
    model = _distributed_model(strategy)
    snapshot = _snapshot(model)
    examples = {
        "scalar labels": tf.data.Dataset.from_tensor_slices((x, y[:, 0])),
        "two leading sizes": tf.data.Dataset.from_tensor_slices((x, y)),
        "inputs only": tf.data.Dataset.from_tensor_slices(x),  # rank 1 < the model's 2
    }
    fix = r"not batched: .*dataset\.batch\(global_batch_size\)"
    for name, dataset in examples.items():
        for call in (model.fit, model.evaluate, model.predict):
            if name == "inputs only" and call is not model.predict:
                continue
            with pytest.raises(ValueError, match=f"{call.__name__} got a tf.data dataset that is " + fix):
                call(dataset, verbose=0)
    with pytest.raises(ValueError, match="fit's validation_data got .*" + fix):
        model.fit(x, y, batch_size=10, validation_data=examples["scalar labels"], verbose=0)
    for name in ("scalar labels", "two leading sizes"):
        with pytest.raises(ValueError, match="experimental_distribute_dataset got .*" + fix):
            strategy.experimental_distribute_dataset(examples[name])
    _assert_unchanged(model, snapshot)
    # Batched datasets pass, drop_remainder (static sizes) included.
    model.fit(tf.data.Dataset.from_tensor_slices((x, y)).batch(10, drop_remainder=True), verbose=0)
    assert len(list(strategy.experimental_distribute_dataset(examples["inputs only"].batch(8)))) == 5


@pytest.mark.parametrize("kind", ["arrays", pytest.param("tf.data", marks=pytest.mark.needs_tensorflow)])
def test_empty_input_to_fit_and_evaluate(mirrored, data, kind):
    """An input with no batch never ends in a bare StopIteration. TensorFlow
    does what plain Keras does there: no step, the same results; on JAX,
    where plain Keras stops with a bare StopIteration, one clear error."""
    x, y = data

    def empty():
        if kind == "arrays":
            return {"x": x[:0], "y": y[:0]}
        tf = pytest.importorskip("tensorflow")
        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(10).filter(lambda a, b: False)}

    model = _distributed_model(mirrored(2))
    snapshot = _snapshot(model)
    if BACKEND == "jax":
        for call in (model.fit, model.evaluate):
            with pytest.raises(ValueError, match=rf"{call.__name__} got no batch: the input is empty.*at least one batch"):
                call(**empty(), verbose=0)
    else:
        plain = compile_model(mlp(), "sgd")
        with pytest.warns(UserWarning, match="ran out of data"):
            history = model.fit(**empty(), verbose=0).history
        assert history == plain.fit(**empty(), verbose=0).history == {}
        assert model.evaluate(**empty(), verbose=0) == plain.evaluate(**empty(), verbose=0)
    _assert_unchanged(model, snapshot)


def test_an_empty_dataset_ends_a_custom_loop(mirrored):
    """As in tf.distribute: iterating an empty distributed dataset ends the
    `for` loop; batches with no arrays pass through as they are."""
    strategy = mirrored(2)
    steps = [batch for batch in strategy.experimental_distribute_dataset([])]
    assert steps == []
    with pytest.raises(StopIteration):  # plain Python, for an explicit next()
        next(iter(strategy.experimental_distribute_dataset([])))
    assert list(strategy.experimental_distribute_dataset([(), {}])) == [(), {}]
    from_function = strategy.distribute_datasets_from_function(lambda context: [])
    assert list(from_function) == []


_CROSS_REPLICA_STRATEGIES = {
    "one_device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-1": lambda: keras_dist.MirroredStrategy(["cpu:0"]),
    "mirrored-2": lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1"]),
    "central_storage-2": lambda: keras_dist.CentralStorageStrategy(["cpu:0", "cpu:1"]),
}


@pytest.mark.parametrize("build", ["lazy", "eager"])
@pytest.mark.parametrize("kind", sorted(_CROSS_REPLICA_STRATEGIES))
def test_apply_gradients_in_cross_replica_context(kind, build):
    """Inside the scope but outside strategy.run, apply_gradients is refused
    (as tf.keras 2 refused it, under OneDeviceStrategy too), naming
    strategy.run, before the optimizer builds or any variable changes;
    outside the scope an unbuilt one applies (plain Keras)."""
    strategy = _CROSS_REPLICA_STRATEGIES[kind]()
    with strategy.scope():
        model = mlp()
        # eager: built in the scope, with slots; lazy: no slots (TensorFlow
        # cannot make a slot of a distributed variable outside the scope)
        optimizer = keras.optimizers.SGD(0.1, momentum=0.9 if build == "eager" else 0.0, name="sgd")
        if build == "eager":
            optimizer.build(model.trainable_variables)
    variables = model.trainable_variables
    gradients = [np.ones(v.shape, "float32") for v in variables]
    weights = model.get_weights()
    slots = [keras.ops.convert_to_numpy(v) for v in optimizer.variables]
    per_replica = strategy.run(lambda: [keras.ops.ones(v.shape) for v in variables])
    fix = r"`apply_gradients\(\)` of 'sgd' cannot be called in cross-replica context.*Use `strategy.run`"
    with strategy.scope():
        for grads in (gradients, per_replica):
            with pytest.raises(RuntimeError, match=fix):
                optimizer.apply_gradients(zip(grads, variables))
        with pytest.raises(RuntimeError, match=fix):
            optimizer.apply(gradients, variables)
    assert optimizer.built == (build == "eager") and int(optimizer.iterations.numpy()) == 0
    for before, after in zip(weights + slots, model.get_weights() + [keras.ops.convert_to_numpy(v) for v in optimizer.variables]):
        np.testing.assert_array_equal(before, after)
    if build == "lazy":
        optimizer.apply_gradients(zip(gradients, variables))  # outside any scope
        assert int(optimizer.iterations.numpy()) == 1


DEVICES = [f"cpu:{i}" for i in range(4)]


@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: keras_dist.OneDeviceStrategy("cpu:0"),
        lambda: keras_dist.MirroredStrategy(DEVICES[:2]),
        lambda: keras_dist.MirroredStrategy(DEVICES),
        lambda: keras_dist.CentralStorageStrategy(DEVICES),
    ],
    ids=["one-device", "mirrored-2", "mirrored-4", "central-storage-4"],
)
def test_a_batch_whose_arrays_differ_in_rows_is_refused(make_strategy):
    """x[:10] with y[:9] used to be split 3,3,2,2 and 3,2,2,2 on 4 replicas:
    replica 1 paired x's rows 3-5 with y's rows 3-4. One clear error when the
    batch is reached, before any replica sees it; good batches before it are
    given out as usual."""
    strategy = make_strategy()
    x = np.arange(20, dtype="float32").reshape(10, 2)
    y = np.arange(10, dtype="float32")
    dataset = strategy.experimental_distribute_dataset([(x, y), (x, y[:9])])
    iterator = iter(dataset)
    first = next(iterator)
    rows = [len(np.asarray(part)) for part in strategy.experimental_local_results(first[1])]
    assert sum(rows) == 10
    with pytest.raises(ValueError, match=r"different numbers of rows \(10, 9\).*y\[:10\]"):
        next(iterator)
    with pytest.raises(ValueError, match="different numbers of rows"):
        for _ in strategy.experimental_distribute_dataset([{"a": x[:4], "b": y[:5]}]):
            pass


EVERY_STRATEGY = [
    lambda: keras_dist.OneDeviceStrategy("cpu:0"),
    lambda: keras_dist.MirroredStrategy(DEVICES[:2]),
    lambda: keras_dist.MirroredStrategy(DEVICES),
    lambda: keras_dist.CentralStorageStrategy(DEVICES),
    lambda: keras_dist.get_strategy(),
]
EVERY_STRATEGY_IDS = ["one-device", "mirrored-2", "mirrored-4", "central-storage-4", "default"]


@pytest.mark.parametrize("make_strategy", EVERY_STRATEGY, ids=EVERY_STRATEGY_IDS)
def test_a_one_shot_generator_is_read_once_then_refused(make_strategy):
    """A generator given to experimental_distribute_dataset: the first pass
    gives every batch (element_spec, looked at first, loses none); a second
    pass (a second epoch) used to give no batch, silently; now one clear
    error naming what can be iterated again."""
    strategy = make_strategy()
    x = np.arange(40, dtype="float32").reshape(20, 2)

    def batches():
        for start in range(0, 20, 8):
            yield x[start : start + 8]

    dataset = strategy.experimental_distribute_dataset(batches())
    if strategy is not keras_dist.get_strategy():
        assert tuple(dataset.element_spec.shape) == (None, 2)
    totals = [
        float(strategy.reduce("SUM", strategy.run(lambda part: keras.ops.sum(part), args=(batch,)), axis=None))
        for batch in dataset
    ]
    assert totals == [float(x[s : s + 8].sum()) for s in range(0, 20, 8)]
    with pytest.raises(ValueError, match="one-shot generator.*read once.*a list of batches"):
        for _ in dataset:
            pass
    again = strategy.experimental_distribute_dataset([x[:8], x[8:]])  # a list: read again and again
    assert len(list(again)) == len(list(again)) == 2


@pytest.mark.parametrize("kind", sorted(_CROSS_REPLICA_STRATEGIES))
def test_run_inside_run_is_refused_as_in_tf(kind):
    """`strategy.run` inside `strategy.run` needs cross-replica context, as tf
    says (JAX gave a `shard_map` mesh error); the outer strategy still runs."""
    strategy = _CROSS_REPLICA_STRATEGIES[kind]()
    with pytest.raises(RuntimeError, match=r"strategy.run requires cross-replica context.*merge_call"):
        strategy.run(lambda: strategy.run(lambda: keras.ops.ones(())))
    ones = strategy.run(lambda: keras.ops.ones(()))
    assert [float(v) for v in strategy.experimental_local_results(ones)] == [1.0] * len(
        strategy.experimental_local_results(ones)
    )
