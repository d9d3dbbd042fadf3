"""`keras_dist.experimental.PreemptionCheckpointHandler` and
`TerminationConfig` (tf.distribute.experimental's), on both backends.

Single-process: the config's checks, a notice (a `termination_watcher_fn`,
SIGTERM) saving at the agreed step and calling `exit_fn`, restoring on
construction, `total_run_calls`, the grace period, atomic writes, bad
inputs. Then one real 2-worker job through `keras-dist launch -n 2
--max-restarts 1`: SIGTERM to one worker mid-training, both save once at
the same step and exit 42, and the restarted job resumes there and ends
with the same weights as an uninterrupted run (bitwise).
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time

import keras
import numpy as np
import pytest

import keras_dist
from conftest import BACKEND
from keras_dist import _preemption
from keras_dist.cluster_resolver import ClusterSpec, SimpleClusterResolver

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "workers", "mw_preemption.py")


class Stop(Exception):
    """Raised by the tests' exit_fn, in place of leaving the process."""


@pytest.fixture(autouse=True)
def _keep_sigterm_and_fast_watchers(monkeypatch):
    """Handlers install a SIGTERM handler: put the process's back afterwards.
    Watcher functions are polled every 10 ms here (1 s by default)."""
    previous = signal.getsignal(signal.SIGTERM)
    monkeypatch.setattr(_preemption, "_WATCH_INTERVAL_SECONDS", 0.01)
    yield
    signal.signal(signal.SIGTERM, previous)


def _data(rows=32):
    rng = np.random.default_rng(0)
    x = rng.normal(size=(rows, 4)).astype("float32")
    return x, (x[:, :1] - x[:, 1:2]).astype("float32")


def _model(strategy):
    with strategy.scope():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="relu"), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.Adam(0.05), loss="mse")
    return model


def _step(model, x, y):
    """One training step: the `distributed_train_function` of these tests."""
    return model.train_on_batch(x, y)


def _weights_in(path, strategy):
    model = _model(strategy)
    with strategy.scope():
        model.optimizer.build(model.trainable_variables)
    model.load_weights(path)
    return model


def _same(a, b):
    return all(np.array_equal(u, v) for u, v in zip(a.get_weights(), b.get_weights()))


def _stopper(calls):
    def exit_fn():
        calls.append("exit")
        raise Stop()

    return exit_fn


def test_exported_from_experimental():
    from keras_dist import experimental

    assert experimental.PreemptionCheckpointHandler is _preemption.PreemptionCheckpointHandler
    assert experimental.TerminationConfig is _preemption.TerminationConfig
    assert {"PreemptionCheckpointHandler", "TerminationConfig"} <= set(experimental.__all__)


def test_termination_config_checks_its_arguments():
    config = keras_dist.experimental.TerminationConfig()
    assert (config.termination_watcher_fn, config.exit_fn, config.grace_period, config.save_fn) == (None,) * 4
    watcher, leave = (lambda: False), (lambda: None)
    config = keras_dist.experimental.TerminationConfig(watcher, leave, 2.5, None)
    assert (config.termination_watcher_fn, config.exit_fn, config.grace_period) == (watcher, leave, 2.5)
    assert "grace_period=2.5" in repr(config)
    for name in ("termination_watcher_fn", "exit_fn", "save_fn"):
        with pytest.raises(TypeError, match=f"{name} must be a function"):
            keras_dist.experimental.TerminationConfig(**{name: 42})
    for bad in ("10", True, [1]):
        with pytest.raises(TypeError, match="grace_period must be a number of seconds"):
            keras_dist.experimental.TerminationConfig(grace_period=bad)
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="grace_period must be a finite number of seconds >= 0"):
            keras_dist.experimental.TerminationConfig(grace_period=bad)
    assert keras_dist.experimental.TerminationConfig(grace_period=0).grace_period == 0
    assert _preemption.RESTART_EXIT_CODE == 42  # tf's sys.exit(42)


