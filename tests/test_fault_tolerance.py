"""Surviving faults: kill-and-resume through BackupAndRestore, a backup
write killed midway (a dead peer: tests/test_fault_phases.py, in
`make test-faults`). Real worker processes on 127.0.0.1, each
under a timeout, all reaped."""

import json
import os
import re
import signal
import subprocess
import sys
import textwrap

import pytest

from conftest import BACKEND
from test_multi_worker import ROOT

RESUME_WORKER = os.path.join(ROOT, "tests", "workers", "mw_resume.py")


def _env(**extra):
    return dict(
        os.environ,
        KERAS_BACKEND=BACKEND,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        **extra,
    )


@pytest.mark.starts_processes
@pytest.mark.parametrize(
    "signal_name",
    [
        "KILL",
        pytest.param(
            "TERM",
            marks=pytest.mark.extended(
                "the second signal for the same job: make test runs SIGKILL here, and SIGTERM's save-and-restart "
                "in tests/test_preemption.py's 2-worker job"
            ),
        ),
    ],
)
def test_killed_or_terminated_worker_resumes_through_backup_and_restore(tmp_path, signal_name):
    """Worker 1 gets SIGKILL or SIGTERM in epoch 2; the launcher restarts the
    job, which resumes from the chief's epoch-1 backup and ends with the
    weights of an uninterrupted single-device run. SIGTERM (what
    Kubernetes, SLURM and spot VMs send first) stops every worker after the
    same step, and each exits 42 (it used to be ignored during fit)."""
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND,
         "--max-restarts", "1", "--timeout", "240", RESUME_WORKER, str(tmp_path), "1", "60", "1", signal_name],
        capture_output=True, text=True, timeout=300, env=_env(), cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    if signal_name == "KILL":
        assert "worker 1 exited with code 137" in done.stderr + done.stdout
    else:
        stops = sorted(line for line in done.stderr.splitlines() if line.startswith("[worker ") and "SIGTERM reached" in line)
        assert len(stops) == 2, done.stderr[-3000:]
        found = [re.fullmatch(rf"\[worker {index}\] keras_dist: worker {index} of 2: SIGTERM reached worker 1; every "
                              r"worker stops (after step (\d+) of epoch 2|at the end of epoch 2) and exits with code 42 "
                              r"\(restart the job to resume from the last epoch's BackupAndRestore backup\)\.", line)
                 for index, line in enumerate(stops)]
        assert all(found), stops
        where = {match.group(1) for match in found}
        assert len(where) == 1, stops  # the same step on both
        step = found[0].group(2)
        assert step is None or 6 <= int(step) <= 13, stops  # after the signal (step 6)
        resumed_at = 1 if step is not None else 2  # mid-epoch: epoch 2 again; at its end: epoch 3
        assert re.search(r"worker [01] exited with code 42; restarting the job \(attempt 1/1\)", done.stderr)
    for index in range(2):
        result = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert result["attempt"] == 1
        expected = [1, 2] if signal_name == "KILL" else list(range(resumed_at, 3))
        assert result["epochs_run"] == expected  # the earlier epochs came from the backup
        assert result["weight_diff"] <= 1e-5
    assert not (tmp_path / "backup").exists()  # deleted by the chief at the end


KILLED_MID_WRITE = textwrap.dedent(
    """
    import os, signal, sys
    import numpy as np, keras, keras_dist
    keras_dist.simulate_cpu_devices(2)
    backup_dir = sys.argv[1]
    saves = []
    original = keras.Model.save_weights

    def save_weights(self, filepath, *args, **kwargs):
        saves.append(filepath)
        if len(saves) == 2:  # the epoch-2 backup: half a file, then death
            with open(filepath, "wb") as handle:
                handle.write(b"\\x89HDF\\r\\n")
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, filepath, *args, **kwargs)

    keras.Model.save_weights = save_weights
    strategy = keras_dist.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    x = np.ones((16, 4), "float32")
    model.fit(x, x[:, :1], batch_size=5, epochs=3, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(backup_dir)])
    """
)


@pytest.mark.starts_processes
def test_backup_killed_mid_write_leaves_the_previous_one(tmp_path, mirrored):
    import keras

    backup_dir = tmp_path / "backup"
    done = subprocess.run(
        [sys.executable, "-c", KILLED_MID_WRITE, str(backup_dir)],
        capture_output=True, text=True, timeout=180, env=_env(),
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-3000:]
    assert json.loads((backup_dir / "training_metadata.json").read_text())["epoch"] == 1
    assert [p.name for p in backup_dir.glob("*.tmp-*")]  # the torn write, not renamed

    epochs = []
    strategy = mirrored(2)
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    record = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: epochs.append(epoch))
    x = __import__("numpy").ones((16, 4), "float32")
    backup = keras.callbacks.BackupAndRestore(str(backup_dir), delete_checkpoint=False)
    model.fit(x, x[:, :1], batch_size=5, epochs=3, verbose=0, callbacks=[backup, record])
    assert epochs == [1, 2]  # resumed after the last whole backup
    assert sorted(p.name for p in backup_dir.iterdir()) == ["latest.weights.h5", "training_metadata.json"]
