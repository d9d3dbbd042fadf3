"""TensorFlow's own objects where keras_dist takes its own (ported code).

Code ported from tf.distribute often still holds tf objects:
`tf.distribute.ReduceOp.SUM`, a `tf.train.ClusterSpec`, tf's cluster
resolvers, `tf.distribute.experimental.CommunicationOptions`, a
`tf.distribute.NcclAllReduce()`. `accept(value, kind)` is the one place that
takes them: a value whose type comes from the `tensorflow` package
(recognised by its type's module, importing nothing) is handed to the
backend adapter's `from_backend_object`, which returns the keras_dist object
of `kind` (the TensorFlow adapter translates tf's objects; the JAX adapter
has nothing to translate). Where it returns None, one error names the
keras_dist spelling to use. Any other value comes back unchanged, for the
caller's own checks.

Standard library only: the adapter is imported when a tf object is seen.
`keras_dist.cluster_resolver` (which imports nothing of keras_dist's) is
lent `accept` here, on import: `import keras_dist` imports this module.

>>> accept("SUM", "reduce_op")
'SUM'
"""

from __future__ import annotations

import enum
from typing import Any

#: kind -> (what the argument is, the keras_dist spelling to use instead).
KINDS = {
    "reduce_op": ("a reduce op", "keras_dist.ReduceOp.SUM or keras_dist.ReduceOp.MEAN"),
    "cluster_spec": ("a cluster spec", "keras_dist.cluster_resolver.ClusterSpec(spec.as_dict()), or a dict"),
    "cluster_resolver": (
        "a cluster resolver",
        "a keras_dist.cluster_resolver resolver (TFConfigClusterResolver(), SimpleClusterResolver(...), ...)",
    ),
    "communication_options": ("communication options", "keras_dist.CommunicationOptions(...) with the same arguments"),
    "communication_implementation": (
        "a communication implementation",
        "keras_dist.CommunicationImplementation.AUTO, .RING or .NCCL",
    ),
    "cross_device_ops": (
        "cross-device ops",
        "keras_dist.NcclAllReduce(), keras_dist.HierarchicalCopyAllReduce() or keras_dist.ReductionToOneDevice()",
    ),
    "checkpoint": (
        "a checkpoint",
        "a Keras model (saved with its optimizer's state) or an object with save(path) and restore(path) methods",
    ),
    "executable_location": (
        "a Kubernetes executable location",
        "keras_dist.cluster_resolver.KubernetesExecutableLocation.WITHIN_CLUSTER or .OFF_CLUSTER",
    ),
    "termination_config": (
        "a termination config",
        "keras_dist.experimental.TerminationConfig(...) with the same arguments",
    ),
}

#: tf class name -> (kind, tf's public spelling, keras_dist's or "" for the
#: kind's), for the error.
_TF_CLASSES = {
    "ReduceOp": ("reduce_op", "tf.distribute.ReduceOp", "keras_dist.ReduceOp"),
    "ClusterSpec": ("cluster_spec", "tf.train.ClusterSpec", ""),  # KINDS' spelling: ClusterSpec(spec.as_dict())
    "Options": (
        "communication_options",
        "tf.distribute.experimental.CommunicationOptions",
        "keras_dist.CommunicationOptions",
    ),
    "CommunicationImplementation": (
        "communication_implementation",
        "tf.distribute.experimental.CommunicationImplementation",
        "keras_dist.CommunicationImplementation",
    ),
    **{
        name: ("cross_device_ops", f"tf.distribute.{name}", f"keras_dist.{name}")
        for name in ("NcclAllReduce", "HierarchicalCopyAllReduce", "ReductionToOneDevice")
    },
    "Checkpoint": ("checkpoint", "tf.train.Checkpoint", ""),
    "CheckpointManager": ("checkpoint", "tf.train.CheckpointManager", ""),
    "ExecutableLocation": (
        "executable_location",
        "tf.distribute.cluster_resolver.KubernetesExecutableLocation",
        "keras_dist.cluster_resolver.KubernetesExecutableLocation",
    ),
    "TerminationConfig": (
        "termination_config",
        "tf.distribute.experimental.TerminationConfig",
        "keras_dist.experimental.TerminationConfig",
    ),
    **{
        name: ("cluster_resolver", f"tf.distribute.cluster_resolver.{name}", f"keras_dist.cluster_resolver.{name}")
        for name in (
            "TFConfigClusterResolver", "SimpleClusterResolver", "SlurmClusterResolver", "TPUClusterResolver",
            "KubernetesClusterResolver", "GCEClusterResolver", "UnionResolver",
        )
    },
}

_BACKENDS = {"jax": "JAX", "tensorflow": "TensorFlow"}


def is_tensorflow_object(value: Any) -> bool:
    """Whether `value`'s type comes from the `tensorflow` package (read from
    the type's module: nothing is imported)."""
    module = getattr(type(value), "__module__", None) or ""
    return module == "tensorflow" or module.startswith("tensorflow.")


def accept(value: Any, kind: str) -> Any:
    """`value`, or keras_dist's own object of `kind` for a TensorFlow one.

    Raises TypeError, naming the keras_dist spelling, for a TensorFlow
    object the running backend's adapter does not translate into `kind`.
    """
    if kind not in KINDS:
        raise ValueError(f"Unknown kind {kind!r}; one of {sorted(KINDS)}.")  # a keras_dist bug
    if not is_tensorflow_object(value):
        return value
    from keras_dist.backends import get_adapter

    adapter = get_adapter()
    translated = None if adapter.from_backend_object is None else adapter.from_backend_object(value, kind)
    if translated is not None:
        return translated
    what, instead = KINDS[kind]
    tf_name, ours = _spellings(value, kind)
    backend = _BACKENDS.get(adapter.name, adapter.name)
    raise TypeError(
        f"{tf_name} is a TensorFlow object, which keras_dist cannot take as "
        f"{what} on the {backend} backend; use {ours or instead}."
    )


def _spellings(value: Any, kind: str) -> tuple[str, str]:
    """(tf's public spelling of `value`, keras_dist's for it or "")."""
    cls = type(value)
    known = _TF_CLASSES.get(cls.__name__)
    if known is None:
        return f"{cls.__module__}.{cls.__qualname__}", ""
    known_kind, tf_name, ours = known
    if isinstance(value, enum.Enum):  # ReduceOp.SUM, CommunicationImplementation.RING
        tf_name, ours = f"{tf_name}.{value.name}", f"{ours}.{value.name}"
    else:
        tf_name, ours = f"{tf_name}(...)", ours and f"{ours}(...) with the same arguments"
    return tf_name, ours if known_kind == kind else ""


def _lend_to_cluster_resolver() -> None:
    """`keras_dist.cluster_resolver.ClusterSpec` and `SimpleClusterResolver`
    take a `tf.train.ClusterSpec` through `accept` too."""
    from keras_dist.cluster_resolver import _cluster_spec

    _cluster_spec.accept_foreign = accept


_lend_to_cluster_resolver()