def test_watcher_fn_notice_saves_at_the_agreed_step_and_exits(tmp_path, mirrored):
    strategy = mirrored(2)
    model = _model(strategy)
    x, y = _data()
    steps, calls = [], []

    def train_step(x, y):
        steps.append(len(steps))
        return _step(model, x, y)

    config = keras_dist.experimental.TerminationConfig(
        termination_watcher_fn=lambda: len(steps) >= 3, exit_fn=_stopper(calls)
    )
    handler = keras_dist.experimental.PreemptionCheckpointHandler(
        None, model, tmp_path, termination_config=config
    )
    assert handler.total_run_calls == 0
    with pytest.raises(Stop), handler.watch_preemption_scope():  # tf's TPU scope: errors pass through
        for _ in range(500):
            handler.run(train_step, x, y)
            time.sleep(0.005)
    stopped = handler.total_run_calls
    assert stopped == len(steps) >= 3 and calls == ["exit"]
    # exactly one checkpoint, of the agreed run, holding the weights then
    assert sorted(os.listdir(tmp_path)) == [f"ckpt-{stopped}.weights.h5"]
    assert _same(_weights_in(tmp_path / f"ckpt-{stopped}.weights.h5", strategy), model)
    # exit_fn returned control (it raised): the handler watches no more
    assert handler.run(train_step, x, y) is not None and calls == ["exit"]
    assert handler.total_run_calls == stopped + 1


def test_sigterm_exits_42_before_the_next_step(tmp_path, caplog):
    strategy = keras_dist.get_strategy()
    model = _model(strategy)
    x, y = _data()
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, model, str(tmp_path))
    for _ in range(2):
        handler.run(_step, model, x, y)
    before = model.get_weights()
    os.kill(os.getpid(), signal.SIGTERM)  # taken by the handler: the process lives on
    with caplog.at_level(logging.WARNING, "keras_dist"), pytest.raises(SystemExit) as exit_:
        handler.run(pytest.fail, "the step after the notice must not run")
    assert exit_.value.code == 42
    assert handler.total_run_calls == 2
    assert os.listdir(tmp_path) == ["ckpt-2.weights.h5"]
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))
    assert "termination notice; saved the checkpoint of run 2" in caplog.text


def test_restore_on_construction_continues_training_exactly(tmp_path, mirrored):
    """A fresh program restores the newest checkpoint (weights and optimizer
    state), `total_run_calls` goes on from its run count, and the rest of
    the training ends where an uninterrupted run does."""
    strategy = mirrored(2)
    x, y = _data()
    steps = 7
    uninterrupted = _model(strategy)
    for _ in range(steps):
        _step(uninterrupted, x, y)

    first = _model(strategy)
    calls = []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls))
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, first, tmp_path, config)
    for _ in range(3):
        handler.run(_step, first, x, y)
    handler._take_notice()  # what SIGTERM or a watcher does
    with pytest.raises(Stop):
        handler.run(_step, first, x, y)

    second = _model(strategy)  # the restarted program: fresh weights, optimizer not built
    assert not second.optimizer.built and not _same(second, first)
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, second, tmp_path, config)
    assert handler.total_run_calls == 3 and _same(second, first)
    assert int(keras.ops.convert_to_numpy(second.optimizer.iterations)) == 3
    while handler.total_run_calls < steps:
        handler.run(_step, second, x, y)
    assert _same(second, uninterrupted)  # bitwise: the same computation, resumed


class _Clock:
    """`time` for `_preemption`: `monotonic()` moves only when a run says
    so, so the runs in a grace period do not depend on the machine's load
    (on a loaded machine a real run took a third of the grace period)."""

    def __init__(self):
        self.now = 1000.0

    def monotonic(self):
        return self.now


def test_grace_period_saves_at_once_then_again_before_it_ends(tmp_path, mirrored, monkeypatch):
    """Runs of 0.1 s, a grace period of 2 s: saved at the notice, trained on
    while more than tf's margin (6 mean runs: 0.6 s) is left, saved again
    with 0.6 s left (14 runs later), then exit_fn."""
    clock = _Clock()
    monkeypatch.setattr(_preemption, "time", clock)

    def step(model, x, y):
        clock.now += 0.1
        return _step(model, x, y)

    strategy = mirrored(2)
    model = _model(strategy)
    x, y = _data()
    saved, calls = [], []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls), grace_period=2)
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, model, tmp_path, config)
    store_save = handler._store.save
    handler._store.save = lambda runs, *rest: saved.append(runs) or store_save(runs, *rest)
    for _ in range(10):
        handler.run(step, model, x, y)
    handler._take_notice()
    notice_at = clock.now
    with pytest.raises(Stop):
        for _ in range(100):
            handler.run(step, model, x, y)
    first, final = saved
    assert first == 10 and final == handler.total_run_calls  # saved at the notice, then at the end
    assert final - first == 14, saved  # trained on until 0.6 s (6 runs) of the 2 s were left
    assert clock.now - notice_at == pytest.approx(1.4) and calls == ["exit"]
    assert os.listdir(tmp_path) == [f"ckpt-{final}.weights.h5"]  # the first one removed


