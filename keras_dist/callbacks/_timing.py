"""ScalingReport's instrumentation: times each call of `model.train_function`
(batch fetches and the step itself) while a report is attached. Not a hook:
it wraps one model's function for the length of a `fit`, then undoes it."""

from __future__ import annotations

import time

import keras


class _TimedIterator:
    """Yields `first`, then `iterator`'s batches, timing each fetch."""

    def __init__(self, first, iterator):
        self._first = [first]
        self._iterator = iterator
        self.fetch_seconds = 0.0
        self.batches = 0
        self.rows = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self._first:
            batch = self._first.pop()
        else:
            start = time.perf_counter()
            try:
                batch = next(self._iterator)
            finally:
                self.fetch_seconds += time.perf_counter() - start
        self.batches += 1
        self.rows += batch_rows(batch)
        return batch


def batch_rows(batch) -> int:
    """Rows of a batch: the leading size of its first array."""
    for leaf in keras.tree.flatten(batch):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) >= 1 and shape[0] is not None:
            return int(shape[0])
    return 0


def _wait_for_logs(result) -> None:
    """Blocks until a train function's logs are computed.

    JAX dispatches asynchronously: without this, a step's time would be
    its dispatch. (JAX returns ``(logs, state)``, TensorFlow the logs.)
    """
    logs = result[0] if isinstance(result, tuple) else result
    for leaf in keras.tree.flatten(logs):
        if hasattr(leaf, "shape"):
            keras.ops.convert_to_numpy(leaf)


def time_train_function(model, record):
    """Makes each call of `model.train_function` report its timings.

    `record(start, end, fetch_seconds, batches, rows, first_batch)` is
    called after every call. Keras passes the batch iterator as the train
    function's last argument (JAX: ``(state, iterator)``, TensorFlow:
    ``(iterator)``; torch: the call's batches as a list, fetched by Keras'
    loop before the call, so no fetch time is seen); the wrapper hands on an iterator that times every
    fetch, and waits for the step's logs, so a call's time is the step's
    own. (On TensorFlow without a strategy, Keras then takes the batches
    one by one in Python instead of inside its compiled loop: the same
    steps on the same batches.) Returns ``undo()``, which restores the
    original function; a wrapper left behind (fit raised) passes calls
    straight through once undone.
    """
    original = model.train_function
    original = getattr(original, "__keras_dist_untimed__", original)
    active = [True]

    def train_function(*args):
        if not active[0]:
            return original(*args)
        *head, iterator = args
        if isinstance(iterator, list):  # torch: the call's batches, already fetched
            start = time.perf_counter()
            result = original(*args)
            _wait_for_logs(result)
            end = time.perf_counter()
            rows = sum(batch_rows(batch) for batch in iterator)
            record(start, end, 0.0, len(iterator), rows, iterator[0] if iterator else None)
            return result
        start = time.perf_counter()
        first = next(iterator)  # StopIteration: no more data, as Keras expects
        fetched = time.perf_counter()
        timed = _TimedIterator(first, iterator)
        result = original(*head, timed)
        _wait_for_logs(result)
        end = time.perf_counter()
        record(start, end, (fetched - start) + timed.fetch_seconds, timed.batches, timed.rows, first)
        return result

    train_function.__keras_dist_untimed__ = original
    model.train_function = train_function

    def undo():
        active[0] = False
        if model.train_function is train_function:
            model.train_function = original

    return undo
