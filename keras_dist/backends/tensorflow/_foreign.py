"""tf.distribute's own objects, as keras_dist's (ported code keeps them).

`from_backend_object(value, kind)` gives the keras_dist object of `kind`
for a TensorFlow one (`keras_dist._foreign.accept` asks, having found a
value whose type comes from `tensorflow`), or None where keras_dist has no
translation: the core then raises, naming the keras_dist spelling.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import tensorflow as tf
from tensorflow.python.distribute import collective_util

from keras_dist import _communication, _cross_device_ops
from keras_dist.backends.tensorflow import _checkpoint
from keras_dist._reduce import ReduceOp
from keras_dist.cluster_resolver import ClusterSpec, SimpleClusterResolver, TFConfigClusterResolver

_tf_resolvers = tf.distribute.cluster_resolver


def _reduce_op(value) -> Optional[ReduceOp]:
    if isinstance(value, tf.distribute.ReduceOp):
        return ReduceOp[value.name]
    return None


def _cluster_spec(value) -> Optional[ClusterSpec]:
    if isinstance(value, tf.train.ClusterSpec):
        return ClusterSpec(value.as_dict())
    return None


def _cluster_resolver(value) -> Any:
    """tf's TF_CONFIG and simple resolvers, through their public API: the
    task tf reads now (TF_CONFIG's, or the one given to tf's constructor)
    overrides TF_CONFIG's in keras_dist's, which reads the cluster itself.
    Others (TPU, Slurm, ...) get the core's error naming keras_dist's own."""
    if isinstance(value, _tf_resolvers.TFConfigClusterResolver):
        return TFConfigClusterResolver(
            task_type=value.task_type,
            task_id=value.task_id,
            rpc_layer=value.rpc_layer,
            environment=value.environment,
        )
    if isinstance(value, _tf_resolvers.SimpleClusterResolver):
        rpc_layer = value.rpc_layer
        master = value.master()  # formatted with the rpc layer, as keras_dist's will
        if rpc_layer and master.startswith(f"{rpc_layer}://"):
            master = master[len(rpc_layer) + 3 :]
        return SimpleClusterResolver(
            ClusterSpec(value.cluster_spec().as_dict()),
            master=master,
            task_type=value.task_type,
            task_id=value.task_id,
            environment=value.environment or "",
            num_accelerators=value.num_accelerators() or None,
            rpc_layer=rpc_layer,
        )
    return None


def _communication_implementation(value) -> Optional[_communication.CommunicationImplementation]:
    if isinstance(value, tf.distribute.experimental.CommunicationImplementation):
        return _communication.CommunicationImplementation[value.name]
    return None


def _communication_options(value) -> Optional[_communication.CommunicationOptions]:
    if isinstance(value, collective_util.Options):  # tf.distribute.experimental.CommunicationOptions()
        return _communication.CommunicationOptions(
            bytes_per_pack=value.bytes_per_pack,
            timeout_seconds=value.timeout_seconds,
            implementation=_communication_implementation(value.implementation),
        )
    return None


def _cross_device(value) -> Optional[_cross_device_ops.CrossDeviceOps]:
    """tf's three choices, their arguments kept (tf holds `num_packs` as
    `_num_packs`); tf's default `accumulation_fn` (`tf.math.add_n`) is
    keras_dist's default, None."""
    for tf_class in (tf.distribute.NcclAllReduce, tf.distribute.HierarchicalCopyAllReduce):
        if isinstance(value, tf_class):
            return getattr(_cross_device_ops, tf_class.__name__)(num_packs=value._num_packs)
    if isinstance(value, tf.distribute.ReductionToOneDevice):
        accumulation_fn = value.accumulation_fn
        return _cross_device_ops.ReductionToOneDevice(
            reduce_to_device=value.reduce_to_device,
            accumulation_fn=None if accumulation_fn is tf.math.add_n else accumulation_fn,
        )
    return None


def _executable_location(value) -> Any:
    if isinstance(value, tf.distribute.cluster_resolver.KubernetesExecutableLocation):
        from keras_dist.cluster_resolver import KubernetesExecutableLocation

        return KubernetesExecutableLocation[value.name]
    return None


_TRANSLATIONS: dict[str, Callable[[Any], Any]] = {
    "reduce_op": _reduce_op,
    "cluster_spec": _cluster_spec,
    "cluster_resolver": _cluster_resolver,
    "communication_options": _communication_options,
    "communication_implementation": _communication_implementation,
    "cross_device_ops": _cross_device,
    "checkpoint": _checkpoint.checkpoint_store,
    "termination_config": _checkpoint.termination_config,
    "executable_location": _executable_location,
}


def from_backend_object(value, kind):
    """keras_dist's object of `kind` for the TensorFlow object `value`, or None."""
    translate = _TRANSLATIONS.get(kind)
    return None if translate is None else translate(value)
