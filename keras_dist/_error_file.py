"""The failing worker's traceback, for `keras-dist launch`'s failure report.

The launcher gives each worker a path in `KERAS_DIST_ERROR_FILE` (as
torchrun gives `TORCHELASTIC_ERROR_FILE`). When that variable is set,
importing keras_dist chains a `sys.excepthook` that, after Python printed
the traceback, writes it to that file as JSON (written to a temporary file,
then renamed): the worker's index, the time, the exception's type and
message, and the formatted traceback. The launcher reports the earliest
such file as the job's root cause, since the other workers fail after it
(a collective without a peer). Outside the launcher nothing is installed.

>>> import json, os, tempfile
>>> path = os.path.join(tempfile.mkdtemp(), "worker0.error.json")
>>> try:
...     raise ValueError("bad row")
... except ValueError as error:
...     write(path, type(error), error, error.__traceback__)
>>> record = json.load(open(path))
>>> record["type"], record["message"]
('ValueError', 'bad row')
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback as traceback_module

ENV_VAR = "KERAS_DIST_ERROR_FILE"


def write(path: str, kind, value, traceback) -> None:
    """Writes one exception to `path` (JSON; atomically: temp file, rename)."""
    record = {
        "worker": os.environ.get("KERAS_DIST_WORKER_INDEX"),
        "time": time.time(),
        "type": getattr(kind, "__name__", str(kind)),
        "message": str(value),
        "traceback": "".join(traceback_module.format_exception(kind, value, traceback)),
    }
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle)
    os.replace(temporary, path)


def read(path: str) -> dict | None:
    """The record at `path`, or None when there is none (or it is damaged)."""
    try:
        with open(path) as handle:
            record = json.load(handle)
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and "traceback" in record else None


#: torchrun's variable: where a worker writes its root cause (torch's
#: `torch.distributed.elastic` error-file JSON), so that torchrun's failure
#: summary shows it instead of `error_file: <N/A>`.
TORCHRUN_ENV_VAR = "TORCHELASTIC_ERROR_FILE"


def write_torchrun(path: str, kind, value, traceback) -> None:
    """Writes one exception as torchrun reads it (the format of torch's
    `ErrorHandler.record_exception`; atomically: temp file, rename)."""
    record = {
        "message": {
            "message": f"{getattr(kind, '__name__', str(kind))}: {value}",
            "extraInfo": {
                "py_callstack": "".join(traceback_module.format_exception(kind, value, traceback)),
                "timestamp": str(int(time.time())),
            },
        }
    }
    temporary = f"{path}.{os.getpid()}.tmp"
    with open(temporary, "w") as handle:
        json.dump(record, handle)
    os.replace(temporary, path)


def install() -> None:
    """Chains the excepthook that writes the file: keras-dist launch's
    (`KERAS_DIST_ERROR_FILE`) and torchrun's (`TORCHELASTIC_ERROR_FILE`),
    each only where its launcher set it."""
    targets = [(os.environ.get(ENV_VAR), write), (os.environ.get(TORCHRUN_ENV_VAR), write_torchrun)]
    targets = [(path, writer) for path, writer in targets if path]
    if not targets or getattr(sys.excepthook, "_keras_dist_error_file", False):
        return
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        previous(kind, value, traceback)
        if not issubclass(kind, KeyboardInterrupt):
            for path, writer in targets:
                try:
                    writer(path, kind, value, traceback)
                except OSError:
                    pass  # the launcher's directory is gone: nobody is listening

    excepthook._keras_dist_error_file = True
    sys.excepthook = excepthook
