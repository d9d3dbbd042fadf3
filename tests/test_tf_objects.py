"""TensorFlow's own objects where keras_dist takes its own (ported code).

On the TensorFlow backend each tf object gives what the keras_dist spelling
gives; on JAX each gets one clear error naming the keras_dist spelling,
recognised by its type's module without importing tensorflow (the
stand-ins prove it where tensorflow is not installed)."""

import enum
import json

import numpy as np
import pytest

import keras_dist
from keras_dist import _foreign
from keras_dist.cluster_resolver import ClusterSpec, SimpleClusterResolver, TFConfigClusterResolver
from conftest import BACKEND

on_tensorflow = pytest.mark.skipif(BACKEND != "tensorflow", reason="tf objects are taken on the TensorFlow backend")
BACKEND_NAME = {"jax": "JAX", "tensorflow": "TensorFlow"}[BACKEND]


def _per_replica(strategy):
    """Replica r holds [r + 1, 2 * (r + 1)]."""
    return strategy.experimental_distribute_values_from_function(
        lambda context: np.array([1.0, 2.0], "float32") * (context.replica_id_in_sync_group + 1)
    )


def _all_reduce_in_run(strategy, op):
    def replica(value):
        return keras_dist.get_replica_context().all_reduce(op, value)

    return strategy.experimental_local_results(strategy.run(replica, args=(_per_replica(strategy),)))


# -- stand-ins: detection by the type's module, on both backends --------------


class ReduceOp(enum.Enum):  # tf.distribute.ReduceOp's name and module
    SUM = "SUM"
    MEAN = "MEAN"


ReduceOp.__module__ = "tensorflow.python.distribute.reduce_util"


class HierarchicalCopyAllReduce:
    __module__ = "tensorflow.python.distribute.cross_device_ops"


class ClusterSpecStandIn:
    __module__ = "tensorflow.python.training.server_lib"


ClusterSpecStandIn.__name__ = ClusterSpecStandIn.__qualname__ = "ClusterSpec"


def test_an_object_of_tensorflow_s_module_gets_one_error_naming_keras_dist_s(mirrored):
    """Stand-ins, not tf's objects: no tf object translates from them, so
    every backend refuses them, naming the keras_dist spelling, before
    anything runs (the same code refuses tf's own on JAX)."""
    strategy = mirrored(4)
    values = _per_replica(strategy)
    message = (
        f"tf.distribute.ReduceOp.SUM is a TensorFlow object, which keras_dist cannot take as a "
        f"reduce op on the {BACKEND_NAME} backend; use keras_dist.ReduceOp.SUM."
    )
    for call in (
        lambda: strategy.reduce(ReduceOp.SUM, values, axis=None),
        lambda: keras_dist.get_strategy().reduce(ReduceOp.SUM, 1.0),
        lambda: strategy.extended.reduce_to(ReduceOp.SUM, values, "cpu:0"),
        lambda: _all_reduce_in_run(strategy, ReduceOp.SUM),
    ):
        with pytest.raises(TypeError) as error:
            call()
        assert str(error.value) == message
    with pytest.raises(TypeError, match=r"ReduceOp\.MEAN .* use keras_dist\.ReduceOp\.MEAN\.$"):
        strategy.reduce(ReduceOp.MEAN, values, axis=None)
    with pytest.raises(
        TypeError,
        match=r"^tf\.distribute\.HierarchicalCopyAllReduce\(\.\.\.\) is a TensorFlow object, .* cross-device ops "
        r"on the \w+ backend; use keras_dist\.HierarchicalCopyAllReduce\(\.\.\.\) with the same arguments\.$",
    ):
        keras_dist.MirroredStrategy(cross_device_ops=HierarchicalCopyAllReduce())
    spec_message = r"tf\.train\.ClusterSpec\(\.\.\.\) .*use keras_dist\.cluster_resolver\.ClusterSpec\(spec\.as_dict\(\)\)"
    for call in (lambda: ClusterSpec(ClusterSpecStandIn()), lambda: SimpleClusterResolver(ClusterSpecStandIn())):
        with pytest.raises(TypeError, match=spec_message):
            call()
    # the wrong kind names what the argument takes
    with pytest.raises(TypeError, match=r"ReduceOp\.SUM .* as cross-device ops .*use keras_dist\.NcclAllReduce\(\)"):
        keras_dist.MirroredStrategy(cross_device_ops=ReduceOp.SUM)
    # not tensorflow's: the argument's own check, as before
    with pytest.raises(ValueError, match="Unknown reduce op"):
        strategy.reduce("max", values, axis=None)
    assert _foreign.accept(keras_dist.ReduceOp.SUM, "reduce_op") is keras_dist.ReduceOp.SUM


