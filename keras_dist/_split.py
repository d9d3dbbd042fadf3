"""How a global batch is split across replicas: arithmetic on ints, or on a
backend's integer tensors where a size is known only as the step runs."""

from __future__ import annotations


def shard_sizes(global_size: int, num_replicas: int) -> list[int]:
    """Balanced split: sizes differ by at most one, larger shards first.

    >>> shard_sizes(10, 4)
    [3, 3, 2, 2]
    >>> shard_sizes(2, 4)
    [1, 1, 0, 0]
    """
    if num_replicas <= 0:
        raise ValueError(f"num_replicas must be positive, got {num_replicas}.")
    if global_size < 0:
        raise ValueError(f"global_size must be >= 0, got {global_size}.")
    base, extra = divmod(global_size, num_replicas)
    return [base + (1 if r < extra else 0) for r in range(num_replicas)]


def shard_bounds(global_size: int, num_replicas: int) -> list[tuple[int, int]]:
    """``[start, stop)`` of each replica's contiguous rows, in replica order.

    >>> shard_bounds(10, 4)
    [(0, 3), (3, 6), (6, 8), (8, 10)]
    """
    bounds, start = [], 0
    for size in shard_sizes(global_size, num_replicas):
        bounds.append((start, start + size))
        start += size
    return bounds


def replica_shard(global_size, num_replicas: int, replica):
    """``(start, size)`` of `replica`'s rows, as `shard_bounds` splits them,
    for sizes known only as the step runs: `global_size` and `replica` may
    be integer scalar tensors of the backend (a traced batch size).

    >>> replica_shard(10, 4, 2)
    (6, 2)
    """
    if isinstance(global_size, int) and isinstance(replica, int):
        begin, end = shard_bounds(global_size, num_replicas)[replica]
        return begin, end - begin
    import keras
    from keras import ops

    base, extra = global_size // num_replicas, global_size % num_replicas
    start = replica * base + ops.minimum(replica, extra)
    dtype = keras.backend.standardize_dtype(getattr(base, "dtype", "int32"))
    return start, base + ops.cast(ops.less(replica, extra), dtype)


def per_replica_batch_size(global_batch_size: int, num_replicas: int) -> int:
    """Per-replica batch size; the global batch must divide evenly.

    >>> per_replica_batch_size(64, 4)
    16
    """
    validate_batch_size(global_batch_size)
    if global_batch_size % num_replicas:
        raise ValueError(
            f"The global batch size {global_batch_size} is not divisible by "
            f"the {num_replicas} replicas in sync. keras_dist's own input "
            "pipeline handles uneven batches exactly; when computing a "
            "per-replica size yourself, pick a multiple of the replica count."
        )
    return global_batch_size // num_replicas


def validate_batch_size(batch_size, name: str = "batch_size") -> None:
    """Raises a clear error for a non-positive or non-integer batch size."""
    if batch_size is None:
        return
    if isinstance(batch_size, bool) or not isinstance(batch_size, int):
        try:
            import numpy as np

            if isinstance(batch_size, np.integer):
                batch_size = int(batch_size)
            else:
                raise TypeError
        except TypeError:
            raise ValueError(
                f"`{name}` must be a positive integer, got {batch_size!r}."
            ) from None
    if batch_size <= 0:
        raise ValueError(
            f"`{name}` must be a positive integer, got {batch_size}. It is "
            "the global batch size: it is split across the replicas in sync."
        )
