"""Keras variables written inside `strategy.run`: tf.distribute's semantics
on both backends, and a failed call never leaves a variable unusable.

`tf_semantics` states what tf.distribute does (4 replicas; replica r's
value is r + 1, or 1.0 on every replica); on TensorFlow the test also runs
tf.distribute itself on plain `tf.Variable`s and checks it agrees, so the
table cannot drift from tf. Where JAX deliberately differs (a mirrored
"none" variable given different values per replica: tf lets the copies
diverge, JAX has one copy and raises; an on-read "none" variable: tf fails
at the assignment outside run that starts each case, having no way to split
the value over the replicas ("read" in the table), JAX when it is written
inside run) the table says so.
"""

import numpy as np
import pytest
import keras

import keras_dist
from conftest import BACKEND

REPLICAS = 4
START = 10.0  # assigned outside run (cross-replica) before the step
AGGREGATIONS = ["none", "sum", "mean", "only_first_replica"]
SYNCS = ["on_write", "on_read"]
OPS = ["assign", "assign_add"]


def tf_semantics(aggregation, sync, op, varying, backend=BACKEND):
    """(value read outside run after the step, each replica's value read
    inside run right after the write), or the start of the error message."""
    xs = [float(r + 1) if varying else 1.0 for r in range(REPLICAS)]
    if sync == "on_write":
        if aggregation == "none":
            if varying and backend == "jax":
                return "must specify an aggregation"
            inside = [x if op == "assign" else START + x for x in xs]
            return inside[0], inside
        reduced = {"sum": sum(xs), "mean": sum(xs) / REPLICAS, "only_first_replica": xs[0]}[aggregation]
        value = reduced if op == "assign" else START + reduced
        return value, [value] * REPLICAS
    if aggregation == "none":
        return "aggregation" if backend == "jax" else "read"
    start = START / REPLICAS if aggregation == "sum" else START  # tf splits a cross-replica assign
    inside = [x if op == "assign" else start + x for x in xs]
    outside = {"sum": sum(inside), "mean": sum(inside) / REPLICAS, "only_first_replica": inside[0]}[aggregation]
    return outside, inside


CASES = [
    pytest.param(a, s, o, v, id=f"{s}-{a}-{o}-{'varying' if v else 'same'}")
    for s in SYNCS
    for a in AGGREGATIONS
    for o in OPS
    for v in (False, True)
]


def _step(strategy, variable, op, varying):
    def replica_fn():
        if varying:
            replica = keras_dist.get_replica_context().replica_id_in_sync_group
            x = keras.ops.cast(replica, "float32") + 1.0
        else:
            x = keras.ops.convert_to_tensor(1.0)
        getattr(variable, op)(x)
        return keras.ops.convert_to_tensor(variable.value) * 1.0

    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda: strategy.run(replica_fn))()
    return strategy.run(replica_fn)


def _central_semantics(aggregation, sync, op, varying):
    """CentralStorageStrategy keeps one copy of a mirrored variable on both
    backends, so a "none" one follows JAX's rule (tf refuses every write of
    it in replica context, even of one value: Keras' Nadam makes one). On
    TensorFlow the check runs in the compiled step (InvalidArgumentError).
    An on-read variable keeps a copy per replica, as under Mirrored."""
    return tf_semantics(aggregation, sync, op, varying, backend="jax" if sync == "on_write" else BACKEND)


STRATEGIES = {
    "mirrored": (lambda devices: keras_dist.MirroredStrategy(devices), tf_semantics),
    "central_storage": (lambda devices: keras_dist.CentralStorageStrategy(devices), _central_semantics),
}


