"""keras_dist._launch_output: the launcher's console (unit tests, no process)."""

import os
import threading

import pytest

from keras_dist import _launch_output


class _Progress:
    def __init__(self):
        self.records = []

    def record(self, index):
        self.records.append(index)


@pytest.mark.parametrize(
    "line, dropped",
    [
        (b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n", True),
        (b"[Gloo] Rank [Gloo] Rank 3 is connected to 3 peer ranks. Expected number of connected peer ranks is : 3\n", True),
        (b"[Gloo] Rank 1 is NOT connected to all peer ranks\n", False),
        (b"3\n", False),
        (b"Epoch 1/3 loss 0.5\n", False),
    ],
)
def test_gloo_connected_lines_are_dropped(line, dropped):
    assert bool(_launch_output.GLOO_CONNECTED.match(line)) == dropped


@pytest.mark.parametrize(
    "line, shown",
    [
        (b"WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n", False),
        (b"I1126 10:28:49.955798   14461 port.cc:153] oneDNN custom operations are on.\n", False),
        (b"W1126 10:28:49.955798   14461 local_rendezvous.cc:405] Local rendezvous is aborting with "
         b"status: ABORTED: Cleanup 123\n", False),
        (b"W1126 10:28:49.955798   14461 local_rendezvous.cc:405] Local rendezvous is aborting with "
         b"status: CANCELLED: Derived\n", True),
        (b"E1126 10:28:49.955798   14461 collective.cc:12] a peer is gone\n", True),
        (b"Traceback (most recent call last):\n", True),
    ],
)
def test_engine_notices_are_dropped_and_every_other_line_kept(capsysbinary, line, shown):
    recent = []
    _launch_output.forward(line, b"[worker 1] ", "stderr", _launch_output.Output(), recent)
    assert capsysbinary.readouterr() == (b"", b"[worker 1] " + line if shown else b"")
    assert recent == ([line.decode().rstrip("\n")] if shown else [])


@pytest.mark.parametrize("terminal", [True, False])
def test_a_progress_bar_is_forwarded_as_it_is_redrawn(capsysbinary, monkeypatch, terminal):
    """Keras redraws its bar with "\\b...\\r" and no newline until the epoch
    ends: each update reaches the console at once, prefixed; a "\\r" is held
    until the next byte says whether it starts a "\\r\\n" (here the bar's
    last update and the epoch's end, one line); a last line with no newline
    gets one; a dropped line is still progress (the liveness guard). Where
    the launcher's output is not a terminal (a log file, a pipe) only the
    finished lines are written."""
    monkeypatch.setattr(_launch_output, "_is_terminal", lambda stream: terminal)
    read, write = os.pipe()
    progress = _Progress()
    output = _launch_output.Output()
    pump = threading.Thread(
        target=_launch_output.pump,
        args=(os.fdopen(read, "rb"), b"[worker 0] ", "stdout", output, progress, 0),
    )
    pump.start()
    with os.fdopen(write, "wb", buffering=0) as pipe:
        for chunk in (b"1/3 [=>   ]\r", b"\b\b2/3 [==> ]\r", b"3/3 [====]\r", b"\n",
                      b"[Gloo] Rank 0 is connected to 1 peer ranks. Expected number of connected peer ranks is : 1\n",
                      b"done"):
            pipe.write(chunk)
    pump.join(timeout=10)
    assert not pump.is_alive()
    redraws = b"[worker 0] 1/3 [=>   ]\r[worker 0] 2/3 [==> ]\r" if terminal else b""
    assert capsysbinary.readouterr() == (redraws + b"[worker 0] 3/3 [====]\n[worker 0] done\n", b"")
    assert progress.records and set(progress.records) == {0}


def test_keras_colours_reach_only_a_terminal(capsysbinary, monkeypatch):
    """Keras' progress bar colours its bar (ANSI escapes) whatever its
    output is: a redirected launcher writes the line as plain text, the
    last redraw only; the failure report keeps plain text too."""
    line = b"\r2/2 \x1b[32m\xe2\x94\x81\xe2\x94\x81\x1b[0m\x1b[37m\x1b[0m \x1b[1m0s\x1b[0m 5ms/step - loss: 0.5\n"
    for terminal, shown in ((False, b"2/2 \xe2\x94\x81\xe2\x94\x81 0s 5ms/step - loss: 0.5"), (True, line.rstrip(b"\n"))):
        monkeypatch.setattr(_launch_output, "_is_terminal", lambda stream: terminal)
        recent = []
        _launch_output.forward(line, b"[worker 0] ", "stdout", _launch_output.Output(), recent)
        assert capsysbinary.readouterr() == (b"[worker 0] " + shown + b"\n", b"")
        assert recent == ["\r2/2 \u2501\u2501 0s 5ms/step - loss: 0.5"]


def test_a_filtered_task_s_lines_are_kept_for_the_report_only(capsysbinary):
    """`--local-ranks-filter`: a task not shown writes nothing, but its
    stderr lines still reach the failure report."""
    recent = []
    _launch_output.forward(b"ValueError: planted\n", b"[worker 1] ", "stderr", _launch_output.Output(), recent,
                           show=False)
    assert capsysbinary.readouterr() == (b"", b"") and recent == ["ValueError: planted"]


def test_launcher_messages_go_to_stderr_with_the_prefix(capsysbinary):
    _launch_output.Output().message("every worker joined the cluster after 1.0 s")
    assert capsysbinary.readouterr() == (b"", b"keras-dist launch: every worker joined the cluster after 1.0 s\n")
