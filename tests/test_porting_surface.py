"""tf.distribute names a ported program calls: values from a function,
the deprecated dataset alias, RunOptions (honoured or refused per field)."""

import numpy as np
import pytest
import keras

import keras_dist
from conftest import BACKEND


def _strategy():
    return keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)])


def _local(strategy, value):
    return [np.asarray(x) for x in strategy.experimental_local_results(value)]


def test_values_from_function_gives_each_replica_its_value():
    strategy = _strategy()
    contexts = []

    def value_fn(context):
        contexts.append((context.replica_id_in_sync_group, context.num_replicas_in_sync))
        return np.full((3,), context.replica_id_in_sync_group, "float32")

    values = strategy.experimental_distribute_values_from_function(value_fn)
    assert contexts == [(r, 4) for r in range(4)]
    assert [v.tolist() for v in _local(strategy, values)] == [[r] * 3 for r in range(4)]
    doubled = strategy.run(lambda v: v * 2.0, args=(values,))
    assert [v.tolist() for v in _local(strategy, doubled)] == [[2.0 * r] * 3 for r in range(4)]
    assert np.asarray(strategy.reduce("SUM", doubled, axis=None)).tolist() == [12.0] * 3


def test_values_from_function_of_different_lengths():
    """Replica r gets r + 1 rows; sums over rows stay exact (JAX pads)."""
    strategy = _strategy()
    values = strategy.experimental_distribute_values_from_function(
        lambda context: np.arange(context.replica_id_in_sync_group + 1, dtype="float32")
    )
    assert [v.tolist() for v in _local(strategy, values)] == [list(range(r + 1)) for r in range(4)]
    sums = strategy.run(lambda v: keras.ops.sum(v), args=(values,))
    assert float(np.asarray(strategy.reduce("SUM", sums, axis=None))) == 0 + 1 + 3 + 6


def test_value_context_is_experimental():
    context = keras_dist.experimental.ValueContext(2, 4)
    assert (context.replica_id_in_sync_group, context.num_replicas_in_sync) == (2, 4)
    with pytest.raises(TypeError, match="needs a callable"):
        _strategy().experimental_distribute_values_from_function([1, 2, 3, 4])


def test_deprecated_datasets_from_function_alias():
    strategy = _strategy()
    x = np.arange(16, dtype="float32").reshape(16, 1)

    def dataset_fn(context):
        size = context.get_per_replica_batch_size(8)
        return [x[i : i + size] for i in range(0, 16, size)]

    with pytest.warns(DeprecationWarning, match="distribute_datasets_from_function"):
        old = list(strategy.experimental_distribute_datasets_from_function(dataset_fn))
    new = list(strategy.distribute_datasets_from_function(dataset_fn))
    assert len(old) == len(new) == 2
    for a, b in zip(old, new):
        assert [v.tolist() for v in _local(strategy, a)] == [v.tolist() for v in _local(strategy, b)]


def test_run_options_honoured_or_refused():
    strategy = _strategy()
    for dynamic in (True, False):  # honoured either way: a program per input shape
        out = strategy.run(lambda: keras.ops.convert_to_tensor(1.0), options=keras_dist.RunOptions(dynamic))
        assert [float(v) for v in _local(strategy, out)] == [1.0] * 4
    with pytest.raises(NotImplementedError, match="bucketizing"):
        strategy.run(lambda: 1.0, options=keras_dist.RunOptions(experimental_bucketizing_dynamic_shape=True))
    with pytest.raises(NotImplementedError, match="xla_options"):
        strategy.run(lambda: 1.0, options=keras_dist.RunOptions(experimental_xla_options=object()))
    with pytest.raises(TypeError, match="RunOptions"):
        strategy.run(lambda: 1.0, options={"experimental_enable_dynamic_batch_size": True})


