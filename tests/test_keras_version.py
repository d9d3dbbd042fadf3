"""The installed Keras is inside the range pyproject.toml declares."""

import os
import pathlib
import re

import keras
import pytest

PYPROJECT = pathlib.Path(__file__).resolve().parents[1] / "pyproject.toml"


def _version_tuple(text):
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def test_keras_version_in_declared_range():
    declared = re.search(r'"keras>=([\d.]+),<([\d.]+)"', PYPROJECT.read_text())
    assert declared, "pyproject.toml must declare keras>=LOW,<HIGH"
    low, high = (_version_tuple(v) for v in declared.groups())
    installed = _version_tuple(keras.version())
    assert low <= installed < high, (keras.version(), declared.group(0))


def test_keras_version_is_the_one_under_test():
    expected = os.environ.get("KERAS_DIST_EXPECT_KERAS")
    if expected is None:
        expected = re.search(
            r"^keras==([\d.]+)$",
            (PYPROJECT.parent / "requirements" / "constraints.txt").read_text(),
            re.M,
        ).group(1)
    assert keras.version() == expected


NIGHTLY_DIR = PYPROJECT.parent / ".venv-keras-nightly"

_NIGHTLY_SAMPLE = """
import json, keras, numpy as np, keras_dist
backend = keras.config.backend()
if backend != "torch":
    keras_dist.simulate_cpu_devices(2)
from keras_dist import _hooks
def build():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    return model
x = np.random.RandomState(0).rand(32, 4).astype("float32"); y = x.sum(1, keepdims=True)
reference = build(); reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
with keras_dist.MirroredStrategy(["cpu:0"] if backend == "torch" else ["cpu:0", "cpu:1"]).scope():
    model = build()
model.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
print(json.dumps({"keras": keras.version(), "hooks": len(_hooks.ORIGINALS),
                  "diff": max(float(np.max(np.abs(a - b))) for a, b in zip(reference.get_weights(), model.get_weights()))}))
"""


@pytest.mark.starts_processes
def test_the_next_keras_sample():
    """make test's sample of `make test-keras-nightly`: under Keras 3.16
    (keras-nightly, overlaid), every hook installs (names through the one
    version switch, signatures checked) and a strategy trains as one device."""
    import json
    import subprocess
    import sys

    if os.environ.get("KERAS_DIST_EXPECT_KERAS"):
        pytest.skip("an overlaid Keras run (make test-keras-min / -nightly) tests that Keras itself")
    version = re.search(r"^KERAS_NIGHTLY := (\S+)$", (PYPROJECT.parent / "Makefile").read_text(), re.M).group(1)
    assert (NIGHTLY_DIR / "keras").is_dir(), f"{NIGHTLY_DIR} is missing: `make test` installs it (keras-nightly=={version})"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(NIGHTLY_DIR), str(PYPROJECT.parent)]), TF_CPP_MIN_LOG_LEVEL="3")
    done = subprocess.run([sys.executable, "-c", _NIGHTLY_SAMPLE], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report["keras"] == version and report["hooks"] > 20, report
    assert report["diff"] < 1e-5, report
