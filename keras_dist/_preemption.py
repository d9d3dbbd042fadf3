"""`PreemptionCheckpointHandler` and `TerminationConfig`
(tf.distribute.experimental's): save a checkpoint and exit when a worker is
about to be terminated, and resume from it when the job restarts.

tf's semantics, with keras_dist's means (backend-agnostic: what needs a
backend is the adapter's `values_from_every_worker`, an all-gather over the
job, and, for `tf.train.Checkpoint`, the TensorFlow adapter's
`from_backend_object`):

- A termination notice only raises a flag on the worker that gets it:
  SIGTERM by default (a Python signal handler), else `termination_watcher_fn`
  returning True (polled once a second in a thread, as tf does).
- Every `run` call (before the training function) and every
  `save_checkpoint_if_preempted` call exchanges the workers' flags in one
  small all-gather (JAX: `multihost_utils.process_allgather`; TensorFlow:
  tf's collective ops). Each worker makes the same calls in the same order,
  so the k-th exchange is the same one on every worker: a notice that
  reached any worker is seen by all of them at the same call, and every
  worker stops at the same step. (tf agrees on that step through its
  coordination service's key-value store instead, relying on the workers
  being at most one step apart; the exchange needs no such bound, which JAX's
  asynchronous dispatch would break.)
- There every worker saves (saving may need collectives): the chief into
  `checkpoint_dir`, the others into a private temporary directory, removed
  afterwards, so exactly one checkpoint is written (`keras_dist._checkpoint_stores`
  writes each kind). It goes to a temporary name and is renamed into place, the run count in its name
  (`ckpt-<runs>.weights.h5` for a Keras model, `ckpt-<runs>` for an object
  with `save`/`restore`), and the older ones are removed after that: a
  process killed at any moment leaves the previous checkpoint or the new
  one, whole. A second exchange confirms that every worker saved; then
  `exit_fn` (default `sys.exit(42)`, tf's restart code).
- `grace_period > 0`: save at once, keep training, and save again and exit
  when a worker that got the notice sees the grace period about to end
  (tf's margin: six times the mean run time).
- On construction, the newest checkpoint in `checkpoint_dir` is restored
  (the workers first check that they all see the same one) and
  `total_run_calls` continues from its run count.
"""

from __future__ import annotations

import contextlib
import logging
import math
import numbers
import shutil
import signal
import sys
import tempfile
import threading
import time
import zlib
from typing import Any, Callable, Optional

import numpy as np

from keras_dist import _context, _foreign
from keras_dist._checkpoint_stores import store_for

__all__ = ["PreemptionCheckpointHandler", "RESTART_EXIT_CODE", "TerminationConfig"]

#: The default `exit_fn`'s exit code: tf's (its `sys.exit(42)` outside GCP).
RESTART_EXIT_CODE = 42
#: Seconds between two calls of a `termination_watcher_fn` (tf's: 1).
_WATCH_INTERVAL_SECONDS = 1.0
#: tf's margin before the end of a grace period: 3 x 2 x the mean run time.
_GRACE_MARGIN_RUNS = 6

_logger = logging.getLogger("keras_dist")


def _exit_for_restart() -> None:
    sys.exit(RESTART_EXIT_CODE)


