"""The launcher's tasks: their progress and joining, the signals the
launcher receives, stopping every task's process group, and what a failed
job reports (the root cause's traceback from its error file, then how
every task ended). Used by `keras_dist.launch`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time

from keras_dist import _error_file


def process_state(pid: int) -> str:
    """'stopped' (SIGSTOP), 'running' or 'waiting', from /proc where there is one."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {"T": "stopped", "t": "stopped", "R": "running", "Z": "exited"}.get(state, "waiting")


class Progress:
    """When each worker last made progress: an output line or a heartbeat
    (the mtime of its `KERAS_DIST_HEARTBEAT_FILE`)."""

    def __init__(self, num_workers: int, directory: str) -> None:
        start = time.monotonic()
        self._last = [start] * num_workers
        self.files = [os.path.join(directory, f"worker{i}.heartbeat") for i in range(num_workers)]

    def record(self, index: int) -> None:
        self._last[index] = time.monotonic()

    def silent_for(self, index: int) -> float:
        now = time.monotonic()
        last = self._last[index]
        try:
            beat_age = time.time() - os.stat(self.files[index]).st_mtime
            last = max(last, now - max(0.0, beat_age))
        except OSError:
            pass  # no heartbeat yet
        return now - last

    def describe(self, processes: list[subprocess.Popen]) -> str:
        parts = []
        for index, process in enumerate(processes):
            state = process_state(process.pid)
            parts.append(
                f"worker {index}: silent {self.silent_for(index):.0f} s"
                + (f", process {state}" if state else "")
            )
        return "; ".join(parts)


class Joins:
    """Which tasks have joined the cluster (each writes its
    `KERAS_DIST_JOIN_FILE`), as progress lines: one when all have joined,
    and while some are joining, whom the job waits for (every
    `notice_seconds`). The tasks are the workers of a multi-worker job
    (joined: their strategy has joined the job), or the ps and worker
    server processes of a TensorFlow parameter-server job (joined: the
    server is up). A script that never joins (no strategy) gives no line."""

    def __init__(self, labels: dict[int, str], directory: str, servers: bool, notice_seconds: float) -> None:
        self.labels = labels  # task index -> its label
        self.files = {i: os.path.join(directory, f"task{i}.join") for i in labels}
        self.servers = servers
        self.start = time.monotonic()
        self.notice_seconds = notice_seconds
        self.next_notice = self.start + notice_seconds
        self.done = not labels

    def _state(self, index: int) -> str:
        try:
            with open(self.files[index]) as handle:
                return handle.read()
        except OSError:
            return ""

    def poll(self) -> str | None:
        """The progress line due now, if any."""
        if self.done:
            return None
        states = {i: self._state(i) for i in self.labels}
        now = time.monotonic()
        if all(state == "joined" for state in states.values()):
            self.done = True
            what = "every ps and worker server is up" if self.servers else "every worker joined the cluster"
            return f"{what} after {now - self.start:.1f} s"
        if not any(states.values()) or now < self.next_notice:
            return None
        self.next_notice = now + self.notice_seconds
        joined = sum(state == "joined" for state in states.values())
        waiting = ", ".join(
            f"{self.labels[i]} ({state or 'not started joining'})" for i, state in states.items() if state != "joined"
        )
        what = "starting the servers" if self.servers else "joining the cluster"
        kind = "servers up" if self.servers else "workers joined"
        return f"{what}: {joined} of {len(states)} {kind} after {now - self.start:.0f} s; waiting for {waiting}"


class Signals:
    """Records SIGINT/SIGTERM/SIGHUP while a job runs (main thread only)."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        self.event.set()

    def __enter__(self) -> "Signals":
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def exit_code(returncode: int) -> int:
    """A worker's return code as a shell exit code (killed by signal S: 128+S)."""
    return 128 - returncode if returncode < 0 else returncode