# -- JAX: tf's own objects, refused by name ------------------------------------


def _tf_objects():
    import tensorflow as tf

    return [
        (lambda s, v: s.reduce(tf.distribute.ReduceOp.SUM, v, axis=None), "tf.distribute.ReduceOp.SUM", "keras_dist.ReduceOp.SUM"),
        (lambda s, v: _all_reduce_in_run(s, tf.distribute.ReduceOp.MEAN), "tf.distribute.ReduceOp.MEAN", "keras_dist.ReduceOp.MEAN"),
        (
            lambda s, v: keras_dist.MirroredStrategy(cross_device_ops=tf.distribute.HierarchicalCopyAllReduce(num_packs=2)),
            "tf.distribute.HierarchicalCopyAllReduce(...)",
            "keras_dist.HierarchicalCopyAllReduce(...) with the same arguments",
        ),
        (
            lambda s, v: keras_dist.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce()),
            "tf.distribute.NcclAllReduce(...)",
            "keras_dist.NcclAllReduce(...) with the same arguments",
        ),
        (
            lambda s, v: keras_dist.MirroredStrategy(cross_device_ops=tf.distribute.ReductionToOneDevice()),
            "tf.distribute.ReductionToOneDevice(...)",
            "keras_dist.ReductionToOneDevice(...) with the same arguments",
        ),
        (
            lambda s, v: ClusterSpec(tf.train.ClusterSpec({"worker": ["w0:2222"]})),
            "tf.train.ClusterSpec(...)",
            "keras_dist.cluster_resolver.ClusterSpec(spec.as_dict()), or a dict",
        ),
        (
            lambda s, v: SimpleClusterResolver(tf.train.ClusterSpec({"worker": ["w0:2222"]})),
            "tf.train.ClusterSpec(...)",
            "keras_dist.cluster_resolver.ClusterSpec(spec.as_dict()), or a dict",
        ),
        (
            lambda s, v: keras_dist.MultiWorkerMirroredStrategy(tf.distribute.cluster_resolver.TFConfigClusterResolver()),
            "tf.distribute.cluster_resolver.TFConfigClusterResolver(...)",
            "keras_dist.cluster_resolver.TFConfigClusterResolver(...) with the same arguments",
        ),
        (
            lambda s, v: keras_dist.MultiWorkerMirroredStrategy(
                communication_options=tf.distribute.experimental.CommunicationOptions(timeout_seconds=30)
            ),
            "tf.distribute.experimental.CommunicationOptions(...)",
            "keras_dist.CommunicationOptions(...) with the same arguments",
        ),
        (
            lambda s, v: keras_dist.CommunicationOptions(
                implementation=tf.distribute.experimental.CommunicationImplementation.RING
            ),
            "tf.distribute.experimental.CommunicationImplementation.RING",
            "keras_dist.CommunicationImplementation.RING",
        ),
        (
            lambda s, v: keras_dist.cluster_resolver.KubernetesClusterResolver(
                executable_location=tf.distribute.cluster_resolver.KubernetesExecutableLocation.OFF_CLUSTER
            ),
            "tf.distribute.cluster_resolver.KubernetesExecutableLocation.OFF_CLUSTER",
            "keras_dist.cluster_resolver.KubernetesExecutableLocation.OFF_CLUSTER",
        ),
    ]


_CASES = (
    "reduce", "all_reduce", "hierarchical_copy", "nccl", "reduction_to_one_device", "cluster_spec",
    "simple_resolver_spec", "tf_config_resolver", "communication_options", "communication_implementation",
    "kubernetes_executable_location",
)


@pytest.mark.parametrize("case", range(len(_CASES)), ids=_CASES)
@pytest.mark.skipif(BACKEND != "jax", reason="tf objects refused on the JAX backend")
@pytest.mark.needs_tensorflow
def test_jax_refuses_each_tf_object_naming_keras_dist_s(mirrored, case):
    call, tf_name, ours = _tf_objects()[case]
    strategy = mirrored(4)
    values = _per_replica(strategy)
    with pytest.raises(TypeError) as error:
        call(strategy, values)
    assert str(error.value).startswith(f"{tf_name} is a TensorFlow object, which keras_dist cannot take as ")
    assert str(error.value).endswith(f" on the JAX backend; use {ours}.")


# -- TensorFlow: tf's own objects, as keras_dist's -----------------------------


