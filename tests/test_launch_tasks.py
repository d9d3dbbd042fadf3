"""keras_dist._launch_tasks: what the launcher knows of its tasks (unit
tests, no process but the test's own)."""

import collections
import json
import os
import pathlib
import signal
import sys
import time

import pytest

from keras_dist import _error_file, _launch_tasks

TASKS = [(["python", "train.py"], "worker", i, f"worker {i}") for i in range(3)]


def _record(path, kind, message, when):
    """A task's error file, as keras_dist writes it, failed at time `when`."""
    try:
        raise kind(message)
    except kind:
        _error_file.write(str(path), *sys.exc_info())
    record = json.loads(path.read_text())
    path.write_text(json.dumps(dict(record, time=when)))


@pytest.mark.parametrize(
    "returncode, code, text",
    [
        (0, 0, "worker 1 exited with code 0"),
        (3, 3, "worker 1 exited with code 3"),
        (-signal.SIGKILL, 137, "worker 1 exited with code 137 (killed by SIGKILL)"),
        (-signal.SIGABRT, 134, "worker 1 exited with code 134 (killed by SIGABRT)"),
    ],
)
def test_a_task_s_return_code_as_the_shell_reports_it(returncode, code, text):
    assert _launch_tasks.exit_code(returncode) == code
    assert _launch_tasks.describe("worker 1", returncode) == text


def test_the_root_cause_is_the_first_task_s_own_exception_not_a_lost_peer(tmp_path):
    """Worker 2 saw its peer vanish first (PeerWorkerError), worker 1 raised
    its own error later: worker 1 is the root cause, with its traceback."""
    files = [tmp_path / f"task{i}.error.json" for i in range(3)]
    _record(files[2], type("PeerWorkerError", (RuntimeError,), {}), "a peer is gone", when=1.0)
    _record(files[1], ValueError, "bad batch", when=2.0)
    outcome = _launch_tasks.Outcome("failed", 2, 1, label="worker 2")
    recent = [collections.deque(maxlen=20) for _ in TASKS]
    lines = _launch_tasks.failure_report(outcome, TASKS, [None, 1, 1], [str(f) for f in files], recent, [None, 3.0, 3.0])
    assert lines[0] == "root cause (the first exception): worker 1 raised ValueError: bad batch (exit code 1)"
    assert any("ValueError: bad batch" in line and line.startswith("  | ") for line in lines)
    assert lines[-1] == (
        "when the launcher stopped the job: worker 0: running (stopped by the launcher); "
        "worker 1: exit code 1; worker 2: exit code 1"
    )
    assert outcome.root == ("worker 1", 1)


def test_a_task_killed_without_an_exception_is_reported_with_its_last_stderr_lines(tmp_path):
    files = [str(tmp_path / f"task{i}.error.json") for i in range(3)]
    recent = [collections.deque(maxlen=20) for _ in TASKS]
    recent[0].extend(f"line {i}" for i in range(30))
    outcome = _launch_tasks.Outcome("failed", 0, -signal.SIGKILL)
    lines = _launch_tasks.failure_report(outcome, TASKS, [-signal.SIGKILL, None, None], files, recent, [5.0, None, None])
    assert lines[0] == (
        "root cause (the first to fail): worker 0 exited with code 137 (killed by SIGKILL); its last lines on stderr:"
    )
    assert lines[1:1 + _launch_tasks.REPORT_LINES] == [f"  | line {i}" for i in range(18, 30)]
    assert outcome.root == ("worker 0", -signal.SIGKILL)


def test_joining_says_whom_it_waits_for_then_that_every_worker_joined(tmp_path):
    joins = _launch_tasks.Joins({0: "worker 0", 1: "worker 1"}, str(tmp_path), servers=False, notice_seconds=0.05)
    assert joins.poll() is None  # nobody started joining: nothing to say
    with open(joins.files[0], "w") as handle:
        handle.write("joined")
    with open(joins.files[1], "w") as handle:
        handle.write("joining")
    time.sleep(0.06)
    line = joins.poll()
    assert line.startswith("joining the cluster: 1 of 2 workers joined after ")
    assert line.endswith("waiting for worker 1 (joining)")
    assert joins.poll() is None  # the next notice waits notice_seconds
    with open(joins.files[1], "w") as handle:
        handle.write("joined")
    assert joins.poll().startswith("every worker joined the cluster after ")
    assert joins.poll() is None and joins.done


def test_progress_counts_output_and_heartbeats(tmp_path):
    progress = _launch_tasks.Progress(2, str(tmp_path))
    time.sleep(0.05)
    progress.record(0)
    assert progress.silent_for(0) < 0.05 <= progress.silent_for(1)
    pathlib.Path(progress.files[1]).touch()  # a heartbeat
    assert progress.silent_for(1) < 0.05


def test_signals_are_recorded_and_the_previous_handlers_restored():
    before = signal.getsignal(signal.SIGTERM)
    with _launch_tasks.Signals() as signals:
        os.kill(os.getpid(), signal.SIGTERM)
        assert signals.event.wait(5) and signals.received == signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) is before