class JsonState:
    """A keras_dist-friendly checkpoint: any object with save/restore."""

    def __init__(self, as_directory=False):
        self.value = {"step": 0}
        self.as_directory = as_directory
        self.saved_args = None

    def save(self, path, *args, **kwargs):
        self.saved_args = (args, kwargs)
        if self.as_directory:
            os.makedirs(path)
            path = os.path.join(path, "state.json")
        with open(path, "w") as handle:
            json.dump(self.value, handle)

    def restore(self, path):
        if self.as_directory:
            path = os.path.join(path, "state.json")
        with open(path) as handle:
            self.value = json.load(handle)


@pytest.mark.parametrize("as_directory", [False, True], ids=["file", "directory"])
def test_save_checkpoint_if_preempted_with_an_object_of_save_and_restore(tmp_path, as_directory):
    """Without `run`: each call counts one unit of training, which the
    checkpoint then holds; the save's arguments reach `save`."""
    state, calls = JsonState(as_directory), []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls))
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, state, tmp_path, config)
    for _ in range(4):
        state.value["step"] += 1
        handler.save_checkpoint_if_preempted("extra", flag=True)
    handler._take_notice()
    state.value["step"] += 1
    with pytest.raises(Stop):
        handler.save_checkpoint_if_preempted("extra", flag=True)
    assert os.listdir(tmp_path) == ["ckpt-5"] and state.saved_args == (("extra",), {"flag": True})
    restored = JsonState(as_directory)
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, restored, tmp_path, config)
    assert handler.total_run_calls == 5 and restored.value == {"step": 5}
    # notice before any further run: the same run count is saved again, in place
    handler._take_notice()
    with pytest.raises(Stop):
        handler.run(lambda: None)
    assert os.listdir(tmp_path) == ["ckpt-5"]
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, JsonState(as_directory), tmp_path, config)
    assert handler.total_run_calls == 5


def test_a_directory_checkpoint_moved_aside_is_still_found(tmp_path):
    """Saving a directory checkpoint over one of the same run count moves the
    old one aside first (one rename cannot replace a directory): a process
    killed between the two renames leaves it there, and it is restored."""
    state = JsonState(as_directory=True)
    state.value = {"step": 5}
    state.save(str(tmp_path / ".ckpt-5.tmp-99999-replaced"))
    os.makedirs(tmp_path / ".ckpt-6.tmp-99999")  # a torn write, never restored
    restored, calls = JsonState(as_directory=True), []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls))
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, restored, tmp_path, config)
    assert handler.total_run_calls == 5 and restored.value == {"step": 5}
    handler._take_notice()
    with pytest.raises(Stop):
        handler.run(lambda: None)
    assert os.listdir(tmp_path) == ["ckpt-5"]