@pytest.mark.parametrize("strategy_name", list(STRATEGIES))
@pytest.mark.parametrize("aggregation,sync,op,varying", CASES)
def test_variable_written_inside_run(aggregation, sync, op, varying, strategy_name):
    make, semantics = STRATEGIES[strategy_name]
    strategy = make([f"cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        variable = keras.Variable(0.0, aggregation=aggregation, synchronization=sync)
    expected = semantics(aggregation, sync, op, varying)
    if expected == "read":  # TensorFlow: tf.distribute cannot split a value over the replicas
        with pytest.raises(ValueError, match="Could not convert"):
            variable.assign(START)
        return
    variable.assign(START)
    if isinstance(expected, str):
        errors = (ValueError,)
        if BACKEND == "tensorflow" and strategy_name == "central_storage":
            import tensorflow as tf

            errors = (tf.errors.InvalidArgumentError,)  # checked as the step runs
        with pytest.raises(errors, match=expected):
            _step(strategy, variable, op, varying)
        assert float(variable.numpy()) == START  # intact and usable
        variable.assign_add(1.0)
        assert float(variable.numpy()) == START + 1
        return
    out = _step(strategy, variable, op, varying)
    inside = [float(np.asarray(x)) for x in strategy.experimental_local_results(out)]
    outside, expected_inside = expected
    assert inside == expected_inside
    assert float(variable.numpy()) == outside
    # and again: the next step starts from what this one left
    _step(strategy, variable, "assign_add", False)
    assert np.isfinite(float(variable.numpy()))


ONE_REPLICA = {
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-1": lambda: keras_dist.MirroredStrategy(["cpu:0"]),
    "central_storage-1": lambda: keras_dist.CentralStorageStrategy(["cpu:0"]),
}


@pytest.mark.parametrize("aggregation", AGGREGATIONS)
@pytest.mark.parametrize("strategy_name", sorted(ONE_REPLICA))
def test_one_replica_takes_a_value_computed_from_its_rows(strategy_name, aggregation):
    """With one replica a value computed from the replica's rows cannot
    differ across replicas: every aggregation takes it, "none" included (JAX
    refused it under OneDeviceStrategy, found by a stateful LSTM's state
    written inside run: tests/test_stateful_layers.py)."""
    strategy = ONE_REPLICA[strategy_name]()
    with strategy.scope():
        variable = keras.Variable(np.zeros(3, "float32"), aggregation=aggregation)
    x = np.arange(6, dtype="float32").reshape(2, 3)

    def replica_fn(rows):
        variable.assign(keras.ops.sum(rows, axis=0))
        return keras.ops.convert_to_tensor(variable.value) * 1.0

    for batch in strategy.experimental_distribute_dataset([x]):
        out = strategy.run(replica_fn, args=(batch,))
    np.testing.assert_array_equal(variable.numpy(), [3.0, 5.0, 7.0])
    np.testing.assert_array_equal(np.asarray(strategy.experimental_local_results(out)[0]), [3.0, 5.0, 7.0])


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the oracle is tf.distribute itself (TensorFlow backend)")
def test_the_table_is_what_tf_distribute_does():
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(REPLICAS)])
    sync_of = {"on_write": tf.VariableSynchronization.ON_WRITE, "on_read": tf.VariableSynchronization.ON_READ}
    for param in CASES:
        aggregation, sync, op, varying = param.values
        with strategy.scope():
            variable = tf.Variable(
                0.0, aggregation=tf.VariableAggregation[aggregation.upper()], synchronization=sync_of[sync]
            )

        def replica_fn():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            x = tf.cast(replica, tf.float32) + 1.0 if varying else tf.constant(1.0)
            getattr(variable, op)(x)
            return tf.identity(variable)

        expected = tf_semantics(aggregation, sync, op, varying, backend="tensorflow")
        if expected == "read":
            with pytest.raises(ValueError, match="Could not convert"):
                variable.assign(START)
            continue
        variable.assign(START)
        out = tf.function(lambda: strategy.run(replica_fn))()
        inside = [float(x) for x in strategy.experimental_local_results(out)]
        assert (float(variable.numpy()), inside) == expected, param.id


def test_a_failed_run_leaves_variables_intact():
    strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        counter = keras.Variable(3.0, aggregation="sum")

    def failing():
        counter.assign_add(1.0)
        raise RuntimeError("user error after a write")

    with pytest.raises(RuntimeError, match="user error after a write"):
        strategy.run(failing)
    if BACKEND == "jax":  # the step is one program: nothing of a failed call lands
        assert float(counter.numpy()) == 3.0
    else:  # tf runs the replicas eagerly: writes made before the error stay, as in tf
        assert np.isfinite(float(counter.numpy()))
    counter.assign(5.0)
    doubled = strategy.experimental_local_results(strategy.run(lambda: counter.value * 2.0))
    assert [float(np.asarray(x)) for x in doubled] == [10.0] * REPLICAS


def test_a_variable_read_inside_run_is_read_at_each_call():
    """Not frozen into the compiled step: an assign outside run is seen by the next call."""
    strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        scale = keras.Variable(2.0)

    def fn(x):
        return x * scale.value

    first = strategy.run(fn, args=(np.float32(1.0),))
    scale.assign(5.0)
    second = strategy.run(fn, args=(np.float32(1.0),))
    assert [float(np.asarray(v)) for v in strategy.experimental_local_results(first)][0] == 2.0
    assert [float(np.asarray(v)) for v in strategy.experimental_local_results(second)][0] == 5.0


@pytest.mark.skipif(BACKEND != "jax", reason="JAX: run inside an outer jax.jit")
def test_run_inside_jax_jit_cannot_update_variables():
    import jax

    strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        counter = keras.Variable(0.0, aggregation="sum")

    @jax.jit
    def outer(x):
        return strategy.run(lambda y: counter.assign_add(y), args=(x,))

    with pytest.raises(RuntimeError, match="outside jax.jit"):
        outer(np.float32(1.0))
    assert float(counter.numpy()) == 0.0


