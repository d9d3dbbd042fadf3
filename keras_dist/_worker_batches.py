"""The job's global batches when each worker reads its own stream.

With tf.data's AutoShardPolicy FILE, OFF or HINT (`keras_dist._tf_data`)
each worker reads a stream of its own, and a step's global batch is every
worker's rows, in worker order: `WorkerBatches` makes them, one all-gather
of the backend's a step (`values_from_every_worker`), rows packed as 32-bit
words so every dtype arrives bit for bit. `worker_streams` says, while
`fit`/`evaluate`/`predict` runs, which step kinds read such streams
(`keras_dist._hooks._entry` sets it, `_hooks._steps` reads it).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator, Optional


class WorkerBatches:
    """The job's global batches when each worker reads its own stream
    (`keras_dist._tf_data`: AutoShardPolicy FILE, OFF or HINT).

    Each step every worker takes the next batch of its stream (none once
    it has ended), and the step's global batch is every worker's rows, in
    worker order, on every worker: one all-gather of the backend's
    (`values_from_every_worker`) of the row counts and the rows padded to
    `max_rows` (two, counts first, where no bound is known). The data
    ends for all workers at once, when none has a batch left, so a worker
    whose stream is shorter keeps joining the others' steps.

    `empty`: a batch of 0 rows of the stream's structure and dtypes;
    `max_rows`: the most rows a worker's batch can have, or None.
    """

    def __init__(self, local: Iterator, empty: Any, max_rows: Optional[int] = None):
        self._local = local
        self._empty = empty
        self._max_rows = max_rows

    def __iter__(self) -> "WorkerBatches":
        return self

    def __next__(self) -> Any:
        try:
            batch = next(self._local)
        except StopIteration:
            batch = None
        combined = combine_worker_batches(batch, self._empty, self._max_rows)
        if combined is None:
            raise StopIteration
        return combined


def combine_worker_batches(batch: Any, empty: Any, max_rows: Optional[int] = None) -> Any:
    """Every worker's `batch` (None: this worker has none) concatenated in
    worker order, on every worker; None when no worker has rows. A
    worker's batch travels as one buffer of 32-bit words (its row count,
    then each part's raw bytes), so every dtype arrives exactly. With
    `max_rows` (the most any worker's batch has) one all-gather carries
    the counts and the rows; without, the counts go first."""
    import keras
    import numpy as np

    from keras_dist.backends import get_adapter

    adapter = get_adapter()
    structure = empty if batch is None else batch
    leaves = [np.asarray(leaf) for leaf in keras.tree.flatten(structure)]
    templates = [np.asarray(leaf) for leaf in keras.tree.flatten(empty)]
    rows = 0 if batch is None or not leaves else int(leaves[0].shape[0])
    capacity = max_rows
    if capacity is None:  # no bound: the counts first, to size the buffer
        (counts,) = adapter.values_from_every_worker([np.array(rows, np.int32)])
        capacity = int(np.max(counts))
        if capacity == 0:
            return None
    elif rows > capacity:
        raise RuntimeError(f"A worker's batch has {rows} rows, more than the {capacity} its stream can hold.")
    packed = adapter.values_from_every_worker([_pack(rows, leaves, capacity)])[0]
    counts = [int(c) for c in packed[:, 0]]
    if max(counts) == 0:
        return None
    per_worker = [_unpack(words, n, templates, capacity) for words, n in zip(packed, counts)]
    combined = [np.concatenate(parts) for parts in zip(*per_worker)]
    return keras.tree.pack_sequence_as(empty, combined)


def _pack(rows: int, leaves: list, capacity: int):
    """One int32 buffer: the row count, then each leaf's rows as words,
    padded to `capacity` rows (one collective carries a worker's batch)."""
    import numpy as np

    return np.concatenate([np.array([rows], np.int32)] + [_as_words(leaf, capacity).reshape(-1) for leaf in leaves])


def _unpack(words, rows: int, templates: list, capacity: int) -> list:
    """`_pack`'s leaves back (`capacity` rows each packed), `rows` rows
    each, shaped and typed as `templates`."""
    import numpy as np

    leaves, offset = [], 1
    for template in templates:
        width = -(-int(np.prod(template.shape[1:], dtype=np.int64)) * template.dtype.itemsize // 4)
        block = words[offset : offset + capacity * width].reshape(capacity, width)
        leaves.append(_from_words(block[:rows], template))
        offset += capacity * width
    return leaves


def _as_words(leaf, rows: int):
    """`leaf`'s rows as int32 words, padded with zero rows to `rows`."""
    import numpy as np

    size = int(np.prod(leaf.shape[1:], dtype=np.int64)) * leaf.dtype.itemsize
    flat = np.ascontiguousarray(leaf).reshape(-1).view(np.uint8).reshape(leaf.shape[0], size)
    width = -(-size // 4) * 4
    padded = np.zeros((rows, width), np.uint8)
    padded[: flat.shape[0], : flat.shape[1]] = flat
    return padded.view(np.int32)


def _from_words(words, template):
    import numpy as np

    inner = template.shape[1:]
    size = int(np.prod(inner, dtype=np.int64)) * template.dtype.itemsize
    data = np.ascontiguousarray(words).view(np.uint8)[:, :size]
    return np.ascontiguousarray(data).view(template.dtype).reshape((words.shape[0], *inner))


_worker_streams = threading.local()


@contextlib.contextmanager
def worker_streams(empties: dict) -> Iterator[None]:
    """While `fit`/`evaluate`/`predict` runs: for each step kind ("train",
    "test", "predict") named in `empties`, `(empty batch, most rows a
    step)` if each worker reads its own stream of that kind's input, or
    None if every worker reads the same global batches. Kinds not named keep the outer call's
    setting (fit's validation runs through `evaluate`)."""
    previous = getattr(_worker_streams, "empties", {})
    _worker_streams.empties = {**previous, **empties}
    try:
        yield
    finally:
        _worker_streams.empties = previous


def worker_stream(kind: str) -> Optional[tuple]:
    """`(empty batch, most rows a step)` of `kind`'s per-worker stream, or None."""
    return getattr(_worker_streams, "empties", {}).get(kind)