class TerminationConfig:
    """How a `PreemptionCheckpointHandler` learns of a termination, saves and exits.

    Args:
        termination_watcher_fn: a function returning True once a termination
            notice is available, False before; called once a second, from a
            thread, so it must be quick and must not block. None: the notice
            is a SIGTERM to this process.
        exit_fn: called after the checkpoint is saved, on every worker. None:
            `sys.exit(42)`, tf's restart code (`keras-dist launch
            --max-restarts K` restarts a job whose worker exits non-zero).
        grace_period: seconds between the notice and the termination. 0 or
            None: save and exit at the first step every worker agrees on.
            More: save at once, keep training, and save and exit again
            shortly before the grace period ends.
        save_fn: called instead of the handler's own write, on every
            worker, with the arguments given to `save_checkpoint_if_preempted`
            (none from `run`), as tf does. Restoring still reads
            `checkpoint_dir` the handler's way, so `save_fn` must write what
            the handler would.

    ```python
    config = keras_dist.experimental.TerminationConfig(exit_fn=lambda: None, grace_period=0)
    ```
    """

    def __init__(
        self,
        termination_watcher_fn: Optional[Callable[[], bool]] = None,
        exit_fn: Optional[Callable[[], Any]] = None,
        grace_period: Optional[float] = None,
        save_fn: Optional[Callable[..., Any]] = None,
    ):
        for name, function in (
            ("termination_watcher_fn", termination_watcher_fn),
            ("exit_fn", exit_fn),
            ("save_fn", save_fn),
        ):
            if function is not None and not callable(function):
                raise TypeError(f"TerminationConfig: {name} must be a function (or None), got {function!r}.")
        if grace_period is not None:
            if isinstance(grace_period, bool) or not isinstance(grace_period, numbers.Real):
                raise TypeError(
                    f"TerminationConfig: grace_period must be a number of seconds (or None), got {grace_period!r}."
                )
            if not math.isfinite(grace_period) or grace_period < 0:
                raise ValueError(
                    f"TerminationConfig: grace_period must be a finite number of seconds >= 0 "
                    f"(or None), got {grace_period!r}."
                )
        self.termination_watcher_fn = termination_watcher_fn
        self.exit_fn = exit_fn
        self.grace_period = grace_period
        self.save_fn = save_fn

    def __repr__(self) -> str:
        fields = ", ".join(
            f"{name}={getattr(self, name)!r}"
            for name in ("termination_watcher_fn", "exit_fn", "grace_period", "save_fn")
            if getattr(self, name) is not None
        )
        return f"TerminationConfig({fields})"


def _resolver_facts(cluster_resolver) -> tuple[int, int, bool]:
    """(workers, this worker's index, whether it is the chief)."""
    from keras_dist.cluster_resolver import ClusterResolver

    if cluster_resolver is None:
        return 1, 0, True
    resolver = _foreign.accept(cluster_resolver, "cluster_resolver")
    if not isinstance(resolver, ClusterResolver):
        raise TypeError(
            "PreemptionCheckpointHandler: cluster_resolver must be a keras_dist.cluster_resolver "
            f"resolver (e.g. strategy.cluster_resolver) or None, got {cluster_resolver!r}."
        )
    if "ps" in resolver.cluster_spec().as_dict():
        raise NotImplementedError(
            "PreemptionCheckpointHandler does not support parameter-server training (as tf)."
        )
    return resolver.num_workers, resolver.worker_index or 0, resolver.is_chief


