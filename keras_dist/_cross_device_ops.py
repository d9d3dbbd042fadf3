"""Cross-device ops: how `MirroredStrategy` sums values across replicas.

tf.distribute's names and signatures, as backend-agnostic values; each
backend adapter turns them into what its engine really does (see
`guides/distributed_training.md`, "Choosing cross-device ops"):

- TensorFlow: the `tf.distribute` class of the same name, handed to the
  `tf.distribute.MirroredStrategy` underneath; it reduces the gradients,
  metric variables and BatchNormalization moments of every step.
- JAX: XLA inserts one kind of collective, the all-reduce, and picks its
  algorithm itself (NCCL on GPUs); what a choice sets is how the
  all-reduces of one step are packed: ``num_packs=1`` combines them into
  one all-reduce (XLA's default), ``num_packs=0`` and `ReductionToOneDevice`
  keep one all-reduce per tensor.

On the TensorFlow backend tf.distribute's own three (ported code) are
taken too, as the keras_dist one of the same name and arguments.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

from keras_dist import _devices, _foreign

__all__ = [
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "NcclAllReduce",
    "ReductionToOneDevice",
]

_CHOICES = "keras_dist.NcclAllReduce(), keras_dist.HierarchicalCopyAllReduce() or keras_dist.ReductionToOneDevice()"


class CrossDeviceOps:
    """Base class of the cross-device reduction choices.

    Pass one of its subclasses as `MirroredStrategy(cross_device_ops=...)`;
    ``None`` lets the backend's engine choose.

    ```python
    strategy = keras_dist.MirroredStrategy(
        cross_device_ops=keras_dist.HierarchicalCopyAllReduce(num_packs=1)
    )
    ```
    """

    _FIELDS: tuple[str, ...] = ()

    def __init__(self) -> None:
        if type(self) is CrossDeviceOps:
            raise TypeError(
                f"CrossDeviceOps is the base class; create one of {_CHOICES}."
            )

    def _values(self) -> tuple:
        return tuple(getattr(self, name) for name in self._FIELDS)

    def __eq__(self, other: Any) -> bool:
        return type(other) is type(self) and other._values() == self._values()

    def __hash__(self) -> int:
        return hash((type(self).__name__,) + self._values())

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._FIELDS)
        return f"{type(self).__name__}({fields})"


def _check_num_packs(num_packs: Any, owner: str) -> int:
    if isinstance(num_packs, bool) or not isinstance(num_packs, int) or num_packs < 0:
        raise ValueError(
            f"{owner}(num_packs=...) must be an integer >= 0 (0: no packing, "
            f"one all-reduce per tensor; 1: all in one pack), got {num_packs!r}."
        )
    return num_packs


class _PackedAllReduce(CrossDeviceOps):
    _FIELDS = ("num_packs",)

    def __init__(self, num_packs: int = 1) -> None:
        self._num_packs = _check_num_packs(num_packs, type(self).__name__)

    @property
    def num_packs(self) -> int:
        """Packs the tensors of one all-reduce are concatenated into (0: none)."""
        return self._num_packs


class NcclAllReduce(_PackedAllReduce):
    """All-reduce with NVIDIA NCCL (GPUs only), tensors packed into `num_packs`.

    TensorFlow: `tf.distribute.NcclAllReduce(num_packs)`. JAX: XLA's
    all-reduce, which XLA runs with NCCL on GPUs; `num_packs` 1 (one fused
    all-reduce per step) or 0 (one per tensor). Every device of the strategy
    must be a GPU.

    ```python
    ops = keras_dist.NcclAllReduce(num_packs=1)
    ```
    """


class HierarchicalCopyAllReduce(_PackedAllReduce):
    """Hierarchical copy all-reduce, tensors packed into `num_packs`.

    TensorFlow: `tf.distribute.HierarchicalCopyAllReduce(num_packs)` (sums
    within two halves of the devices, then across them, then copies back;
    made for 8-GPU DGX-1 machines, works on any even number of devices, CPU
    ones included). JAX: XLA's all-reduce with `num_packs` 1 or 0; the
    algorithm is XLA's own.

    ```python
    ops = keras_dist.HierarchicalCopyAllReduce(num_packs=0)
    ```
    """


class ReductionToOneDevice(CrossDeviceOps):
    """Sums every tensor on one device, then copies the sum back.

    TensorFlow: `tf.distribute.ReductionToOneDevice`: each tensor is copied
    to `reduce_to_device` (default: the first replica's device), summed
    there with `accumulation_fn` (default `tf.math.add_n`) and broadcast.
    JAX: XLA has no reduce-to-one-device collective; every tensor gets its
    own all-reduce (no packing), so both arguments must stay ``None``.

    ```python
    ops = keras_dist.ReductionToOneDevice(reduce_to_device="cpu:0")
    ```
    """

    _FIELDS = ("reduce_to_device", "accumulation_fn")

    def __init__(
        self,
        reduce_to_device: Optional[str] = None,
        accumulation_fn: Optional[Callable] = None,
    ) -> None:
        if reduce_to_device is not None:
            reduce_to_device = _devices.canonical_device(reduce_to_device)
        if accumulation_fn is not None and not callable(accumulation_fn):
            raise TypeError(
                "ReductionToOneDevice(accumulation_fn=...) must be a callable "
                "that sums a list of tensors (TensorFlow: e.g. tf.math.add_n), "
                f"or None; got {accumulation_fn!r}."
            )
        self._reduce_to_device = reduce_to_device
        self._accumulation_fn = accumulation_fn

    @property
    def reduce_to_device(self) -> Optional[str]:
        """Canonical name of the device that sums, or None (the first replica's)."""
        return self._reduce_to_device

    @property
    def accumulation_fn(self) -> Optional[Callable]:
        """The function that sums a list of tensors, or None (the default)."""
        return self._accumulation_fn


def validate(value: Any, devices: Sequence[str]) -> Optional[CrossDeviceOps]:
    """`value` as a cross-device ops choice for `devices`, or a clear error."""
    if value is None:
        return None
    value = _foreign.accept(value, "cross_device_ops")  # TensorFlow: tf.distribute's own
    if type(value) not in (NcclAllReduce, HierarchicalCopyAllReduce, ReductionToOneDevice):
        raise TypeError(
            f"cross_device_ops must be one of {_CHOICES}, or None to let the "
            f"engine choose; got {value!r}."
        )
    if isinstance(value, NcclAllReduce):
        not_gpu = [d for d in devices if not d.startswith("gpu:")]
        if not_gpu:
            raise ValueError(
                f"NcclAllReduce runs NCCL, which needs GPUs; this strategy's "
                f"devices include {not_gpu}. On these devices use "
                "keras_dist.HierarchicalCopyAllReduce(num_packs=...), "
                "keras_dist.ReductionToOneDevice(), or cross_device_ops=None "
                "(the engine's default)."
            )
    return value