def _metric_run(strategy, metrics, batches):
    """Each metric updated inside run, batch by batch."""
    dataset = strategy.experimental_distribute_dataset(batches)

    def update(inputs):
        y_true, y_pred = inputs
        for metric in metrics:
            metric.update_state(y_true, y_pred)
        return keras.ops.convert_to_tensor(0.0)

    for batch in dataset:
        if BACKEND == "tensorflow":
            import tensorflow as tf

            tf.function(lambda b: strategy.run(update, args=(b,)))(batch)
        else:
            strategy.run(update, args=(batch,))
    return [float(metric.result()) for metric in metrics]


def test_metrics_updated_inside_run_give_the_global_value():
    rng = np.random.default_rng(0)
    y_true = (rng.random((16, 1)) > 0.5).astype("float32")
    y_pred = rng.random((16, 1)).astype("float32")
    # 10 rows over 4 replicas, then a partial 6: uneven shards (JAX pads them)
    batches = [(y_true[i : i + 10], y_pred[i : i + 10]) for i in range(0, 16, 10)]

    def make():
        return [
            keras.metrics.BinaryAccuracy(),
            keras.metrics.BinaryCrossentropy(),
            keras.metrics.AUC(num_thresholds=50),
            keras.metrics.Precision(thresholds=0.4),
        ]

    strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)])
    with strategy.scope():
        distributed = make()
    got = _metric_run(strategy, distributed, batches)
    reference = make()
    for metric in reference:
        for t, p in batches:
            metric.update_state(t, p)
    want = [float(metric.result()) for metric in reference]
    np.testing.assert_allclose(got, want, atol=1e-6)


class _SumPlusMean(keras.metrics.Metric):
    """A user's metric whose result reads two other metrics' results."""

    def __init__(self, name="sum_plus_mean"):
        super().__init__(name=name)
        self.total = keras.metrics.Sum()
        self.mean = keras.metrics.Mean()

    def update_state(self, values):
        self.total.update_state(values)
        self.mean.update_state(values)

    def result(self):
        return self.total.result() + self.mean.result()

    def reset_state(self):
        self.total.reset_state()
        self.mean.reset_state()


#: The strategies of one process `run` works under (the default one too).
_RESULT_STRATEGIES = {
    "default": keras_dist.get_strategy,
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-4": lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(REPLICAS)]),
    "central-storage-4": lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(REPLICAS)]),
}


@pytest.mark.parametrize("strategy_name", sorted(_RESULT_STRATEGIES))
def test_metric_result_inside_run_is_the_value_over_all_replicas(strategy_name):
    """`metric.result()` inside `run` is the metric over every replica's
    updates so far, on each replica, as tf-keras gave it (Keras 3 alone
    gives each replica its own share). After tf-keras's `testAddMetric`
    (keras_metrics_test.py; `Layer.add_metric` is gone in Keras 3): a
    variable assigned the Sum's result inside run holds the global sum.
    10 rows over 4 replicas, then 6 (uneven shards), so padding counts too."""
    rng = np.random.default_rng(1)
    values = rng.normal(size=(16,)).astype("float32")
    y_true = (rng.random((16, 1)) > 0.5).astype("float32")
    y_pred = rng.random((16, 1)).astype("float32")
    batches = [(values[i : i + 10], y_true[i : i + 10], y_pred[i : i + 10]) for i in (0, 10)]

    def make():
        return [keras.metrics.Sum(), keras.metrics.Mean(), keras.metrics.AUC(num_thresholds=20), _SumPlusMean()]

    strategy = _RESULT_STRATEGIES[strategy_name]()
    with strategy.scope():
        metrics = make()
        last_sum = keras.Variable(0.0, aggregation="only_first_replica")

    def step(inputs):
        v, t, p = inputs
        metrics[0].update_state(v)
        metrics[1].update_state(v)
        metrics[2].update_state(t, p)
        metrics[3].update_state(v)
        results = [metric.result() for metric in metrics]
        last_sum.assign(results[0])
        return results

    run = lambda batch: strategy.run(step, args=(batch,))  # noqa: E731
    if BACKEND == "tensorflow":
        import tensorflow as tf

        run = tf.function(run)
    reference = make()
    for batch, (v, t, p) in zip(strategy.experimental_distribute_dataset(batches), batches):
        got = [strategy.experimental_local_results(r) for r in run(batch)]
        reference[0].update_state(v)
        reference[1].update_state(v)
        reference[2].update_state(t, p)
        reference[3].update_state(v)
        want = [float(metric.result()) for metric in reference]
        for name, replicas, expected in zip(["Sum", "Mean", "AUC", "user's"], got, want):
            assert len(replicas) == strategy.num_replicas_in_sync
            for replica, value in enumerate(replicas):
                assert float(value) == pytest.approx(expected, abs=1e-5), (name, replica, float(value), expected)
        assert float(last_sum.numpy()) == pytest.approx(want[0], abs=1e-5)
    # Outside run, result() is the class's own, as without keras_dist.
    assert [float(metric.result()) for metric in metrics] == pytest.approx(want, abs=1e-5)