def test_a_torn_write_leaves_the_previous_checkpoint(tmp_path):
    """A save that dies half way (an error here; a killed process leaves the
    same files) never replaces the committed checkpoint: restoring finds
    the previous one, and the next save clears the leftovers."""
    state, calls = JsonState(), []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls), grace_period=1000)
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, state, tmp_path, config)
    handler.run(lambda: None)
    handler._take_notice()
    handler.run(lambda: None)  # saves ckpt-1; the grace period goes on
    assert os.listdir(tmp_path) == ["ckpt-1"]

    def torn(path, *args, **kwargs):
        with open(path, "w") as handle:
            handle.write('{"step": ')
        raise OSError("disk full")

    state.save = torn
    handler._grace_period = 0  # the grace period is over: save and exit
    handler._countdown = False
    with pytest.raises(OSError, match="disk full"):
        handler.run(lambda: None)
    assert calls == []  # no exit without a checkpoint
    leftovers = sorted(os.listdir(tmp_path))
    assert leftovers[1] == "ckpt-1" and leftovers[0].startswith(".ckpt-2.tmp-")
    restored = JsonState()
    assert keras_dist.experimental.PreemptionCheckpointHandler(None, restored, tmp_path, config).total_run_calls == 1
    assert restored.value == {"step": 0}
    del state.save  # the object's own save again
    handler._take_notice()
    with pytest.raises(Stop):
        handler.run(lambda: None)  # the failed save's run again, whole this time
    assert os.listdir(tmp_path) == ["ckpt-2"]  # the leftovers cleared, ckpt-1 replaced


def test_bad_checkpoint_kinds_and_arguments(tmp_path, mirrored):
    model = _model(keras_dist.get_strategy())
    for bad in ({"model": model}, keras.layers.Dense(2), "checkpoint.h5", None):
        with pytest.raises(TypeError, match=r"must be a Keras model \(saved with its optimizer's state\), an object with save\(path\) and restore\(path\) methods, or, on the TensorFlow backend, a tf.train.Checkpoint"):
            keras_dist.experimental.PreemptionCheckpointHandler(None, bad, tmp_path)
    with pytest.raises(ValueError, match="with a Keras model, give checkpoint_dir"):
        keras_dist.experimental.PreemptionCheckpointHandler(None, model)
    with pytest.raises(ValueError, match="has no weights yet; build it"):
        keras_dist.experimental.PreemptionCheckpointHandler(None, keras.Sequential([keras.layers.Dense(1)]), tmp_path)
    with pytest.raises(TypeError, match="termination_config must be a keras_dist.experimental.TerminationConfig"):
        keras_dist.experimental.PreemptionCheckpointHandler(None, model, tmp_path, termination_config={"exit_fn": None})
    with pytest.raises(TypeError, match="cluster_resolver must be a keras_dist.cluster_resolver resolver"):
        keras_dist.experimental.PreemptionCheckpointHandler("worker0:1234", model, tmp_path)
    two = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1", "127.0.0.1:2"]}), task_type="worker", task_id=0)
    with pytest.raises(RuntimeError, match="create the keras_dist.MultiWorkerMirroredStrategy first"):
        keras_dist.experimental.PreemptionCheckpointHandler(two, model, tmp_path)
    ps = SimpleClusterResolver(ClusterSpec({"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}), task_type="worker", task_id=0)
    with pytest.raises(NotImplementedError, match="parameter-server"):
        keras_dist.experimental.PreemptionCheckpointHandler(ps, model, tmp_path)
    errors = []

    def in_a_thread():
        try:
            keras_dist.experimental.PreemptionCheckpointHandler(None, model, tmp_path)
        except RuntimeError as error:
            errors.append(str(error))

    thread = threading.Thread(target=in_a_thread)
    thread.start()
    thread.join(60)
    assert errors and "main thread" in errors[0] and "termination_watcher_fn" in errors[0]
    assert not os.listdir(tmp_path)  # nothing written by any refused handler


def test_a_save_that_writes_elsewhere_and_a_failing_watcher_are_errors(tmp_path):
    class Elsewhere(JsonState):
        def save(self, path, *args, **kwargs):
            super().save(path + ".json")

    calls = []
    config = keras_dist.experimental.TerminationConfig(exit_fn=_stopper(calls))
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, Elsewhere(), tmp_path, config)
    handler._take_notice()
    with pytest.raises(RuntimeError, match=r"wrote nothing at that path; save\(path\) must write exactly there"):
        handler.run(lambda: None)
    assert calls == []

    def watcher():
        raise ConnectionError("metadata server unreachable")

    config = keras_dist.experimental.TerminationConfig(termination_watcher_fn=watcher, exit_fn=_stopper(calls))
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, JsonState(), tmp_path / "other", config)
    handler._thread.join(10)
    with pytest.raises(RuntimeError, match="termination_watcher_fn raised: ConnectionError"):
        handler.run(lambda: None)
    assert handler.run(lambda: 5) == 5  # raised once; watching no more


def test_save_fn_replaces_the_write(tmp_path):
    """tf's save_fn: called on the agreed step instead of the handler's own
    write, with the arguments of `save_checkpoint_if_preempted`."""
    received, calls = [], []
    config = keras_dist.experimental.TerminationConfig(
        exit_fn=_stopper(calls), save_fn=lambda *args, **kwargs: received.append((args, kwargs))
    )
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, JsonState(), tmp_path, config)
    handler._take_notice()
    with pytest.raises(Stop):
        handler.save_checkpoint_if_preempted(7, number=3)
    assert received == [((7,), {"number": 3})] and calls == ["exit"] and not os.listdir(tmp_path)


