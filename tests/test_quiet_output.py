"""What a user sees on the terminal: keras_dist's one note (a single device
found by `MirroredStrategy()`), once, and no engine log lines it causes.
(The multi-worker example's output: `tests/test_multi_worker.py`.)"""

import logging
import os
import re
import subprocess
import sys
import textwrap

import pytest

import keras_dist
from keras_dist.strategies import _mirrored
from conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOTE = "MirroredStrategy() found one device"
#: A C++ log line of TensorFlow, XLA or absl ("I0000 00:00:...", "W1231 ..."),
#: or absl's notice before its logging starts.
ENGINE_LOG_LINE = re.compile(r"^([IWEF]\d{4} \d\d:\d\d:\d\d|WARNING: All log messages before absl)", re.M)


def _run(script: str, **env) -> subprocess.CompletedProcess:
    environ = {k: v for k, v in os.environ.items() if k not in ("XLA_FLAGS", "TF_CPP_MIN_LOG_LEVEL")}
    environ.update(KERAS_BACKEND=BACKEND, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]), **env)
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(script)], capture_output=True, text=True, timeout=240, env=environ
    )


@pytest.mark.starts_processes
def test_one_device_mirrored_strategy_says_so_once():
    """With one visible device, `MirroredStrategy()` warns once per process
    (on stderr, with Python's default logging), naming
    `simulate_cpu_devices`; named devices never do."""
    done = _run(
        """
        import keras_dist
        keras_dist.MirroredStrategy(["cpu:0"])
        print("named devices: done", flush=True)
        for _ in range(3):
            assert keras_dist.MirroredStrategy().num_replicas_in_sync == 1
        """,
        TF_CPP_MIN_LOG_LEVEL="3",
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr.count(NOTE) == 1, done.stderr
    assert "keras_dist.simulate_cpu_devices(n) before the backend starts" in done.stderr


def test_no_note_with_several_devices_or_named_devices(caplog, monkeypatch):
    monkeypatch.setattr(_mirrored, "_noted_one_replica", False)
    with caplog.at_level(logging.INFO, logger="keras_dist"):
        assert keras_dist.MirroredStrategy().num_replicas_in_sync == 4
        keras_dist.MirroredStrategy(["cpu:0"])
    assert not caplog.records


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND != "jax", reason="a JAX user's output")
@pytest.mark.needs_tensorflow
def test_jax_training_on_tf_data_prints_no_tensorflow_log_lines_of_its_own():
    """On JAX, with TF_CPP_MIN_LOG_LEVEL unset, training on tf.data under a
    strategy puts no TensorFlow or XLA C++ log line on the terminal that the
    same program in plain Keras does not print (keras_dist imports no
    TensorFlow itself). What plain Keras prints depends on the machine: on
    CPUs where TensorFlow turns oneDNN on, its import announces it."""
    program = """
        import keras, numpy as np
        import keras_dist
        keras_dist.simulate_cpu_devices(2)
        import tensorflow as tf
        strategy = keras_dist.MirroredStrategy() if DISTRIBUTED else keras_dist.get_strategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)])
            model.compile(optimizer="sgd", loss="mse")
        x = np.ones((20, 4), "float32")
        dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(5)
        model.fit(dataset, epochs=2, verbose=0)
        model.predict(dataset.map(lambda a, b: a), verbose=0)
        print("trained", strategy.num_replicas_in_sync)
        """

    def engine_lines(distributed):
        done = _run(f"DISTRIBUTED = {distributed}\n" + textwrap.dedent(program))
        assert done.returncode == 0 and "trained" in done.stdout, done.stderr[-3000:]
        lines = [line for line in (done.stdout + done.stderr).splitlines() if ENGINE_LOG_LINE.match(line)]
        # the message, without the time stamp and thread id
        return done, sorted(re.sub(r"^[IWEF]\d{4} [\d:. ]+\s+\d+ ", "", line) for line in lines)

    plain, plain_lines = engine_lines(False)
    done, lines = engine_lines(True)
    assert "trained 1" in plain.stdout and "trained 2" in done.stdout
    assert lines == plain_lines, done.stderr


@pytest.mark.starts_processes
def test_tensorflow_messages_name_the_user_s_strategy_not_a_private_class():
    """tf names the strategy's class in its messages ("Using %s eagerly has
    significant overhead"): the user's MirroredStrategy, not keras_dist's
    private engine class."""
    if BACKEND != "tensorflow":
        pytest.skip("a TensorFlow message (JAX has no eager strategy.run warning)")
    done = _run(
        """
        import keras_dist
        keras_dist.simulate_cpu_devices(2)
        print(keras_dist.MirroredStrategy().run(lambda: 1.0))
        """
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "Using MirroredStrategy eagerly has significant overhead" in done.stderr, done.stderr[-3000:]
    assert "_GlobalBatch" not in done.stdout + done.stderr
