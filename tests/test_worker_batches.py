"""keras_dist._worker_batches: the global batch of per-worker streams (one
process here, so every all-gather is this worker's own rows; the multi-
worker jobs of tests/test_multi_worker.py run it across processes)."""

import numpy as np
import pytest

from keras_dist._worker_batches import WorkerBatches, combine_worker_batches, worker_stream, worker_streams


def test_worker_batches_carry_every_dtype_exactly_and_end_together():
    """The rows of per-worker streams travel as raw 32-bit words: any
    dtype and odd row widths arrive bit for bit; a worker's stream ending
    gives StopIteration only when no worker has rows (one worker here)."""
    rng = np.random.default_rng(0)
    batch = {
        "f64": rng.normal(size=(5, 3)),
        "i64": rng.integers(-(2**62), 2**62, size=(5,)),
        "u8": rng.integers(0, 255, size=(5, 3, 1)).astype("uint8"),
        "b": rng.normal(size=(5, 1)) > 0,
        "f16": rng.normal(size=(5, 7)).astype("float16"),
    }
    empty = {key: value[:0] for key, value in batch.items()}
    for max_rows in (None, 5, 8):  # counts first, or counts and rows in one gather
        combined = combine_worker_batches(batch, empty, max_rows)
        for key, value in batch.items():
            assert combined[key].dtype == value.dtype and combined[key].shape == value.shape
            assert combined[key].tobytes() == value.tobytes(), key
        assert combine_worker_batches(None, empty, max_rows) is None
        assert [len(b["b"]) for b in WorkerBatches(iter([batch, batch]), empty, max_rows)] == [5, 5]
    with pytest.raises(RuntimeError, match="more than the 4"):
        combine_worker_batches(batch, empty, 4)


def test_worker_streams_name_the_kinds_of_the_call_and_restore_the_outer_ones():
    """fit's validation runs through evaluate: an inner call names its own
    kinds and keeps the outer call's others; each call's end restores."""
    assert worker_stream("train") is None
    with worker_streams({"train": ("empty", 8), "test": None}):
        assert worker_stream("train") == ("empty", 8) and worker_stream("test") is None
        with worker_streams({"test": ("empty test", 4)}):
            assert worker_stream("train") == ("empty", 8) and worker_stream("test") == ("empty test", 4)
        assert worker_stream("test") is None
    assert worker_stream("train") is None
