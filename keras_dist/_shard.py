"""Which rows of the global batch the replica step being traced holds.

Per-replica steps (TensorFlow's, and JAX's in multi-process CPU jobs) run
Keras' own step on one replica's rows. While one is traced, the loss hooks
ask `scale_factor` for this replica's share of the global batch:

    with shard_scope(Shard(local_rows=4, global_rows=10)):
        ...   # scale_factor("float32") is 0.4 here, None outside
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

from keras import ops

_local = threading.local()


class Shard:
    """Row counts (integers or integer scalar tensors) of one replica's step."""

    def __init__(self, local_rows: Any, global_rows: Any, start: Any = None, replicas: int = 1):
        self.local_rows = local_rows
        self.global_rows = global_rows
        #: This replica's first row in the global batch (None: not known).
        self.start = start
        #: How many replicas the global batch is split over (a Python int).
        self.replicas = replicas


@contextlib.contextmanager
def shard_scope(shard: Shard) -> Iterator[None]:
    previous = getattr(_local, "shard", None)
    _local.shard = shard
    try:
        yield
    finally:
        _local.shard = previous


def current():
    """The `Shard` of the replica step being traced, or None."""
    return getattr(_local, "shard", None)


def in_replica_step() -> bool:
    return getattr(_local, "shard", None) is not None


def scale_factor(dtype):
    """This replica's rows / global rows, or None outside a replica step."""
    shard = getattr(_local, "shard", None)
    if shard is None:
        return None
    # the counts cast to the loss's dtype before dividing: a float64 loss
    # gets a float64 share (a float32 one is 1e-8 off: a float64 model's
    # step would be too)
    return ops.divide_no_nan(ops.cast(shard.local_rows, dtype), ops.cast(shard.global_rows, dtype))


def unscale_factor(dtype):
    """Global rows / this replica's rows, or None outside a replica step."""
    shard = getattr(_local, "shard", None)
    if shard is None:
        return None
    return ops.divide_no_nan(ops.cast(shard.global_rows, dtype), ops.cast(shard.local_rows, dtype))