@on_tensorflow
def test_tf_reduce_ops_reduce_as_keras_dist_s(mirrored):
    import tensorflow as tf

    strategy = mirrored(4)
    values = _per_replica(strategy)
    for tf_op, op in ((tf.distribute.ReduceOp.SUM, keras_dist.ReduceOp.SUM), (tf.distribute.ReduceOp.MEAN, keras_dist.ReduceOp.MEAN)):
        assert keras_dist.ReduceOp.from_value(tf_op) is op
        for axis in (None, 0):
            np.testing.assert_array_equal(strategy.reduce(tf_op, values, axis=axis), strategy.reduce(op, values, axis=axis))
        np.testing.assert_array_equal(
            strategy.extended.reduce_to(tf_op, values, "cpu:0"), strategy.extended.reduce_to(op, values, "cpu:0")
        )
        for tf_result, result in zip(_all_reduce_in_run(strategy, tf_op), _all_reduce_in_run(strategy, op)):
            np.testing.assert_array_equal(tf_result, result)
        default = keras_dist.get_strategy()
        np.testing.assert_array_equal(default.reduce(tf_op, np.arange(4.0), axis=0), default.reduce(op, np.arange(4.0), axis=0))
    np.testing.assert_array_equal(strategy.reduce(tf.distribute.ReduceOp.SUM, values, axis=None), [10.0, 20.0])


def _tf_engine_ops(strategy):
    """What the tf.distribute strategy underneath reduces with."""
    return strategy.extended.engine.extended._cross_device_ops


@on_tensorflow
def test_tf_cross_device_ops_become_keras_dist_s():
    """Each tf choice, its arguments kept: the strategy exposes (and its tf
    engine runs) what the keras_dist spelling gives, with the same sums."""
    import tensorflow as tf

    def add(values):
        return tf.math.add_n(values)

    cases = [
        (tf.distribute.HierarchicalCopyAllReduce(num_packs=2), keras_dist.HierarchicalCopyAllReduce(num_packs=2)),
        (tf.distribute.HierarchicalCopyAllReduce(num_packs=0), keras_dist.HierarchicalCopyAllReduce(num_packs=0)),
        (tf.distribute.ReductionToOneDevice(), keras_dist.ReductionToOneDevice()),
        (
            tf.distribute.ReductionToOneDevice(reduce_to_device="/job:localhost/replica:0/task:0/device:CPU:1", accumulation_fn=add),
            keras_dist.ReductionToOneDevice(reduce_to_device="cpu:1", accumulation_fn=add),
        ),
    ]
    devices = [f"cpu:{i}" for i in range(4)]
    for tf_ops, ops in cases:
        ported = keras_dist.MirroredStrategy(devices, cross_device_ops=tf_ops)
        ours = keras_dist.MirroredStrategy(devices, cross_device_ops=ops)
        assert ported.extended.cross_device_ops == ops, (tf_ops, ported.extended.cross_device_ops)
        engine_ops, expected = _tf_engine_ops(ported), _tf_engine_ops(ours)
        assert type(engine_ops) is type(expected) is type(tf_ops)
        assert {k: v for k, v in vars(engine_ops).items() if k != "_simple_cross_replica_ops"} == {
            k: v for k, v in vars(expected).items() if k != "_simple_cross_replica_ops"
        }
        for a, b in zip(_all_reduce_in_run(ported, keras_dist.ReduceOp.SUM), _all_reduce_in_run(ours, keras_dist.ReduceOp.SUM)):
            np.testing.assert_array_equal(a, b)
    # tf's NCCL needs GPUs as keras_dist's does: the same error
    errors = []
    for ops in (tf.distribute.NcclAllReduce(num_packs=1), keras_dist.NcclAllReduce(num_packs=1)):
        with pytest.raises(ValueError) as error:
            keras_dist.MirroredStrategy(devices, cross_device_ops=ops)
        errors.append(str(error.value))
    assert errors[0] == errors[1] and "needs GPUs" in errors[0]


