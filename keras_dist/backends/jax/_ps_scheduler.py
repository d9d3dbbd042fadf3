"""The coordinator's queue of scheduled functions, for ParameterServerStrategy
on JAX (`_parameter_servers.Cluster` owns one).

One dispatcher thread per worker slot takes the next function off the queue
and runs it on the slot's Ray worker actor, first sending the actor what it
lacks (models, per-worker datasets: the cluster's `load_missing`). A worker
lost mid-function (its actor died) puts the function back at the front of
the queue, and the slot starts a new actor, up to `MAX_WORKER_RESTARTS`
times. A function's error is kept and raised once, by the next
`schedule`, `join` or `done`, and the functions still queued are cancelled
(`CancelledError`); a `ParameterServerError` (a ps lost or silent) is fatal:
every queued function fails with it, and so does every later call.
"""

from __future__ import annotations

import collections
import itertools
import threading
from typing import Any, Callable, Optional

from keras_dist.backends.jax._ps_step import METRIC_DELTAS
from keras_dist.backends.jax._ray_runtime import _RAY_DOWN, _actors, _ray, _ray_is_up

#: Times a worker slot starts a new actor after losing one.
MAX_WORKER_RESTARTS = 2


class Closure:
    """A scheduled function (pickled, with what it needs on a worker) and,
    once finished, its result or error: the `RemoteValue` behind `fetch`."""

    _ids = itertools.count()

    def __init__(self, payload: bytes, needs: list):
        self.id = next(self._ids)
        self.payload = payload
        self.needs = needs
        self.event = threading.Event()
        self.result: Any = None
        self.error: Optional[BaseException] = None
        self.attempts = 0
        self.metrics_model: Any = None  # fit's step: the model whose metrics it updates

    def finish(self, result=None, error=None):
        self.result, self.error = result, error
        self.event.set()

    def __repr__(self):
        state = "done" if self.event.is_set() else "pending"
        return f"<scheduled function {self.id}: {state}>"


class CancelledError(RuntimeError):
    """A scheduled function was not run: an earlier one failed."""


class Slot:
    """One worker of the cluster: its current actor and how often it was replaced."""

    def __init__(self, index):
        self.index = index
        self.handle = None
        self.restarts = 0
        self.alive = True