def _in_step(strategy, fn, *args):
    """strategy.run(fn, args), in a tf.function on TensorFlow as ported code has it."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(lambda *a: strategy.run(fn, args=a))(*args)
    return strategy.run(fn, args=args)


def _replica_value():
    replica = keras_dist.get_replica_context().replica_id_in_sync_group
    return keras.ops.cast(replica, "float32") + 1.0  # 1, 2, 3, 4


def test_merge_call_reduces_and_updates_once():
    """tf's canonical merge_call: reduce the replicas' values and update a
    variable once in cross-replica context; every replica gets the result."""
    strategy = _strategy()
    with strategy.scope():
        total = keras.Variable(100.0)

    def replica_fn():
        def merge_fn(merge_strategy, value):
            assert keras_dist.in_cross_replica_context()
            reduced = merge_strategy.reduce("SUM", value, axis=None)
            merge_strategy.extended.update(total, lambda var, x: var.assign_add(x), args=(reduced,))
            return reduced

        return keras_dist.get_replica_context().merge_call(merge_fn, args=(_replica_value(),))

    out = _in_step(strategy, replica_fn)
    assert {float(v) for v in _local(strategy, out)} == {10.0}  # the same on every replica
    assert float(total.numpy()) == 110.0  # applied once, not once per replica


def test_merge_call_hands_each_replica_its_component():
    strategy = _strategy()

    def replica_fn():
        return keras_dist.get_replica_context().merge_call(lambda s, v: v, args=(_replica_value() * 10.0,))

    out = _in_step(strategy, replica_fn)
    assert [float(v) for v in _local(strategy, out)] == [10.0, 20.0, 30.0, 40.0]


def test_extended_cross_replica_methods():
    strategy = _strategy()
    with strategy.scope():
        v = keras.Variable(1.0)
    per_replica = _in_step(strategy, _replica_value)
    assert float(np.asarray(strategy.extended.reduce_to("SUM", per_replica, v))) == 10.0
    assert float(np.asarray(strategy.extended.reduce_to("MEAN", per_replica, "cpu:1"))) == 2.5
    pairs = strategy.extended.batch_reduce_to("SUM", [(per_replica, v), (per_replica, v)])
    assert [float(np.asarray(p)) for p in pairs] == [10.0, 10.0]
    with pytest.raises(ValueError, match="not a device"):
        strategy.extended.reduce_to("SUM", per_replica, "cpu:7")
    # options asking for nothing beyond the strategy's are taken; a timeout
    # too in one process (no peer to wait for); a pack size is not.
    for options in [keras_dist.CommunicationOptions(), keras_dist.CommunicationOptions(timeout_seconds=5)]:
        assert float(np.asarray(strategy.extended.reduce_to("SUM", per_replica, v, options=options))) == 10.0
    with pytest.raises(NotImplementedError, match="bytes_per_pack other than the strategy's"):
        strategy.extended.batch_reduce_to("SUM", [(per_replica, v)], options=keras_dist.CommunicationOptions(bytes_per_pack=1024))
    with pytest.raises(TypeError, match="takes a keras_dist.CommunicationOptions"):
        strategy.extended.reduce_to("SUM", per_replica, v, options={"timeout_seconds": 5})

    strategy.extended.update(v, lambda var, x: var.assign(x * 3.0), args=(2.0,))
    assert float(v.numpy()) == 6.0
    parts = strategy.extended.update(v, lambda var: var.assign_add(1.0), group=False)
    assert len(parts) >= 1 and float(v.numpy()) == 7.0
    with pytest.raises(RuntimeError, match="merge_call"):
        _in_step(strategy, lambda: strategy.extended.update(v, lambda var: var.assign(0.0)))
    assert float(v.numpy()) == 7.0

    assert strategy.extended.value_container(v) is v
    with strategy.extended.colocate_vars_with(v):
        with strategy.scope():
            w = keras.Variable(2.0)
    assert strategy.extended.variable_created_in_scope(w)
    with pytest.raises(ValueError, match="not created under"):
        strategy.extended.colocate_vars_with(keras.Variable(0.0))
    mirrored = strategy.extended.broadcast_to(np.float32(5.0), v)
    assert [float(np.asarray(c)) for c in _local(strategy, mirrored)][0] == 5.0
    assert strategy.extended.experimental_enable_get_next_as_optional is True
    strategy.extended.experimental_enable_get_next_as_optional = True  # as tf-keras's tests set it
    with pytest.raises(ValueError, match="always end cleanly.*drop_remainder=True"):
        strategy.extended.experimental_enable_get_next_as_optional = False  # tf: "every batch is full"
    assert strategy.extended.experimental_enable_get_next_as_optional is True
    assert strategy.extended.experimental_require_static_shapes is False


def test_replica_context_devices():
    strategy = _strategy()
    if BACKEND == "jax":
        with pytest.raises(NotImplementedError, match="worker_devices"):
            strategy.run(lambda: keras_dist.get_replica_context().devices)
    else:
        import tensorflow as tf

        seen = []

        def replica_fn():
            seen.append(keras_dist.get_replica_context().devices)
            return tf.constant(0.0)

        strategy.run(replica_fn)
        assert sorted(device for devices in seen for device in devices) == sorted(tf.distribute.MirroredStrategy([f"/cpu:{i}" for i in range(4)]).extended.worker_devices)
    assert keras_dist.get_replica_context().devices == ("cpu:0",)  # the default context, outside any scope


def _global_batches(as_tf_data):
    x = np.arange(14, dtype="float32").reshape(14, 1)
    if as_tf_data:
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices((x, 10 * x)).batch(10)
    return [(x[i : i + 10], 10 * x[i : i + 10]) for i in range(0, 14, 10)]


INPUT_KINDS = [
    pytest.param(False, id="numpy"),
    pytest.param(True, id="tf.data", marks=pytest.mark.needs_tensorflow),
]


@pytest.mark.parametrize("as_tf_data", INPUT_KINDS)
def test_distributed_dataset_and_iterator_api(as_tf_data):
    strategy = _strategy()
    dataset = strategy.experimental_distribute_dataset(_global_batches(as_tf_data))
    assert isinstance(dataset, keras_dist.DistributedDataset)
    x_spec, y_spec = dataset.element_spec
    if hasattr(x_spec, "_component_specs"):  # tf.data on TensorFlow: tf's own PerReplicaSpec
        x_spec = x_spec._component_specs[0]
    assert tuple(x_spec.shape)[1:] == (1,) and "float32" in str(x_spec.dtype)

    iterator = iter(dataset)
    assert isinstance(iterator, keras_dist.DistributedIterator)
    first = iterator.get_next()
    assert [np.asarray(v).ravel().tolist() for v in _local(strategy, first[0])] == [[0, 1, 2], [3, 4, 5], [6, 7], [8, 9]]
    second = iterator.get_next_as_optional()
    assert bool(second.has_value())
    assert [np.asarray(v).ravel().tolist() for v in _local(strategy, second.get_value()[0])] == [[10], [11], [12], [13]]
    assert not bool(iterator.get_next_as_optional().has_value())

    def add(state, element):
        sums = strategy.run(lambda x, y: keras.ops.sum(y), args=element)
        return state + strategy.reduce("SUM", sums, axis=None)

    assert float(np.asarray(dataset.reduce(np.float32(0.0), add))) == 10 * sum(range(14))


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function: the TensorFlow backend")
def test_iterating_inside_a_tf_function():
    """tensorflow.org tutorials/distribute/custom_training, 'Iterating inside
    a tf.function', ported by renaming (it raised TypeError: int() ... None)."""
    import tensorflow as tf

    strategy = _strategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1)])
        optimizer = keras.optimizers.SGD(0.01)
    loss_object = keras.losses.MeanSquaredError(reduction="none")
    dist_dataset = strategy.experimental_distribute_dataset(_global_batches(True))

    def train_step(inputs):
        features, labels = inputs
        with tf.GradientTape() as tape:
            loss = keras_dist.compute_average_loss(loss_object(labels, model(features, training=True)), global_batch_size=10)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        return loss

    @tf.function
    def distributed_train_epoch(dataset):
        total_loss = 0.0
        num_batches = 0
        for x in dataset:
            per_replica_losses = strategy.run(train_step, args=(x,))
            total_loss += strategy.reduce(keras_dist.ReduceOp.SUM, per_replica_losses, axis=None)
            num_batches += 1
        return total_loss / tf.cast(num_batches, dtype=tf.float32)

    loss = float(distributed_train_epoch(dist_dataset))
    assert np.isfinite(loss) and int(optimizer.iterations.numpy()) == 2