class PreemptionCheckpointHandler:
    """Saves a checkpoint and exits when any worker is about to be terminated;
    restores it when the job starts again (tf.distribute.experimental's).

    Args:
        cluster_resolver: the job's cluster resolver (`strategy.cluster_resolver`);
            None for a single process. Create the strategy first: in a job
            of several workers, it joins the job the handler talks over.
        checkpoint_or_checkpoint_manager: what to save: a Keras model (its
            weights and its compiled optimizer's state: in a custom loop,
            `model.compile(optimizer=optimizer)`), any object with
            `save(path)` and `restore(path)` that writes and reads exactly
            `path`, or, on TensorFlow, a `tf.train.Checkpoint` or
            `tf.train.CheckpointManager`.
        checkpoint_dir: where the checkpoints go, on a file system every
            worker sees (not needed with a `tf.train.CheckpointManager`).
            The newest checkpoint there is restored now.
        termination_config: a `TerminationConfig`; None: SIGTERM, exit code
            42, no grace period.

    ```python
    import tempfile

    checkpoint_dir = tempfile.mkdtemp()  # one directory every worker sees
    resolver = None  # one process; in a job: strategy.cluster_resolver
    handler = keras_dist.experimental.PreemptionCheckpointHandler(resolver, model, checkpoint_dir)
    while handler.total_run_calls < 5:  # goes on from a restored checkpoint
        loss = handler.run(model.train_on_batch, x[:32], y[:32])  # one training step
    ```
    """

    def __init__(self, cluster_resolver: Any, checkpoint_or_checkpoint_manager: Any, checkpoint_dir: Optional[str] = None,
                 termination_config: Optional[TerminationConfig] = None):
        config = TerminationConfig() if termination_config is None else termination_config
        config = _foreign.accept(config, "termination_config")
        if not isinstance(config, TerminationConfig):
            raise TypeError(
                "PreemptionCheckpointHandler: termination_config must be a "
                f"keras_dist.experimental.TerminationConfig (or None), got {termination_config!r}."
            )
        self._num_workers, self._worker_index, self._is_chief = _resolver_facts(cluster_resolver)
        self._store = store_for(checkpoint_or_checkpoint_manager)
        self._store.open(checkpoint_dir)
        self._watcher_fn = config.termination_watcher_fn
        self._exit_fn = config.exit_fn or _exit_for_restart
        self._grace_period = float(config.grace_period or 0)
        self._save_fn = config.save_fn
        if self._watcher_fn is None and threading.current_thread() is not threading.main_thread():
            raise RuntimeError(
                "PreemptionCheckpointHandler: the default termination notice is SIGTERM, and "
                "Python handles signals in the main thread only; create the handler in the "
                "main thread, or pass TerminationConfig(termination_watcher_fn=...)."
            )
        from keras_dist.backends import get_adapter

        self._adapter = get_adapter()
        if self._num_workers > 1 and not self._adapter.is_multi_process():
            raise RuntimeError(
                f"PreemptionCheckpointHandler: the cluster has {self._num_workers} workers but "
                "this process has not joined their job; create the "
                "keras_dist.MultiWorkerMirroredStrategy first (it joins the job), then the handler."
            )
        self._runs = 0
        self._runs_here = 0  # run calls timed in this process
        self._mean_run_seconds = 0.0
        self._notice = threading.Event()
        self._notice_time: Optional[float] = None
        self._watcher_error: Optional[BaseException] = None
        self._countdown = False  # saved once, training through the grace period
        self._finished = False  # saved and exited (exit_fn returned): watching no more
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._restore()
        self._start_watching()

    # -- the public API ------------------------------------------------------

    @property
    def total_run_calls(self) -> int:
        """`run` (and `save_checkpoint_if_preempted`) calls made so far,
        those before the restored checkpoint included: the checkpoint holds
        the state after that many calls."""
        return self._runs

    def run(self, distributed_train_function, *args, **kwargs):
        """Calls `distributed_train_function(*args, **kwargs)` (one training
        step: a `strategy.run` and its reduction) and returns its result;
        first, if a termination notice reached any worker, every worker
        saves the checkpoint of the steps so far and calls `exit_fn`."""
        self._check_and_maybe_save((), {})
        start = time.monotonic()
        result = distributed_train_function(*args, **kwargs)
        self._runs += 1
        self._runs_here += 1
        elapsed = time.monotonic() - start
        self._mean_run_seconds += (elapsed - self._mean_run_seconds) / self._runs_here
        return result

    def save_checkpoint_if_preempted(self, *args, **kwargs) -> None:
        """For loops that train without `run`: call it after each unit of
        training (every worker, the same number of times). It counts one
        run call, then, if a termination notice reached any worker, saves
        (with `args` and `kwargs` for the save) and calls `exit_fn`."""
        self._runs += 1
        self._check_and_maybe_save(args, kwargs)

    @contextlib.contextmanager
    def watch_preemption_scope(self):
        """tf's scope for TPU training, where preemption arrives as an error
        inside it; under keras_dist notices are taken by `run` and
        `save_checkpoint_if_preempted` on every strategy, so it only lets
        errors through (as tf's does for MultiWorkerMirroredStrategy)."""
        yield

    def __del__(self):
        stop = getattr(self, "_stop", None)
        if stop is not None:
            stop.set()

    # -- notices -------------------------------------------------------------

    def _start_watching(self) -> None:
        if self._watcher_fn is None:
            signal.signal(signal.SIGTERM, self._on_sigterm)
            return
        self._thread = threading.Thread(
            target=self._watch, name=f"keras_dist-termination-watcher-{self._worker_index}", daemon=True
        )
        self._thread.start()

    def _on_sigterm(self, signum, frame) -> None:
        self._take_notice()  # nothing else here: a signal handler must not log or block

    def _take_notice(self) -> None:
        if not self._notice.is_set():
            self._notice_time = time.monotonic()
            self._notice.set()

    def _watch(self) -> None:
        while not self._stop.is_set():
            try:
                noticed = self._watcher_fn()
            except Exception as error:  # raised in the training thread, at the next check
                self._watcher_error = error
                return
            if noticed:
                self._take_notice()
                return
            self._stop.wait(_WATCH_INTERVAL_SECONDS)

    def _stop_watching(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=2 * _WATCH_INTERVAL_SECONDS)

    # -- agreeing, saving, exiting ---------------------------------------------

    def _exchange(self, row: list) -> np.ndarray:
        """Every worker's `row` (integers below 2**31), in worker order: a
        collective in a job of several workers."""
        row = np.asarray(row, dtype=np.int32)
        if self._num_workers <= 1:
            return row[None]
        (rows,) = self._adapter.values_from_every_worker([row])
        return np.asarray(rows)

    def _check_and_maybe_save(self, args: tuple, kwargs: dict) -> None:
        if self._finished:
            return
        own = self._notice.is_set()
        final = False
        if self._countdown and own:
            margin = _GRACE_MARGIN_RUNS * self._mean_run_seconds
            final = time.monotonic() >= self._notice_time + self._grace_period - margin
        error = self._watcher_error
        rows = self._exchange([own, final, error is not None])
        if rows[:, 2].any():  # every worker stops, not just the one whose watcher failed
            self._finished = True
            self._stop_watching()
            failed = _names(np.flatnonzero(rows[:, 2]))
            cause = f" {error!r}" if error is not None else " (see that worker's error)"
            where = f" on worker {failed}" if self._num_workers > 1 else ""
            raise RuntimeError(f"PreemptionCheckpointHandler: termination_watcher_fn raised{where}:{cause}.") from error
        if self._countdown:
            if not rows[:, 1].any():
                return
        elif not rows[:, 0].any():
            return
        noticed = _names(np.flatnonzero(rows[:, 0]))
        where = self._save(args, kwargs)
        notice = f"a termination notice reached worker {noticed}" if self._num_workers > 1 else "termination notice"
        if self._grace_period > 0 and not self._countdown:
            self._countdown = True
            _logger.warning(
                "PreemptionCheckpointHandler: %s; saved the checkpoint of run %d (%s); training on "
                "for the grace period of %g s.", notice, self._runs, where, self._grace_period,
            )
            return
        self._finished = True
        self._stop_watching()
        _logger.warning(
            "PreemptionCheckpointHandler: %s; saved the checkpoint of run %d (%s). Exiting (exit_fn).",
            notice, self._runs, where,
        )
        self._exit_fn()

    def _save(self, args: tuple, kwargs: dict) -> str:
        """Every worker saves (the chief for real); raises on every worker
        if any failed."""
        private = None if self._is_chief else tempfile.mkdtemp(prefix=f"keras_dist_worker{self._worker_index}_preemption_")
        error: Optional[BaseException] = None
        where = f"by the chief, in {self._store.directory}"
        try:
            if self._save_fn is not None:
                self._store.note_runs(self._runs)
                self._save_fn(*args, **kwargs)
                where = "by save_fn"
            else:
                with _context.writing_own_path():  # a non-chief's private directory: written as given
                    written = self._store.save(self._runs, private, args, kwargs)
                if self._is_chief:
                    where = str(written)
        except Exception as raised:  # noqa: BLE001 - every worker must hear of it
            error = raised
        finally:
            if private is not None:
                shutil.rmtree(private, ignore_errors=True)
        rows = self._exchange([error is None]) if self._num_workers > 1 else None
        if error is not None:
            raise error
        if rows is not None and not rows[:, 0].all():
            failed = np.flatnonzero(rows[:, 0] == 0)
            raise RuntimeError(
                f"PreemptionCheckpointHandler: worker {_names(failed)} failed to save the "
                f"checkpoint of run {self._runs} (see their error); not exiting as if it were saved."
            )
        return where

    def _restore(self) -> None:
        found = self._store.latest()
        if self._num_workers > 1:
            # Every worker must restore the same checkpoint (restoring can
            # take part in collectives): compare what each one sees first.
            runs, name = found if found is not None else (-1, "")
            rows = self._exchange([found is not None, runs, zlib.crc32(name.encode()) & 0x7FFFFFFF])
            if (rows != rows[0]).any():
                seen = "; ".join(
                    f"worker {i}: {'ckpt of run %d' % row[1] if row[0] else 'none'}" for i, row in enumerate(rows)
                )
                raise RuntimeError(
                    f"PreemptionCheckpointHandler: the workers see different checkpoints in "
                    f"{self._store.directory!r} ({seen}). checkpoint_dir must be one directory "
                    "every worker sees (a shared file system)."
                )
        if found is None:
            return
        runs, name = found
        self._store.restore(name)
        self._runs = runs


def _names(indices) -> str:
    """"1" or "0 and 2"."""
    names = [str(int(i)) for i in indices]
    return " and ".join([", ".join(names[:-1]), names[-1]]) if len(names) > 1 else "".join(names)
