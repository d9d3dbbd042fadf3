"""The backend-agnostic core: names, devices, splitting, contexts."""

import keras
import pytest

import keras_dist
from keras_dist import _devices, _split


def test_reduce_op():
    assert keras_dist.ReduceOp.from_value("SUM") is keras_dist.ReduceOp.SUM
    assert keras_dist.ReduceOp.from_value("mean") is keras_dist.ReduceOp.MEAN
    assert keras_dist.ReduceOp.from_value(keras_dist.ReduceOp.MEAN) is keras_dist.ReduceOp.MEAN
    with pytest.raises(ValueError, match="Unknown reduce op"):
        keras_dist.ReduceOp.from_value("max")


@pytest.mark.parametrize(
    "name, expected",
    [
        ("cpu:1", "cpu:1"),
        ("/gpu:0", "gpu:0"),
        ("GPU:2", "gpu:2"),
        ("/device:CPU:0", "cpu:0"),
        ("/job:localhost/replica:0/task:0/device:GPU:0", "gpu:0"),
        ("/job:worker/task:1/device:TPU:3", "tpu:3"),
    ],
)
def test_device_spellings(name, expected):
    assert _devices.canonical_device(name) == expected


def test_default_devices_prefer_accelerators():
    assert _devices.resolve_devices(None, ["cpu:0", "gpu:0", "gpu:1"]) == ("gpu:0", "gpu:1")
    assert _devices.resolve_devices(None, ["cpu:0", "cpu:1"]) == ("cpu:0", "cpu:1")


@pytest.mark.parametrize(
    "total, replicas, sizes",
    [(10, 4, [3, 3, 2, 2]), (64, 4, [16] * 4), (3, 4, [1, 1, 1, 0]), (0, 2, [0, 0]), (7, 1, [7])],
)
def test_shard_sizes(total, replicas, sizes):
    assert _split.shard_sizes(total, replicas) == sizes
    bounds = _split.shard_bounds(total, replicas)
    assert [b - a for a, b in bounds] == sizes
    assert bounds[0][0] == 0 and bounds[-1][1] == total


def test_per_replica_batch_size():
    assert _split.per_replica_batch_size(64, 4) == 16
    with pytest.raises(ValueError, match="not divisible"):
        _split.per_replica_batch_size(10, 4)
    with pytest.raises(ValueError, match="positive integer"):
        _split.per_replica_batch_size(0, 4)


def test_mirrored_defaults_to_all_local_devices():
    strategy = keras_dist.MirroredStrategy()
    assert strategy.num_replicas_in_sync == 4
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
    assert keras_dist.MirroredStrategy(
        ["/cpu:0", "/job:localhost/replica:0/task:0/device:CPU:1"]
    ).extended.worker_devices == ("cpu:0", "cpu:1")


def test_default_strategy_and_contexts(mirrored):
    default = keras_dist.get_strategy()
    assert not keras_dist.has_strategy()
    assert default.num_replicas_in_sync == 1
    assert not keras_dist.in_cross_replica_context()
    context = keras_dist.get_replica_context()
    assert context.replica_id_in_sync_group == 0 and context.num_replicas_in_sync == 1
    with default.scope():
        assert not keras_dist.has_strategy()

    strategy = mirrored(2)
    with strategy.scope() as entered:
        assert entered is strategy
        assert keras_dist.get_strategy() is strategy
        assert keras_dist.has_strategy()
        assert keras_dist.in_cross_replica_context()
        assert keras_dist.get_replica_context() is None
    assert keras_dist.get_strategy() is default


def test_experimental_set_strategy(mirrored):
    strategy = mirrored(2)
    keras_dist.experimental_set_strategy(strategy)
    assert keras_dist.get_strategy() is strategy
    keras_dist.experimental_set_strategy(None)
    assert not keras_dist.has_strategy()


def test_cross_device_ops_accepted():
    ops = keras_dist.HierarchicalCopyAllReduce(num_packs=0)
    strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"], cross_device_ops=ops)
    assert strategy.extended.cross_device_ops == ops
    assert keras_dist.MirroredStrategy(cross_device_ops=None).extended.cross_device_ops is None


@pytest.mark.parametrize("bad", [object(), "nccl", keras_dist.CrossDeviceOps, keras_dist.NcclAllReduce])
def test_cross_device_ops_of_the_wrong_type(bad):
    with pytest.raises(TypeError, match=r"cross_device_ops must be one of keras_dist\.NcclAllReduce\(\)"):
        keras_dist.MirroredStrategy(cross_device_ops=bad)


@pytest.mark.parametrize("total", [0, 1, 2, 7, 10, 64])
def test_replica_shard_is_shard_bounds_for_ints_and_traced_tensors(total):
    """The one split, for sizes known only as the step runs (the
    TensorFlow step slices its rows with tensors)."""
    for replicas in (1, 3, 4):
        bounds = _split.shard_bounds(total, replicas)
        for replica, (begin, end) in enumerate(bounds):
            assert _split.replica_shard(total, replicas, replica) == (begin, end - begin)
            start, size = _split.replica_shard(
                keras.ops.convert_to_tensor(total, "int32"), replicas, keras.ops.convert_to_tensor(replica, "int32")
            )
            assert (int(start), int(size)) == (begin, end - begin)
