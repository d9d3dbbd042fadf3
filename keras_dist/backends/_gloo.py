"""gloo's TCP event loop, moved out of the way of the worker's computation.

JAX's CPU collectives across processes run on gloo, and so do torch's
(`torch.distributed`'s gloo backend, a copy of the same library). gloo's TCP transport
has one event-loop thread per process, and that loop busy-polls while a
peer's data waits for this process to post its receive (upstream:
pytorch/gloo issue 246). On a worker with few cores the spinning thread
takes the core from the thread that computes, so the step that is about to
post the receive runs at half speed or waits a scheduler slice (~4 ms).
On a worker limited to one core, keras_dist puts that one thread in the
SCHED_IDLE class: it still runs whenever the core is free, which is exactly
when the worker waits for data. With more cores the loop spins on a core of
its own, and a SCHED_IDLE loop could wait behind busy input threads, so it
is left alone.

``KERAS_DIST_GLOO_EVENT_LOOP``: ``auto`` (the default, as above), ``idle``
(whatever the cores), ``normal`` (never).
"""

from __future__ import annotations

import os
import platform
import time

#: syscall numbers of epoll_wait / epoll_pwait, by machine.
_EPOLL_SYSCALLS = {"x86_64": {"232", "281"}, "aarch64": {"22"}}
#: gloo's Loop::run waits for up to 64 events, 10 ms at a time.
_GLOO_WAIT_ARGUMENTS = ("0x40", "0xa")


def is_gloo_event_loop(syscall_line: str, machine: str | None = None) -> bool:
    """Whether a thread's /proc/.../syscall line is gloo's loop waiting."""
    fields = syscall_line.split()
    numbers = _EPOLL_SYSCALLS.get(machine or platform.machine(), set())
    return len(fields) >= 5 and fields[0] in numbers and tuple(fields[3:5]) == _GLOO_WAIT_ARGUMENTS


def gloo_event_loop_threads(attempts: int = 500) -> list[int]:
    """Thread ids of this process's gloo event loops (Linux; else [])."""
    if not os.path.isdir("/proc/self/task"):
        return []
    # a spinning loop shows "running": look again (up to 1 s; under load it
    # was seen waiting in none of 50 looks, 0.1 s: make test-bench beside test-faults)
    for _ in range(attempts):
        found = []
        for tid in os.listdir("/proc/self/task"):
            try:
                with open(f"/proc/self/task/{tid}/syscall") as handle:
                    line = handle.read()
            except OSError:
                continue
            if is_gloo_event_loop(line):
                found.append(int(tid))
        if found:
            return sorted(found)
        time.sleep(0.002)
    return []


def event_loop_choice() -> str:
    """``KERAS_DIST_GLOO_EVENT_LOOP``, checked."""
    choice = os.environ.get("KERAS_DIST_GLOO_EVENT_LOOP", "auto")
    if choice not in ("auto", "idle", "normal"):
        raise ValueError(
            f"KERAS_DIST_GLOO_EVENT_LOOP={choice!r}: use 'auto' (SCHED_IDLE on "
            "single-core workers, the default), 'idle' or 'normal'."
        )
    return choice


def yield_event_loop() -> list[int]:
    """Puts gloo's event-loop threads in SCHED_IDLE (see the module doc);
    returns the ids of those it moved.

    Call after the first cross-process collective (which starts gloo).
    """
    choice = event_loop_choice()
    if choice == "normal" or not hasattr(os, "SCHED_IDLE"):
        return []
    if choice == "auto" and len(os.sched_getaffinity(0)) != 1:
        return []
    changed = []
    for tid in gloo_event_loop_threads():
        try:
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))
        except OSError:  # the thread ended, or the system forbids it
            continue
        changed.append(tid)
    return changed
