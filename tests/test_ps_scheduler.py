"""`backends/jax/_ps_scheduler`: the queue of scheduled functions and its
dispatchers, on stand-in worker actors (no Ray process): each function
runs once, a lost worker's function runs again elsewhere, an error is
raised once and cancels the queue, a lost ps is fatal."""

import threading

import pytest

from conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="the JAX parameter-server engine's scheduler")


class ActorDied(Exception):
    """Stands in for ray.exceptions.RayActorError."""


class PsLost(Exception):
    """Stands in for the actors' ParameterServerError."""


class _Ray:
    class exceptions:
        RayActorError = ActorDied

    @staticmethod
    def get(value, timeout=None):
        if isinstance(value, list):
            return [_Ray.get(v) for v in value]
        if isinstance(value, BaseException):
            raise value
        return value


class _Actors:
    ParameterServerError = PsLost


class _Call:
    def __init__(self, fn):
        self.remote = fn


class _Worker:
    """A worker actor: runs a function by calling `behaviour(worker, id, payload, needs)`."""

    def __init__(self, index, generation, behaviour, log):
        self.index, self.generation, self.held = index, generation, set()
        self.run = _Call(lambda cid, payload, needs: behaviour(self, cid, payload, needs))
        self.log = log


@pytest.fixture
def scheduler(monkeypatch):
    from keras_dist.backends.jax import _ps_scheduler

    monkeypatch.setattr(_ps_scheduler, "_ray", lambda: _Ray)
    monkeypatch.setattr(_ps_scheduler, "_actors", lambda: _Actors)
    monkeypatch.setattr(_ps_scheduler, "_ray_is_up", lambda: True)
    made = []

    def make(workers, behaviour):
        log = []
        generations = {}

        def new_worker(index):
            generations[index] = generations.get(index, -1) + 1
            return _Worker(index, generations[index], behaviour, log)

        def load_missing(handle, missing):
            handle.held.update(missing)
            log.append(("load", handle.index, tuple(missing)))
            return [None for _ in missing]

        scheduler = _ps_scheduler.Scheduler(threading.RLock(), new_worker, load_missing)
        scheduler.add_slots(workers)
        made.append(scheduler)
        return scheduler, log

    yield make
    for scheduler in made:
        scheduler.stop()


def _closure(payload, needs=()):
    from keras_dist.backends.jax._ps_scheduler import Closure

    return Closure(payload, list(needs))


def _runs(worker, cid, payload, needs):
    missing = [n for n in needs if n not in worker.held]
    if missing:
        return ("missing", missing)
    worker.log.append(("run", worker.index, payload))
    if isinstance(payload, BaseException):
        return ("error", payload, "Traceback: on the worker")
    return ("ok", payload * 10)


def test_each_function_runs_once_after_its_worker_got_what_it_lacks(scheduler):
    sched, log = scheduler(2, _runs)
    closures = [_closure(i, needs=[("model", 1)]) for i in range(20)]
    for closure in closures:
        sched.submit(closure)
    sched.start_dispatchers()
    sched.wait()
    assert [sched.fetch(c) for c in closures] == [i * 10 for i in range(20)]
    assert sorted(entry[2] for entry in log if entry[0] == "run") == list(range(20))
    loads = [entry for entry in log if entry[0] == "load"]
    assert len(loads) <= 2 and all(entry[2] == (("model", 1),) for entry in loads)  # once per worker that ran one
    assert sched.stats == {"scheduled": 20, "completed": 20}
    assert sched.done() and all(c.attempts == 1 for c in closures)
    # the ids finished before the previous take may be forgotten by the ps
    assert sched.take_forgettable() == [] and sorted(sched.take_forgettable()) == sorted(c.id for c in closures)


def test_a_lost_worker_s_function_runs_again_on_a_new_actor(scheduler):
    def dies_once(worker, cid, payload, needs):
        if payload == 3 and worker.generation == 0:
            raise ActorDied("worker died")
        return _runs(worker, cid, payload, needs)

    sched, log = scheduler(1, dies_once)
    closures = [_closure(i) for i in range(6)]
    for closure in closures:
        sched.submit(closure)
    sched.start_dispatchers()
    sched.wait()
    assert [sched.fetch(c) for c in closures] == [i * 10 for i in range(6)]
    assert [entry[2] for entry in log if entry[0] == "run"] == list(range(6))  # in order, 3 once
    assert closures[3].attempts == 2
    assert sched.stats["redispatched"] == 1 and sched.stats["worker_restarts"] == 1
    assert sched.slots[0].handle.generation == 1


def test_an_error_is_raised_once_and_the_queued_functions_are_cancelled(scheduler):
    from keras_dist.backends.jax._ps_scheduler import CancelledError

    sched, _ = scheduler(1, _runs)
    boom = ValueError("boom")
    closures = [_closure(0), _closure(boom), _closure(2), _closure(3)]
    for closure in closures:
        sched.submit(closure)
    sched.start_dispatchers()
    with pytest.raises(ValueError, match="boom") as raised:
        sched.wait()
    assert "Raised on a parameter-server worker" in "".join(getattr(raised.value, "__notes__", []))
    sched.wait()  # raised once
    assert sched.fetch(closures[0]) == 0
    for closure in closures[2:]:
        with pytest.raises(CancelledError, match="an earlier scheduled function failed \\(ValueError: boom\\)"):
            sched.fetch(closure)
    later = _closure(5)
    sched.submit(later)  # not fatal: the queue runs on
    sched.wait()
    assert sched.fetch(later) == 50


def test_a_lost_ps_is_fatal_for_every_function_and_every_later_call(scheduler):
    sched, _ = scheduler(1, _runs)
    lost = PsLost("a parameter server was lost")
    closures = [_closure(lost), _closure(1)]
    for closure in closures:
        sched.submit(closure)
    sched.start_dispatchers()
    for call in (sched.wait, sched.done, lambda: sched.submit(_closure(2))):
        with pytest.raises(PsLost):
            call()
    with pytest.raises(PsLost):
        sched.fetch(closures[1])


def test_a_slot_gives_up_after_its_restarts_and_with_none_left_the_cluster_fails(scheduler):
    from keras_dist.backends.jax._ps_scheduler import MAX_WORKER_RESTARTS

    def always_dies(worker, cid, payload, needs):
        raise ActorDied("worker died")

    sched, _ = scheduler(2, always_dies)
    closure = _closure(1)
    sched.submit(closure)
    sched.start_dispatchers()
    with pytest.raises(RuntimeError, match="Every worker was lost"):
        sched.wait()
    assert sched.stats["worker_restarts"] == 2 * MAX_WORKER_RESTARTS
    assert not any(slot.alive for slot in sched.slots)
    with pytest.raises(RuntimeError, match="Every worker was lost"):
        sched.fetch(closure)
