"""SIGTERM during a multi-worker `fit`: every worker stops at the same step
and exits with code 42 (tf's restart code), so that `keras-dist launch
--max-restarts K` (or Kubernetes, SLURM) restarts the job, which resumes
from the last `BackupAndRestore` backup.

While `fit` runs under a strategy with more than one worker, a SIGTERM
handler (main thread only; chained to a Python handler already installed,
none where SIGTERM is ignored) raises a flag. About once a second, after a
training step (the workers agree on which: `_AgreeOnTermination`), they
exchange their flags in one small all-gather (the adapter's
`values_from_every_worker`): the k-th exchange is the same one on every
worker, so a notice that reached any worker stops all of them after the
same step (at the latest, at the end of the epoch: the flags are also
exchanged there, after the epoch's backup). `fit` then ends without its
epoch-end callbacks (Keras' `BackupAndRestore` restores whole epochs, so a
backup of the half-done epoch would resume wrong), and the worker exits 42.
The restarted job resumes from the last epoch's backup and ends with the
weights of an uninterrupted run; the half-done epoch is trained again.
Before, SIGTERM was ignored during `fit` (the engines install a C-level
handler): the workers trained on to the end.

For custom loops, `keras_dist.experimental.PreemptionCheckpointHandler` does
the same at step granularity, with its own checkpoint.
"""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
import time

import keras
import numpy as np

from keras_dist._preemption import RESTART_EXIT_CODE
from keras_dist.backends import get_adapter


class _Terminated(Exception):
    """Raised out of `fit` after the step at which the workers agreed to stop."""


#: About how often, in seconds, the workers exchange their flags.
EXCHANGE_SECONDS = 1.0
#: The most steps between two exchanges.
_MAX_STEPS_BETWEEN = 1000


class _AgreeOnTermination(keras.callbacks.Callback):
    """Exchanges the workers' SIGTERM flags, about once a second.

    An exchange costs one small all-gather (milliseconds on TensorFlow), so
    it is not made after every step: each exchange also carries every
    worker's mean step time since the last one, and every worker computes
    the same number of steps to the next exchange from the slowest (about
    `EXCHANGE_SECONDS` of steps). The workers make the same calls, so the
    k-th exchange is the same one on every worker.
    """

    def __init__(self, notice: dict, worker_index: int, num_workers: int):
        super().__init__()
        self._notice = notice
        self._worker = worker_index
        self._num_workers = num_workers
        self._epoch = 0
        self._calls = 0
        self._next_exchange = 1
        self._last = (0, time.perf_counter())

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        self._calls += 1
        if self._calls < self._next_exchange:
            return
        now = time.perf_counter()
        calls, then = self._last
        step_micros = int(min(2**31 - 1, 1e6 * (now - then) / max(1, self._calls - calls)))
        rows = self._exchange(step_micros)
        self._stop_if_noticed(rows, f"after step {batch + 1} of epoch {self._epoch + 1}")
        slowest = max(1, int(rows[:, 1].max())) / 1e6
        self._next_exchange = self._calls + max(1, min(_MAX_STEPS_BETWEEN, int(EXCHANGE_SECONDS / slowest)))
        self._last = (self._calls, time.perf_counter())

    def on_epoch_end(self, epoch, logs=None):
        # Also at every epoch's end (after the other callbacks: the epoch's
        # backup is written), so a notice never outlives the job's last steps.
        self._stop_if_noticed(self._exchange(0), f"at the end of epoch {epoch + 1}")

    def _exchange(self, step_micros: int) -> np.ndarray:
        row = np.array([1 if self._notice["received"] else 0, step_micros], dtype=np.int32)
        (rows,) = get_adapter().values_from_every_worker([row])
        return np.asarray(rows).reshape(-1, 2)

    def _stop_if_noticed(self, rows: np.ndarray, where: str) -> None:
        noticed = [int(i) for i in np.flatnonzero(rows[:, 0])]
        if noticed:
            raise _Terminated(
                f"keras_dist: worker {self._worker} of {self._num_workers}: "
                f"SIGTERM reached worker{'s' if len(noticed) > 1 else ''} "
                f"{', '.join(map(str, noticed))}; every worker stops {where} "
                f"and exits with code {RESTART_EXIT_CODE} (restart the job to "
                "resume from the last epoch's BackupAndRestore backup)."
            )


@contextlib.contextmanager
def stop_on_sigterm(strategy):
    """Yields the callback to add to `fit`'s (None where nothing applies);
    turns the agreed stop into `SystemExit(42)`."""
    extended = strategy.extended
    num_workers = getattr(extended, "num_workers", 1)
    if num_workers <= 1 or threading.current_thread() is not threading.main_thread():
        yield None
        return
    previous = signal.getsignal(signal.SIGTERM)
    if previous is signal.SIG_IGN:
        yield None
        return
    notice = {"received": False}

    def handler(signum, frame):
        notice["received"] = True
        if callable(previous):
            previous(signum, frame)

    signal.signal(signal.SIGTERM, handler)
    try:
        yield _AgreeOnTermination(notice, extended.worker_index, num_workers)
    except _Terminated as stop:
        print(str(stop), file=sys.stderr, flush=True)
        raise SystemExit(RESTART_EXIT_CODE) from None
    finally:
        signal.signal(signal.SIGTERM, previous if previous is not None else signal.SIG_DFL)
