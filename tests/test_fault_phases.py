"""No hang the timeout misses: one worker of a two-worker job is stopped
(SIGSTOP: alive, silent, its sockets open) or killed (SIGKILL) at each phase
of a job, and the survivor must end within `timeout_seconds` plus a small
bound with a clear error: keras_dist's `PeerWorkerError`, or the engine's
own message where the engine ends the process itself (JAX's coordination
service does when a peer's heartbeat stops). A worker that raises an
uncaught exception at each phase ends the whole job at once, well inside
`timeout_seconds` (JAX used to wait 5 minutes in its shutdown barrier, then
dump a C++ stack), and the launcher names it with its traceback.

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


def _launch_phase(tmp_path, phase, how, dying, timeout):
    """The 2-worker phase job through `keras-dist launch`: (result, the
    time the launcher exited)."""
    command = [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND,
               "--timeout", "200", WORKER, str(tmp_path), phase, how, str(dying), str(TIMEOUT)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)
    return done, time.time()


@pytest.mark.parametrize("phase", list(DYING))
def test_stopped_worker_at_each_phase_ends_the_job(tmp_path, phase):
    dying = DYING[phase]
    done, exited = _launch_phase(tmp_path, phase, "STOP", dying, timeout=260)
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


#: The worker that raises at each phase (RAISE): chief and non-chief.
RAISING = {"startup": 0, "fit": 1, "evaluate": 0, "callback": 1, "exit": 0}
RAISE_BOUND = 12  # seconds from the exception to the launcher's exit (< TIMEOUT)
#: Engine dumps that must not appear: JAX's shutdown barrier, its fatal log.
DUMPS = ("Check failure stack trace", "DEADLINE_EXCEEDED", "Shutdown barrier")


@pytest.mark.parametrize("phase", list(RAISING))
def test_raising_worker_at_each_phase_ends_the_job_at_once(tmp_path, phase):
    raising = RAISING[phase]
    done, exited = _launch_phase(tmp_path, phase, "RAISE", raising, timeout=200)
    output = done.stdout + done.stderr
    raised = float((tmp_path / "death_time").read_text())
    assert done.returncode == 1, output[-3000:]
    assert exited - raised <= RAISE_BOUND, (exited - raised, output[-3000:])
    assert f"keras-dist launch: root cause (the first exception): worker {raising} raised" in done.stderr, output[-3000:]
    report = [line for line in done.stderr.splitlines() if line.startswith("keras-dist launch:   | ")]
    assert any(f"planted failure at {phase} in worker {raising}" in line for line in report), output[-3000:]
    assert f"keras-dist launch: worker {raising} exited with code 1; stopped all workers" in done.stderr
    assert not [dump for dump in DUMPS if dump in output], output[-3000:]
    for index in range(2):
        assert _gone(int((tmp_path / f"pid{index}").read_text())), f"worker {index} outlived the launcher"


def test_raising_chief_ends_the_other_worker_without_a_launcher(tmp_path):
    """No launcher to stop the job: the other worker ends itself, at once
    and cleanly (on JAX the chief hosts the coordination service, whose
    loss used to end the others with a fatal log and a C++ stack dump)."""
    codes, outputs = _run_job(tmp_path, 2, ["startup", "RAISE", 0, TIMEOUT], timeout=120, worker=WORKER)
    exited = time.time()
    raised = float((tmp_path / "death_time").read_text())
    assert codes == [1, 1], (codes, outputs[1][-3000:])
    assert exited - raised <= RAISE_BOUND, (exited - raised, outputs[1][-3000:])
    assert "RuntimeError: planted failure at startup in worker 0" in outputs[0]
    survivor = outputs[1]
    assert not [dump for dump in DUMPS if dump in survivor], survivor[-3000:]
    if BACKEND == "jax":
        assert "keras_dist: worker 1 of 2: worker 0 failed (see its traceback); ending this worker too" in survivor
