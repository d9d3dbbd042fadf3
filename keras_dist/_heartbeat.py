"""Progress heartbeats for `keras-dist launch`'s liveness guard.

The launcher gives each worker a file in `KERAS_DIST_HEARTBEAT_FILE`;
keras_dist touches it when the worker makes progress (a training, test or
predict step dispatched, a `strategy.run`, joining the job), at most once a
second. A job in which no worker printed a line or touched its file for the
launcher's `--timeout` is stopped, and the silent workers are named.
Outside the launcher (no such variable) `beat()` does nothing.
"""

from __future__ import annotations

import os
import time

ENV_VAR = "KERAS_DIST_HEARTBEAT_FILE"
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
