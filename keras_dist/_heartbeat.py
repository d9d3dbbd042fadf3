"""Progress heartbeats for `keras-dist launch`'s liveness guard.

The launcher gives each worker a file in `KERAS_DIST_HEARTBEAT_FILE`;
keras_dist touches it when the worker makes progress (a training, test or
predict step dispatched, a `strategy.run`, joining the job), at most once a
second. A job in which no worker printed a line or touched its file for the
launcher's `--timeout` is stopped, and the silent workers are named.
Outside the launcher (no such variable) `beat()` does nothing.

It also gives each worker of a multi-worker job a file in
`KERAS_DIST_JOIN_FILE`, where keras_dist writes "joining" when the worker
starts joining the cluster and "joined" once it has, so the launcher can say
when every worker has joined and whom it is still waiting for.
"""

from __future__ import annotations

import os
import sys
import time

ENV_VAR = "KERAS_DIST_HEARTBEAT_FILE"
JOIN_ENV_VAR = "KERAS_DIST_JOIN_FILE"
JOIN_STATES = ("joining", "joined")
#: Seconds between two touches of the file, at most one per interval.
INTERVAL_SECONDS = 1.0

_last = {"beat": float("-inf")}


def beat() -> None:
    """Records that this worker made progress (cheap; safe to call often)."""
    path = os.environ.get(ENV_VAR)
    if not path:
        return
    now = time.monotonic()
    if now - _last["beat"] < INTERVAL_SECONDS:
        return
    _last["beat"] = now
    try:
        with open(path, "a"):
            os.utime(path)
    except OSError:
        pass  # the launcher's directory is gone: nobody is listening


def mark_join(state: str) -> None:
    """Tells the launcher this worker is "joining" or has "joined" the
    cluster (written whole: a temporary file, then renamed)."""
    if state not in JOIN_STATES:
        raise ValueError(f"state must be one of {JOIN_STATES}, got {state!r}")
    path = os.environ.get(JOIN_ENV_VAR)
    if not path:
        return
    try:
        with open(path + ".tmp", "w") as handle:
            handle.write(state)
        os.replace(path + ".tmp", path)
    except OSError:
        pass  # the launcher's directory is gone: nobody is listening


def say(text: str) -> None:
    """A progress line on stderr ("keras_dist: ..."), under `keras-dist
    launch` only (which prefixes it with the task); elsewhere silent."""
    if os.environ.get(ENV_VAR):
        print(f"keras_dist: {text}", file=sys.stderr, flush=True)