def test_values_from_every_worker_outside_a_job():
    from keras_dist.backends import get_adapter

    (stacked,) = get_adapter().values_from_every_worker([np.array([3, 4], np.int64)])
    assert stacked.shape == (1, 2) and stacked.tolist() == [[3, 4]]


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.train.Checkpoint is TensorFlow's")
def test_tf_checkpoint_manager_and_termination_config(tmp_path, mirrored):
    """On TensorFlow, tf's own objects: a `tf.train.Checkpoint` (with
    `checkpoint_dir`, as tf requires), a `tf.train.CheckpointManager`, and
    tf's `TerminationConfig`; the run count travels in the checkpoint."""
    import tensorflow as tf

    strategy = mirrored(2)
    x, y = _data()
    calls = []
    tf_config = tf.distribute.experimental.TerminationConfig(exit_fn=_stopper(calls))
    model = _model(strategy)
    checkpoint = tf.train.Checkpoint(model=model, optimizer=model.optimizer)
    with pytest.raises(ValueError, match="checkpoint_dir must be passed as well"):
        keras_dist.experimental.PreemptionCheckpointHandler(None, checkpoint)
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, checkpoint, tmp_path / "a", tf_config)
    for _ in range(3):
        handler.run(_step, model, x, y)
    handler._take_notice()
    with pytest.raises(Stop):
        handler.run(_step, model, x, y)
    assert calls == ["exit"] and tf.train.latest_checkpoint(str(tmp_path / "a")).endswith("ckpt-1")

    restored = _model(strategy)
    with strategy.scope():
        restored.optimizer.build(restored.trainable_variables)
    manager = tf.train.CheckpointManager(
        tf.train.Checkpoint(model=restored, optimizer=restored.optimizer), str(tmp_path / "a"), max_to_keep=2
    )
    handler = keras_dist.experimental.PreemptionCheckpointHandler(None, manager, termination_config=tf_config)
    assert handler.total_run_calls == 3 and _same(restored, model)
    assert int(restored.optimizer.iterations.numpy()) == 3
    handler.run(_step, restored, x, y)
    handler._take_notice()
    with pytest.raises(Stop):
        handler.run(_step, restored, x, y)
    assert manager.latest_checkpoint.endswith("ckpt-2") and len(manager.checkpoints) == 2  # the manager's policy
    reader = tf.train.load_checkpoint(manager.latest_checkpoint)
    assert reader.get_tensor("checkpointed_runs/.ATTRIBUTES/VARIABLE_VALUE") == 4


@pytest.mark.needs_tensorflow
@pytest.mark.skipif(BACKEND != "jax", reason="on TensorFlow tf's checkpoints are taken")
def test_jax_refuses_a_tf_checkpoint_naming_what_it_takes(tmp_path):
    import tensorflow as tf

    with pytest.raises(TypeError, match=r"tf.train.Checkpoint\(...\) is a TensorFlow object, which keras_dist cannot take as a checkpoint on the JAX backend; use a Keras model"):
        keras_dist.experimental.PreemptionCheckpointHandler(None, tf.train.Checkpoint(), tmp_path)
    with pytest.raises(TypeError, match=r"use keras_dist.experimental.TerminationConfig\(...\) with the same arguments"):
        keras_dist.experimental.PreemptionCheckpointHandler(
            None, JsonState(), tmp_path, tf.distribute.experimental.TerminationConfig()
        )


# -- a real 2-worker job -------------------------------------------------------