def describe(label: str, returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"{label} exited with code {exit_code(returncode)} (killed by {name})"
    return f"{label} exited with code {returncode}"


def signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone


def stop(processes: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every worker's process group, SIGKILL after `grace`, reap all.
    A stopped (SIGSTOP) group is continued after the SIGTERM, as a shell's
    `kill` does, so that it ends now rather than at the SIGKILL."""
    for p in processes:
        if p.poll() is None:
            signal_group(p.pid, signal.SIGTERM)
            signal_group(p.pid, signal.SIGCONT)
    end = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # Also reaches what the workers started and left behind, even on success.
    for p in processes:
        signal_group(p.pid, signal.SIGKILL)
    for p in processes:
        p.wait()


class Outcome:
    def __init__(self, kind: str, index: int = -1, returncode: int = 0, detail: str = "", label: str = "") -> None:
        self.kind = kind  # "ok", "failed", "stalled", "timeout" or "signal"
        self.index = index
        self.returncode = returncode
        self.detail = detail
        self.label = label or f"worker {index}"
        #: Lines that explain a failure: the root cause's traceback.
        self.report: list[str] = []
        #: The task whose exception came first (its error file), if any.
        self.root: tuple[str, int] | None = None


#: How many lines of the root cause's traceback the failure report shows.
REPORT_LINES = 12


def note_exits(processes, exit_seen) -> None:
    now = time.time()
    for index, process in enumerate(processes):
        if exit_seen[index] is None and process.poll() is not None:
            exit_seen[index] = now


#: Exceptions that say another task failed first (never the root cause
#: while a task failed otherwise).
SECONDARY = ("PeerWorkerError",)


def failure_report(outcome: "Outcome", tasks, ended, error_files, recent, exit_seen) -> list[str]:
    """What a failed job says: which task failed first and how (its
    traceback's last lines, from its error file; for a task that ended
    without one, e.g. killed by a signal, its last stderr lines), then how
    every task ended. The root cause is the earliest failure, a task's own
    exception before a `PeerWorkerError` (a collective that lost a peer).
    Sets `outcome.root`."""
    candidates = []
    for index, path in enumerate(error_files):
        record = _error_file.read(path)
        code = ended[index] if index < len(ended) else None
        if record is not None:
            candidates.append((record.get("type") in SECONDARY, record.get("time", 0.0), index, record))
        elif code not in (None, 0) and exit_seen[index] is not None:
            candidates.append((False, exit_seen[index], index, None))
    lines = []
    if not candidates:
        return ["when the launcher stopped the job: " + states(tasks, ended)]
    _, _, index, record = min(candidates, key=lambda c: c[:3])
    code = ended[index]
    label = tasks[index][3]
    outcome.root = (label, code if code else outcome.returncode)
    if record is not None:
        message = (record.get("message") or "").strip().splitlines()
        lines.append(
            f"root cause (the first exception): {label} raised {record['type']}"
            + (f": {message[0][:200]}" if message else "")
            + (f" (exit code {exit_code(code)})" if code is not None else "")
        )
        body = record["traceback"].rstrip("\n").splitlines()
        shown = body[-REPORT_LINES:]
        if len(body) > len(shown):
            lines.append(f"  ... ({len(body) - len(shown)} lines above; the whole traceback is in the output)")
        lines += [f"  | {line}" for line in shown]
    else:
        last = list(recent[index])[-REPORT_LINES:]
        lines.append(f"root cause (the first to fail): {describe(label, code)}"
                     + ("; its last lines on stderr:" if last else "; it wrote nothing on stderr"))
        lines += [f"  | {line}" for line in last]
    lines.append("when the launcher stopped the job: " + states(tasks, ended))
    return lines


def states(tasks, ended) -> str:
    return "; ".join(
        f"{tasks[index][3]}: " + ("running (stopped by the launcher)" if code is None else f"exit code {exit_code(code)}")
        for index, code in enumerate(ended)
    )