class Scheduler:
    """The queue and its dispatchers.

    `lock` is the cluster's (registrations and the queue share it);
    `new_worker(index)` starts a worker actor for slot `index`;
    `load_missing(handle, missing)` sends an actor the models and datasets
    it reported missing and returns the calls' Ray references."""

    def __init__(self, lock, new_worker: Callable, load_missing: Callable):
        self.cond = threading.Condition(lock)
        self._new_worker = new_worker
        self._load_missing = load_missing
        self.queue: collections.deque = collections.deque()
        self.inflight = 0
        self.error: Optional[BaseException] = None
        self.fatal: Optional[BaseException] = None
        self.stopping = False
        self.stats = collections.Counter()
        self.metric_deltas: list = []  # (model, deltas) of finished fit steps, added at join
        self.finished_ids: list = []  # closures finished since the last join
        self.forget_next: list = []  # ... and before it: their push keys go at the next join
        self.slots: list[Slot] = []
        self.threads: list[threading.Thread] = []

    # -- the slots
    def add_slots(self, num_workers: int) -> None:
        self.slots = [Slot(i) for i in range(num_workers)]
        for slot in self.slots:
            slot.handle = self._new_worker(slot.index)

    def start_dispatchers(self) -> None:
        self.threads = [
            threading.Thread(target=self._dispatch, args=(slot,), daemon=True, name=f"keras-dist-ps-worker-{slot.index}")
            for slot in self.slots
        ]
        for thread in self.threads:
            thread.start()

    def stop(self) -> None:
        with self.cond:
            self.stopping = True
            self.cond.notify_all()
        for thread in self.threads:
            thread.join(timeout=5)

    # -- the coordinator's calls
    def submit(self, closure: Closure) -> None:
        with self.cond:
            if self.fatal is not None:
                raise self.fatal
            self.queue.append(closure)
            self.stats["scheduled"] += 1
            self.cond.notify_all()

    def raise_error(self) -> None:
        """The fatal error, or the first function error (once)."""
        if self.fatal is not None:
            raise self.fatal
        if self.error is not None:
            error, self.error = self.error, None
            raise error

    def done(self) -> bool:
        with self.cond:
            self.raise_error()
            return not self.queue and self.inflight == 0

    def wait(self) -> None:
        """Until every function has finished (or the cluster failed), then
        the error, if any."""
        with self.cond:
            while self.queue or self.inflight:
                if self.fatal is not None:
                    break
                self.cond.wait(timeout=1.0)
            self.raise_error()

    def fetch(self, closure: Closure):
        closure.event.wait()
        if closure.error is not None:
            raise closure.error
        return closure.result

    def take_metric_deltas(self) -> list:
        """The finished fit steps' (model, metric deltas) since the last call."""
        with self.cond:
            pending, self.metric_deltas = self.metric_deltas, []
        return pending

    def take_forgettable(self) -> list:
        """The ids of functions finished before the previous call (their
        pushes can no longer arrive): the ps may forget their keys."""
        with self.cond:
            forget, self.forget_next = self.forget_next, self.finished_ids
            self.finished_ids = []
        return forget

    # -- the dispatchers
    def _dispatch(self, slot: Slot) -> None:
        ray = _ray()
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                if not _ray_is_up():
                    self._fail(RuntimeError(_RAY_DOWN))
                    return
                closure = self.queue.popleft()
                self.inflight += 1
            try:
                outcome = self._run_on(slot, closure)
            except ray.exceptions.RayActorError:
                with self.cond:
                    self.inflight -= 1
                    self.stats["redispatched"] += 1
                    self.queue.appendleft(closure)
                    self.cond.notify_all()
                if not self._replace(slot):
                    return
                continue
            except BaseException as error:  # the coordinator's own failure
                outcome = ("error", error, "")
            self._finish(closure, outcome)

    def _replace(self, slot: Slot) -> bool:
        """A new worker actor for a lost one; False when the slot gives up."""
        with self.cond:
            slot.restarts += 1
            if slot.restarts > MAX_WORKER_RESTARTS or self.stopping or not _ray_is_up():
                slot.alive = False
                if not any(s.alive for s in self.slots):
                    self._fail(RuntimeError("Every worker was lost; no worker is left to run scheduled functions."))
                return False
            self.stats["worker_restarts"] += 1
        slot.handle = self._new_worker(slot.index)
        return True

    def _run_on(self, slot: Slot, closure: Closure):
        ray = _ray()
        closure.attempts += 1
        while True:
            answer = ray.get(slot.handle.run.remote(closure.id, closure.payload, closure.needs))
            if answer[0] != "missing":
                return answer
            ray.get(self._load_missing(slot.handle, answer[1]))

    def _finish(self, closure: Closure, outcome) -> None:
        actors = _actors()
        with self.cond:
            self.inflight -= 1
            self.finished_ids.append(closure.id)
            if outcome[0] == "ok":
                self.stats["completed"] += 1
                result = outcome[1]
                if closure.metrics_model is not None and isinstance(result, dict) and METRIC_DELTAS in result:
                    self.metric_deltas.append((closure.metrics_model, result.pop(METRIC_DELTAS)))
                closure.finish(result=result)
            else:
                error = outcome[1]
                if outcome[2]:
                    error.add_note(f"Raised on a parameter-server worker:\n{outcome[2]}") if hasattr(error, "add_note") else None
                closure.finish(error=error)
                if isinstance(error, actors.ParameterServerError):
                    self._fail(error)
                elif self.error is None:
                    self.error = error
                    self._cancel_queued(error)
            self.cond.notify_all()

    def _cancel_queued(self, error, fatal=False) -> None:
        while self.queue:
            closure = self.queue.popleft()
            if fatal:  # the cluster cannot run anything: the cause, for every function
                closure.finish(error=error)
            else:
                closure.finish(error=CancelledError(f"Not run: an earlier scheduled function failed ({type(error).__name__}: {error})."))

    def _fail(self, error) -> None:
        with self.cond:
            if self.fatal is None:
                self.fatal = error
            self._cancel_queued(self.fatal, fatal=True)
            self.cond.notify_all()
