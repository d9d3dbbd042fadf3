"""No hang the timeout misses: one worker of a two-worker job is stopped
(SIGSTOP: alive, silent, its sockets open) or killed (SIGKILL) at each phase
of a job, and the survivor must end within `timeout_seconds` plus a small
bound with a clear error: keras_dist's `PeerWorkerError`, or the engine's
own message where the engine ends the process itself (JAX's coordination
service does when a peer's heartbeat stops).

SIGSTOP runs go through `keras-dist launch`, which must then exit non-zero
and reap the stopped worker too; SIGKILL runs start the workers directly
(the launcher would stop the survivor at once, as `test_launch` checks), so
that the survivor's own timeout is what ends it.

Slow (about 20 jobs per backend): `make test-faults`, run by CI.
"""

import os
import subprocess
import sys
import time

import pytest

from conftest import BACKEND
from test_multi_worker import ROOT, _run_job

pytestmark = [pytest.mark.faults, pytest.mark.starts_processes]

WORKER = os.path.join(ROOT, "tests", "workers", "mw_phase.py")
TIMEOUT = 20  # CommunicationOptions(timeout_seconds=...) of the workers
BOUND = 15  # seconds past the timeout a survivor may take to exit
#: The worker that dies at each phase: the chief where it alone acts
#: (writing the backup), else a mix of chief and non-chief.
DYING = {"join": 1, "compile": 0, "step": 1, "checkpoint": 0, "predict": 1}
#: What a survivor's output must say.
CLEAR = {
    "jax": ("PeerWorkerError", "another task died", "did not join"),
    "tensorflow": ("PeerWorkerError", "did not join"),
}


def _env(**extra):
    return dict(
        os.environ,
        KERAS_BACKEND=BACKEND,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        **extra,
    )


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    with open(f"/proc/{pid}/stat") as handle:  # a zombie is gone too
        return handle.read().rsplit(")", 1)[1].split()[0] == "Z"


def _check_survivor(output, exited, tmp_path, survivor_code, phase):
    died = float((tmp_path / "death_time").read_text())
    assert survivor_code != 0, output[-3000:]
    assert exited - died <= TIMEOUT + BOUND, (exited - died, output[-3000:])
    if phase == "join":  # keras_dist's own error, naming whom it waited for
        assert f"did not join within {TIMEOUT} s (waiting for worker {DYING[phase]}" in output, output[-3000:]
    assert any(text in output for text in CLEAR[BACKEND]), output[-3000:]


@pytest.mark.parametrize("phase", list(DYING))
def test_stopped_worker_at_each_phase_ends_the_job(tmp_path, phase):
    dying = DYING[phase]
    command = [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND,
               "--timeout", "200", WORKER, str(tmp_path), phase, "STOP", str(dying), str(TIMEOUT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=260, env=_env(), cwd=ROOT)
    exited = time.time()
    output = done.stdout + done.stderr
    assert done.returncode != 0 and done.returncode != 124, output[-3000:]
    assert f"worker {1 - dying} exited with code" in output, output[-3000:]
    survivor_lines = "\n".join(l for l in output.splitlines() if l.startswith(f"[worker {1 - dying}]"))
    _check_survivor(survivor_lines, exited, tmp_path, done.returncode, phase)
    for index in range(2):
        assert _gone(int((tmp_path / f"pid{index}").read_text())), f"worker {index} outlived the launcher"


@pytest.mark.parametrize("phase", list(DYING))
def test_killed_worker_at_each_phase_ends_the_survivor(tmp_path, phase):
    dying = DYING[phase]
    codes, outputs = _run_job(tmp_path, 2, [phase, "KILL", dying, TIMEOUT], timeout=180, worker=WORKER)
    exited = time.time()
    assert codes[dying] == -9
    _check_survivor(outputs[1 - dying], exited, tmp_path, codes[1 - dying], phase)