class _CountingBatches:
    """A dataset of global batches that counts the batches read from it."""

    def __init__(self, count):
        self.count, self.read = count, 0

    def __iter__(self):
        for i in range(self.count):
            self.read += 1
            yield np.full((4, 1), i, "float32")


@pytest.mark.parametrize("size", [1, 3])
def test_input_options_buffer_size_prepares_elements_ahead(size):
    strategy = _strategy()
    source = _CountingBatches(5)
    options = keras_dist.InputOptions(experimental_per_replica_buffer_size=size)
    iterator = iter(strategy.experimental_distribute_dataset(source, options=options))
    first = next(iterator)
    assert source.read == size  # this element and the next size - 1 are ready
    assert [float(np.asarray(v).ravel()[0]) for v in _local(strategy, first)] == [0.0] * 4
    assert len([first, *iterator]) == 5


def _per_replica_fn(as_tf_data):
    def dataset_fn(context):
        assert context.num_input_pipelines == 4 and context.num_replicas_in_sync == 4
        rows = np.full((2 * 3, 1), context.input_pipeline_id, "float32")
        if as_tf_data:
            import tensorflow as tf

            return tf.data.Dataset.from_tensor_slices(rows).batch(2)
        return [rows[i : i + 2] for i in range(0, 6, 2)]

    return dataset_fn


