"""A single-backend install: `pip install ".[jax]"` without tensorflow, or
`".[tensorflow]"` without jax.

`make test-jax` and `make test-tensorflow` run the suite in such a venv
(`.venv-jax`, `.venv-tensorflow`) with KERAS_DIST_SINGLE_BACKEND set to its
backend; the first test then checks that the other backend's package really
is absent, so those targets cannot pass in a venv that has both. The others
run the installed `keras-dist` command (the console script, not
`python -m`) with KERAS_BACKEND unset, as a user's shell has it.
"""

import importlib.metadata
import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND

#: The backend of the single-backend venv this run is meant for (set by make).
SINGLE = os.environ.get("KERAS_DIST_SINGLE_BACKEND")
OTHER = {"jax": "tensorflow", "tensorflow": "jax"}

WORKER = """
import os
import keras, keras_dist
print("worker", os.environ["KERAS_DIST_WORKER_INDEX"], "of", os.environ["KERAS_DIST_NUM_WORKERS"],
      "on", keras.config.backend())
"""


def test_the_other_backend_is_not_installed():
    if SINGLE is None:
        pytest.skip("KERAS_DIST_SINGLE_BACKEND is not set: not a single-backend run (make test-jax / test-tensorflow)")
    assert SINGLE == BACKEND, f"KERAS_DIST_SINGLE_BACKEND={SINGLE} but the backend is {BACKEND}"
    assert importlib.util.find_spec(SINGLE) is not None
    assert importlib.util.find_spec(OTHER[SINGLE]) is None, (
        f"{OTHER[SINGLE]} is installed in {sys.prefix}: this is not a {SINGLE}-only venv"
    )
    assert importlib.metadata.version("keras-dist")  # installed, not just on the path


def _keras_dist(*args, cwd, timeout=120) -> subprocess.CompletedProcess:
    """Runs this venv's `keras-dist` command with KERAS_BACKEND unset."""
    command = Path(sys.executable).parent / "keras-dist"
    assert command.is_file(), f"no keras-dist command in {command.parent}: is keras-dist installed here?"
    env = {k: v for k, v in os.environ.items() if k not in ("KERAS_BACKEND", "PYTHONPATH")}
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    return subprocess.run(
        [str(command), *map(str, args)], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def _output(done: subprocess.CompletedProcess) -> str:
    return f"exit code {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


@pytest.mark.starts_processes
def test_command_help(tmp_path):
    for args, expected in [((), "launch"), (("launch",), "--num-workers"), (("bench",), "--replicas")]:
        done = _keras_dist(*args, "--help", cwd=tmp_path, timeout=60)
        assert done.returncode == 0 and expected in done.stdout, _output(done)


@pytest.mark.starts_processes
def test_command_launches_workers_on_this_backend(tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    done = _keras_dist("launch", "-n", "2", "--backend", BACKEND, "--timeout", "120", worker, cwd=tmp_path, timeout=180)
    assert done.returncode == 0, _output(done)
    for index in range(2):
        assert f"worker {index} of 2 on {BACKEND}" in done.stdout, _output(done)


@pytest.mark.starts_processes
def test_command_bench_defaults_to_the_installed_backend(tmp_path):
    """With KERAS_BACKEND unset and no --backend, `bench` takes the backend
    that is installed (in a venv with both: pass it)."""
    backend = [] if SINGLE else ["--backend", BACKEND]
    done = _keras_dist(
        "bench", *backend, "--replicas", "2", "--batch-size", "16", "--steps", "2", "--no-reference",
        cwd=tmp_path, timeout=300,
    )
    assert done.returncode == 0, _output(done)
    assert f"keras-dist bench: mlp, 2 replica(s) (simulated CPU devices, strategy mirrored) on {BACKEND}" in done.stdout
    assert f"ScalingReport: 2 replica(s) on {BACKEND}" in done.stdout, _output(done)