#: Checkpoint kinds the job is run with: a Keras model on both backends, and
#: tf.train.Checkpoint on TensorFlow.
KINDS = ["model"]
if BACKEND == "tensorflow":
    KINDS.append(
        pytest.param(
            "tf_checkpoint",
            marks=pytest.mark.extended(
                "a second checkpoint kind for the same job: make test runs it with a Keras model, and "
                "tf.train.Checkpoint's preemption handling in one process (test_tf_checkpoint_manager_and_termination_config)"
            ),
        )
    )
STEPS, SIGNAL_AFTER = 40, 5


def _read(path, default=None):
    try:
        with open(path) as handle:
            return json.load(handle)
    except (OSError, ValueError):
        return default


def _stop_job(launcher, out_dir):
    """Nothing outlives the test: the launcher stops its workers on SIGTERM;
    a worker still there after that is killed by its recorded process id."""
    if launcher.poll() is None:
        launcher.terminate()
        try:
            launcher.wait(timeout=30)
        except subprocess.TimeoutExpired:
            launcher.kill()
            launcher.wait(timeout=30)
    for attempt in range(2):
        for index in range(2):
            pid = _read(out_dir / f"pid{attempt}_{index}")
            try:
                with open(f"/proc/{pid}/cmdline", "rb") as handle:
                    ours = os.path.basename(WORKER).encode() in handle.read()
            except (OSError, TypeError):
                continue
            if ours:
                os.kill(pid, signal.SIGKILL)


@pytest.mark.starts_processes
@pytest.mark.parametrize("kind", KINDS)
def test_sigterm_to_one_worker_saves_once_and_the_restarted_job_resumes(tmp_path, kind):
    """`keras-dist launch -n 2 --max-restarts 1`: SIGTERM to worker 1 in the
    middle of training; both workers stop at the same run, the chief writes
    the one checkpoint, both exit 42; the launcher restarts the job, which
    restores that run and finishes with the weights of an uninterrupted
    run of the same job (bitwise)."""
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    launcher = subprocess.Popen(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND, "--max-restarts", "1",
         "--max-time", "240", WORKER, str(tmp_path), kind, str(STEPS)],
        env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
    )
    sent_at = None
    try:
        deadline = time.monotonic() + 200
        while sent_at is None and launcher.poll() is None and time.monotonic() < deadline:
            progress = _read(tmp_path / "progress0_1", 0)
            if progress >= SIGNAL_AFTER:
                os.kill(_read(tmp_path / "pid0_1"), signal.SIGTERM)
                sent_at = progress
            time.sleep(0.02)
        output = launcher.communicate(timeout=280)[0]
    finally:
        _stop_job(launcher, tmp_path)
    assert sent_at is not None, output[-4000:]
    assert launcher.returncode == 0, output[-4000:]
    # Both exit 42; the launcher names the one it saw first.
    assert re.search(r"worker [01] exited with code 42; restarting the job \(attempt 1/1\)", output), output[-4000:]

    exits = [_read(tmp_path / f"exit0_{i}.json") for i in range(2)]
    stopped = exits[0]["runs"]
    assert exits == [{"code": 42, "runs": stopped}] * 2, exits  # both exited 42, at the same run
    assert SIGNAL_AFTER <= stopped < STEPS
    results = [_read(tmp_path / f"result1_{i}.json") for i in range(2)]
    expected = [f"ckpt-{stopped}.weights.h5"] if kind == "model" else ["checkpoint", "ckpt-1.data-00000-of-00001", "ckpt-1.index"]
    for result in results:
        assert result["found"] == expected  # exactly one checkpoint, nothing of the non-chief's
        assert result["start_runs"] == stopped and result["end_runs"] == STEPS
        assert result["weight_diff"] == 0.0 and result["iterations"] == [STEPS, STEPS]
        assert result["every_worker"] == [[0, 10], [1, 11]]
    assert [_read(tmp_path / f"exit1_{i}.json") for i in range(2)] == [{"code": 0, "runs": STEPS}] * 2
    workers_lines = "\n".join(line for line in output.splitlines() if line.startswith("[worker "))
    # once per worker (the launcher's failure report may quote it again)
    assert workers_lines.count(f"a termination notice reached worker 1; saved the checkpoint of run {stopped}") == 2
