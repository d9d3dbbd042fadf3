"""The launcher's console: each task's output forwarded as it arrives.

Lines and Keras' in-place progress updates ("\\r") go to the launcher's
stdout/stderr with a `[worker i] ` prefix, one writer at a time; engine
notices no setting turns off are dropped (they stay in `--log-dir` files),
and each task's last stderr lines are kept for the failure report
(`keras_dist._launch_tasks`). Used by `keras_dist.launch`.
"""

from __future__ import annotations

import os
import re
import sys
import threading

PREFIX = "keras-dist launch: "


class Output:
    """Writes whole lines to the launcher's stdout/stderr, one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def write(self, stream, data: bytes) -> None:
        with self._lock:
            try:
                stream.flush()
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:
                    stream.write(data.decode("utf-8", errors="replace"))
                    stream.flush()
            except (OSError, ValueError):
                pass  # launcher's stream closed: drop the line, keep draining

    def message(self, text: str) -> None:
        """A launcher message, on stderr."""
        self.write(sys.stderr, (PREFIX + text + "\n").encode())


#: gloo (JAX's CPU collectives across processes) prints "[Gloo] Rank i is
#: connected to n peer ranks. Expected number of connected peer ranks is : n"
#: to stdout for every group of devices a worker joins, with no setting to
#: turn it off; groups that connect at once interleave its pieces mid-line.
#: Lines made only of those pieces are dropped ("is NOT connected" passes).
GLOO_CONNECTED = re.compile(
    rb"^(?=.*(?:\[Gloo\]|connected))"
    rb"(?:\[Gloo\] Rank |\d+| is connected to | peer ranks\. |Expected number of connected peer ranks is : )+"
    rb"\r?\n?$"
)


#: One piece of a worker's output: a line (ends in "\n") or a progress-bar
#: update (ends in "\r": Keras redraws its bar in place with "\b...\r").
SEGMENT = re.compile(rb"[^\r\n]*(?:\r\n|\n|\r)")
#: How many of a worker's last stderr lines the failure report can show.
RECENT_LINES = 20


#: Engine notices no setting turns off, dropped from the console (they stay
#: in `--log-dir` files): absl's line before its logging starts, and C++
#: INFO lines of TensorFlow, XLA or gRPC ("I1126 10:28:49.955798 ..."), e.g.
#: tf's "oneDNN custom operations are on", printed at import whatever
#: TF_CPP_MIN_LOG_LEVEL says; and one warning a TensorFlow parameter server
#: prints when a finished step's rendezvous is torn down ("Local rendezvous
#: is aborting with status: ABORTED: Cleanup <step id>", at random, after
#: the work is done). Every other warning, error and fatal line ("W", "E",
#: "F") passes, a rendezvous aborted for any other reason included.
ENGINE_NOTICE = re.compile(
    rb"^(?:WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    rb"|I\d{4} \d\d:\d\d:\d+\.\d+ +\d+ [\w.-]+:\d+\] .*"
    rb"|W\d{4} \d\d:\d\d:\d+\.\d+ +\d+ local_rendezvous\.cc:\d+\] Local rendezvous is aborting with "
    rb"status: ABORTED: Cleanup -?\d+(?: \[type\.googleapis\.com/tensorflow\.DerivedStatus=''\])?)\r?\n?$"
)


def pump(pipe, prefix: bytes, stream_name: str, output: "Output", progress, index: int,
         recent=None, log=None, show: bool = True) -> None:
    """Forwards a worker's output as it arrives, not only at line ends, so
    Keras' progress bar (redrawn with "\r", no newline until the epoch
    ends) stays live: each update is written as `prefix + bar + "\r"`.
    Each read is recorded as the task's progress (`progress.record(index)`,
    a `keras_dist._launch_tasks.Progress`)."""
    fd = pipe.fileno()
    pending = b""
    with pipe:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except OSError:
                break
            if not chunk:
                break
            progress.record(index)
            if log is not None:
                log.write(chunk)
                log.flush()
            pending += chunk
            end = 0
            for match in SEGMENT.finditer(pending):
                if match.end() == len(pending) and pending.endswith(b"\r"):
                    break  # a "\r" that may be the start of "\r\n": wait
                end = match.end()
                forward(match.group(), prefix, stream_name, output, recent, show)
            pending = pending[end:]
        if pending:
            forward(pending + b"\n", prefix, stream_name, output, recent, show)


def forward(segment: bytes, prefix: bytes, stream_name: str, output: "Output", recent, show: bool = True) -> None:
    """One line (or `\r` progress update) of a task's output to the console;
    `show` False (`--local-ranks-filter`): only kept for the failure report."""
    text = segment.replace(b"\b", b"")
    stream = getattr(sys, stream_name)
    terminal = _is_terminal(stream)
    if text.endswith(b"\n"):
        line = text.rstrip(b"\r\n")
        if GLOO_CONNECTED.match(line + b"\n") or ENGINE_NOTICE.match(line):
            return
        if recent is not None:
            recent.append(ANSI_ESCAPE.sub(b"", line).decode("utf-8", errors="replace"))
        if show:
            if not terminal:  # a file or a pipe: the line as text, and only its last redraw
                line = ANSI_ESCAPE.sub(b"", line.rsplit(b"\r", 1)[-1])
            output.write(stream, prefix + line + b"\n")
    elif show and terminal and text.rstrip(b"\r"):  # a progress update (an empty one only moves the cursor)
        output.write(stream, prefix + text)


#: Terminal escape sequences (Keras' progress bar colours its bar with them
#: whether or not its output is a terminal): removed where the launcher's
#: output is not one, with the bar's in-place redraws ("\r"), so a log file
#: gets each finished line as plain text.
ANSI_ESCAPE = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")


def _is_terminal(stream) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False
