"""`keras_dist.experimental.partitioners`: how many shards a variable splits
into along one axis, with tf.distribute.experimental.partitioners' exact
arithmetic (pure Python; tf's own are the oracle in the tests).

A partitioner is called with ``(shape, dtype, axis=0)`` and returns one
count per axis, all 1 except `axis`.

>>> FixedShardsPartitioner(num_shards=2)((10, 3), "float32")
[2, 1]
>>> MinSizePartitioner(min_shard_bytes=4, max_shards=10)((6, 1), "float32")
[6, 1]
>>> MaxSizePartitioner(max_shard_bytes=4, max_shards=2)((6, 1), "float32")
[2, 1]
"""

from __future__ import annotations

import math
from typing import Any, Optional

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner"]

#: bytes per element of dtypes numpy does not name
_SIZES = {"bfloat16": 2, "float8_e4m3fn": 1, "float8_e5m2": 1, "bool": 1}


def _dims(shape: Any) -> list:
    """A shape (tuple, list, tf.TensorShape) as a list of ints (None unknown)."""
    if hasattr(shape, "as_list"):
        if getattr(shape, "rank", 0) is None:
            raise ValueError(f"shape is not fully defined: {shape}")
        return list(shape.as_list())
    return [None if d is None else int(d) for d in shape]


def _is_string(dtype: Any) -> bool:
    name = getattr(dtype, "name", dtype)
    return str(name) in ("string", "str", "object")


def _element_size(dtype: Any, bytes_per_string: int) -> int:
    if _is_string(dtype):
        return bytes_per_string
    size = getattr(dtype, "size", None)
    if isinstance(size, int):
        return size
    name = str(getattr(dtype, "name", dtype))
    if name in _SIZES:
        return _SIZES[name]
    import numpy as np

    return np.dtype(name).itemsize


class Partitioner:
    """Base class: ``partitioner(shape, dtype, axis=0) -> [shards per axis]``."""

    def __call__(self, shape, dtype, axis: int = 0) -> list:
        raise NotImplementedError


class FixedShardsPartitioner(Partitioner):
    """`num_shards` shards (at most one per row of the axis).

    >>> FixedShardsPartitioner(num_shards=4)((3, 5), "float32")
    [3, 1]
    """

    def __init__(self, num_shards: int):
        self._num_shards = num_shards

    def __call__(self, shape, dtype, axis: int = 0) -> list:
        del dtype
        dims = _dims(shape)
        result = [1] * len(dims)
        result[axis] = min(self._num_shards, dims[axis])
        return result

    def __repr__(self) -> str:
        return f"FixedShardsPartitioner(num_shards={self._num_shards})"


class MinSizePartitioner(Partitioner):
    """As many shards as keep each at least `min_shard_bytes`, at most `max_shards`."""

    def __init__(self, min_shard_bytes: int = 256 << 10, max_shards: int = 1, bytes_per_string: int = 16):
        if min_shard_bytes < 1:
            raise ValueError(f"Argument `min_shard_bytes` must be positive. Received: {min_shard_bytes}")
        if max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received: {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: {bytes_per_string}")
        self._min_shard_bytes = min_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape, dtype, axis: int = 0) -> list:
        dims = _dims(shape)
        if axis >= len(dims):
            raise ValueError(f"Cannot partition variable along axis {axis} when shape is only {shape}")
        total = math.prod(dims) * _element_size(dtype, self._bytes_per_string)
        partitions = total / self._min_shard_bytes
        result = [1] * len(dims)
        result[axis] = max(1, min(dims[axis], self._max_shards, int(math.ceil(partitions))))
        return result

    def __repr__(self) -> str:
        return f"MinSizePartitioner(min_shard_bytes={self._min_shard_bytes}, max_shards={self._max_shards})"


class MaxSizePartitioner(Partitioner):
    """As few shards as keep each at most `max_shard_bytes` (`max_shards`
    takes precedence when given)."""

    def __init__(self, max_shard_bytes: int, max_shards: Optional[int] = None, bytes_per_string: int = 16):
        if max_shard_bytes < 1:
            raise ValueError(f"Argument `max_shard_bytes` must be positive. Received {max_shard_bytes}")
        if max_shards and max_shards < 1:
            raise ValueError(f"Argument `max_shards` must be positive. Received {max_shards}")
        if bytes_per_string < 1:
            raise ValueError(f"Argument `bytes_per_string` must be positive. Received: {bytes_per_string}")
        self._max_shard_bytes = max_shard_bytes
        self._max_shards = max_shards
        self._bytes_per_string = bytes_per_string

    def __call__(self, shape, dtype, axis: int = 0) -> list:
        dims = _dims(shape)
        if any(d is None for d in dims):
            raise ValueError(f"shape is not fully defined: {shape}")
        element = _element_size(dtype, self._bytes_per_string)
        result = [1] * len(dims)
        bytes_per_slice = 1.0 * (math.prod(dims) / dims[axis]) * element
        slices_per_shard = max(1, math.floor(self._max_shard_bytes / bytes_per_slice))
        shards = int(math.ceil(1.0 * dims[axis] / slices_per_shard))
        if self._max_shards:
            shards = min(self._max_shards, shards)
        result[axis] = shards
        return result

    def __repr__(self) -> str:
        return f"MaxSizePartitioner(max_shard_bytes={self._max_shard_bytes}, max_shards={self._max_shards})"