@on_tensorflow
def test_tf_cluster_specs_become_keras_dist_s():
    import tensorflow as tf

    cluster = {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"], "ps": {0: "p0:2222", 2: "p2:2222"}}
    spec = ClusterSpec(tf.train.ClusterSpec(cluster))
    assert isinstance(spec, ClusterSpec) and spec == ClusterSpec(cluster)
    assert spec.as_dict() == ClusterSpec(cluster).as_dict()
    ported = SimpleClusterResolver(tf.train.ClusterSpec(cluster), task_type="worker", task_id=1)
    ours = SimpleClusterResolver(cluster, task_type="worker", task_id=1)
    assert ported.cluster_spec() == ours.cluster_spec()
    assert (ported.num_workers, ported.worker_index, ported.is_chief, ported.chief_address) == (3, 2, False, "c:2222")
    assert not ClusterSpec(tf.train.ClusterSpec({}))


def _facts(resolver):
    return (
        resolver.cluster_spec().as_dict(), resolver.task_type, resolver.task_id, resolver.rpc_layer,
        resolver.environment, resolver.master(), resolver.num_workers, resolver.worker_index, resolver.is_chief,
        resolver.num_accelerators(),
    )


@on_tensorflow
def test_tf_cluster_resolvers_become_keras_dist_s(monkeypatch):
    import tensorflow as tf

    tf_resolvers = tf.distribute.cluster_resolver
    monkeypatch.setenv("TF_CONFIG", json.dumps({
        "cluster": {"chief": ["c:2222"], "worker": ["w0:2222", "w1:2222"]},
        "task": {"type": "worker", "index": 1}, "rpc_layer": "grpc",
    }))
    ported = _foreign.accept(tf_resolvers.TFConfigClusterResolver(), "cluster_resolver")
    assert isinstance(ported, TFConfigClusterResolver)
    assert _facts(ported) == _facts(TFConfigClusterResolver())
    assert _facts(ported)[6:8] == (3, 2)
    overridden = _foreign.accept(tf_resolvers.TFConfigClusterResolver(task_type="chief", task_id=0), "cluster_resolver")
    assert _facts(overridden) == _facts(TFConfigClusterResolver(task_type="chief", task_id=0))

    cluster = {"worker": ["w0:2222", "w1:2222"]}
    simple = tf_resolvers.SimpleClusterResolver(
        tf.train.ClusterSpec(cluster), master="w0:2222", task_type="worker", task_id=1,
        environment="google", num_accelerators={"GPU": 2}, rpc_layer="grpc",
    )
    ported = _foreign.accept(simple, "cluster_resolver")
    ours = SimpleClusterResolver(
        cluster, master="w0:2222", task_type="worker", task_id=1,
        environment="google", num_accelerators={"GPU": 2}, rpc_layer="grpc",
    )
    assert isinstance(ported, SimpleClusterResolver) and _facts(ported) == _facts(ours)
    assert ported.master() == simple.master() == "grpc://w0:2222"

    # where a resolver is taken: a single-worker job (TF_CONFIG unset)
    monkeypatch.delenv("TF_CONFIG")
    strategy = keras_dist.MultiWorkerMirroredStrategy(tf_resolvers.TFConfigClusterResolver())
    assert isinstance(strategy.cluster_resolver, TFConfigClusterResolver)
    assert isinstance(strategy.extended.cluster_resolver, TFConfigClusterResolver)
    assert strategy.extended.num_workers == 1
    keras_dist.tpu.experimental.initialize_tpu_system(tf_resolvers.SimpleClusterResolver(tf.train.ClusterSpec({})))

    # tf's TPU resolver (made without a TPU): keras_dist's own is named
    tpu = tf_resolvers.TPUClusterResolver.__new__(tf_resolvers.TPUClusterResolver)
    for call in (lambda: keras_dist.TPUStrategy(tpu), lambda: keras_dist.tpu.experimental.initialize_tpu_system(tpu)):
        with pytest.raises(
            TypeError,
            match=r"^tf\.distribute\.cluster_resolver\.TPUClusterResolver\(\.\.\.\) is a TensorFlow object, .*"
            r"on the TensorFlow backend; use keras_dist\.cluster_resolver\.TPUClusterResolver\(\.\.\.\) with the same arguments\.$",
        ):
            call()


@on_tensorflow
def test_tf_communication_options_become_keras_dist_s():
    import tensorflow as tf

    experimental = tf.distribute.experimental
    for name in ("AUTO", "RING", "NCCL"):
        implementation = getattr(experimental.CommunicationImplementation, name)
        ours = keras_dist.CommunicationOptions(bytes_per_pack=1024, timeout_seconds=30.0,
                                               implementation=getattr(keras_dist.CommunicationImplementation, name))
        ported = _foreign.accept(
            experimental.CommunicationOptions(bytes_per_pack=1024, timeout_seconds=30.0, implementation=implementation),
            "communication_options",
        )
        assert ported == ours
        assert keras_dist.CommunicationOptions(bytes_per_pack=1024, timeout_seconds=30.0, implementation=implementation) == ours
    strategy = keras_dist.MultiWorkerMirroredStrategy(
        communication_options=experimental.CommunicationOptions(timeout_seconds=30, implementation=experimental.CommunicationImplementation.RING)
    )
    assert strategy.extended.communication_options == keras_dist.CommunicationOptions(
        timeout_seconds=30, implementation=keras_dist.CommunicationImplementation.RING
    )
    with pytest.raises(ValueError, match="timeout_seconds"):  # keras_dist's own checks still run
        _foreign.accept(experimental.CommunicationOptions(timeout_seconds=-1), "communication_options")