@pytest.mark.parametrize("as_tf_data", INPUT_KINDS)
def test_input_options_per_replica_pipelines(as_tf_data):
    """PER_REPLICA: dataset_fn is called once per replica; each replica
    reads its own pipeline."""
    strategy = _strategy()
    options = keras_dist.InputOptions(experimental_replication_mode=keras_dist.InputReplicationMode.PER_REPLICA)
    steps = list(strategy.distribute_datasets_from_function(_per_replica_fn(as_tf_data), options=options))
    assert len(steps) == 3
    for step in steps:
        assert [np.asarray(v).ravel().tolist() for v in _local(strategy, step)] == [[r, r] for r in range(4)]


def test_input_options_combinations_are_checked():
    modes = keras_dist.InputReplicationMode
    with pytest.raises(ValueError, match="needs experimental_replication_mode"):
        keras_dist.InputOptions(experimental_place_dataset_on_device=True)
    with pytest.raises(ValueError, match="cannot both be True"):
        keras_dist.InputOptions(
            experimental_place_dataset_on_device=True, experimental_fetch_to_device=True,
            experimental_replication_mode=modes.PER_REPLICA,
        )
    with pytest.raises(ValueError, match="positive integer"):
        keras_dist.InputOptions(experimental_per_replica_buffer_size=0)
    strategy = _strategy()
    with pytest.raises(ValueError, match="only supported by"):
        strategy.experimental_distribute_dataset(
            _global_batches(False), keras_dist.InputOptions(experimental_replication_mode=modes.PER_REPLICA)
        )
    on_device = keras_dist.InputOptions(
        experimental_place_dataset_on_device=True, experimental_replication_mode=modes.PER_REPLICA
    )
    with pytest.raises(NotImplementedError, match="runs on the host"):
        strategy.distribute_datasets_from_function(_per_replica_fn(False), options=on_device)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.data input on TensorFlow: tf carries the options out")
def test_tf_data_keeps_elements_off_the_devices_when_asked():
    strategy = _strategy()
    for fetch, expected in ((True, ["CPU:0", "CPU:1", "CPU:2", "CPU:3"]), (False, ["CPU:0"] * 4)):
        options = keras_dist.InputOptions(experimental_fetch_to_device=fetch)
        x, _ = next(iter(strategy.experimental_distribute_dataset(_global_batches(True), options)))
        assert [component.device[-5:] for component in strategy.experimental_local_results(x)] == expected


def test_all_reduce_options_per_call():
    """tf's `ReplicaContext.all_reduce(..., options=)`: TensorFlow applies them
    per call (tf's own all_reduce); on JAX the step's collectives are
    compiled together, so options may only repeat the strategy's."""
    strategy = _strategy()

    def step(options):
        return lambda: keras_dist.get_replica_context().all_reduce("SUM", _replica_value(), options=options)

    default = keras_dist.CommunicationOptions()
    assert [float(x) for x in _local(strategy, strategy.run(step(default)))] == [10.0] * 4
    packed = keras_dist.CommunicationOptions(bytes_per_pack=1024, implementation=keras_dist.CommunicationImplementation.RING)
    if BACKEND == "tensorflow":
        assert [float(x) for x in _local(strategy, strategy.run(step(packed)))] == [10.0] * 4
        import tensorflow as tf  # tf's own options, as ported code holds them

        tf_options = tf.distribute.experimental.CommunicationOptions(bytes_per_pack=64)
        assert [float(x) for x in _local(strategy, strategy.run(step(tf_options)))] == [10.0] * 4
    else:
        with pytest.raises(NotImplementedError, match="Set them on the strategy"):
            strategy.run(step(packed))
    with pytest.raises(TypeError, match="takes a keras_dist.CommunicationOptions"):
        strategy.run(step("RING"))


def test_collective_hints_make_communication_options():
    with pytest.warns(DeprecationWarning, match="use keras_dist.CommunicationOptions"):
        hints = keras_dist.experimental.CollectiveHints(bytes_per_pack=32, timeout_seconds=10)
    assert hints == keras_dist.CommunicationOptions(bytes_per_pack=32, timeout_seconds=10)
    assert "CollectiveHints" in keras_dist.experimental.__all__
    # tf's deprecated alias: the same enum
    assert keras_dist.experimental.CollectiveCommunication is keras_dist.CommunicationImplementation
