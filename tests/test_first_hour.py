"""What a new user's first multi-worker program gets wrong, answered before
any state changes, on every backend (issue #53's silent cases).

One 2-worker job per backend (tests/workers/mw_first_hour.py, through
`keras-dist launch`, once for this module): a one-process strategy inside
the job, uneven gathers, every worker saving to one path, `fit` with other
rows or epochs on one worker, and a different model on one worker. In one
process: gathers of uneven shards (JAX and TensorFlow simulate devices) and
the torch backend's device messages.
"""

import json
import os
import subprocess
import sys

import keras
import numpy as np
import pytest

import keras_dist
from conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "workers", "mw_first_hour.py")


@pytest.fixture(scope="module")
def first_hour_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("first-hour")
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND, "--max-time", "240", WORKER, str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out, [json.load(open(out / f"worker{i}.json")) for i in range(2)]


def _raised(outcome, kind, text):
    assert outcome[0] == "raised" and outcome[1] == kind and text in outcome[2], outcome


@pytest.mark.starts_processes
def test_a_one_process_strategy_in_a_multi_worker_job_is_refused(first_hour_job):
    for report in first_hour_job[1]:
        for name in ("mirrored", "one_device"):
            _raised(report[name], "ValueError", "in a multi-worker job")
            assert "keras_dist.MultiWorkerMirroredStrategy()" in report[name][2]


@pytest.mark.starts_processes
def test_uneven_gathers_are_exact_or_one_clear_error_everywhere(first_hour_job):
    want = (np.arange(42, dtype="float32").reshape(7, 6) * 2).tolist()
    for report in first_hour_job[1]:
        assert report["gather_axis0"] == want
        _raised(report["gather_axis1"], "ValueError", "Cannot gather along axis 1")
        assert "(4, 6) float32" in report["gather_axis1"][2] and "(3, 6) float32" in report["gather_axis1"][2]
        assert report["gather_after_error"] == want  # the job's collectives still work


@pytest.mark.starts_processes
def test_every_worker_saving_to_one_path_leaves_the_chief_s_whole_file(first_hour_job):
    """Every worker calls save_weights and save on one path, three times:
    only the chief writes (before: a lock error on one worker, and a torn
    file that loaded with wrong BatchNorm weights)."""
    for report in first_hour_job[1]:
        assert report["save_weights_diff"] == 0.0 and report["save_diff"] == 0.0
        assert report["files"] == ["shared.keras", "shared.weights.h5"]  # no temporary or private file left


@pytest.mark.starts_processes
@pytest.mark.skipif(not hasattr(keras.callbacks, "OrbaxCheckpoint"), reason="Keras before 3.13 has no OrbaxCheckpoint")
def test_orbax_checkpoint_in_a_multi_worker_job_is_one_clear_error(first_hour_job):
    """Every worker would write its own Orbax checkpoint into one directory
    (a torn checkpoint): refused on every worker before any step, naming
    the chief-aware callbacks."""
    for report in first_hour_job[1]:
        _raised(report["orbax"], "ValueError", "OrbaxCheckpoint under a MultiWorkerMirroredStrategy job of 2 processes")
        assert "keras.callbacks.BackupAndRestore" in report["orbax"][2]
        assert report["orbax_unchanged"] == 0.0
        assert report["orbax_wrote"] == []  # no checkpoint step written


@pytest.mark.starts_processes
def test_other_rows_or_epochs_on_one_worker_fail_before_any_step(first_hour_job):
    for report in first_hour_job[1]:
        _raised(report["rows_differ"], "ValueError", "x: worker 0 64 rows or batches, worker 1 48 rows or batches")
        _raised(report["epochs_differ"], "ValueError", "epochs: worker 0 1, worker 1 2")
        assert report["unchanged"] == 0.0  # nothing trained
        assert report["same_call_trains"] == ["ok"]


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND != "torch", reason="torch: keras_dist's step under processes runs one batch a call")
def test_torch_several_steps_per_call_under_processes_is_one_clear_error(first_hour_job):
    for report in first_hour_job[1]:
        _raised(report["steps_per_execution"], "ValueError", "`steps_per_execution` must be 1 with the PyTorch backend")
        assert report["steps_per_execution_unchanged"] == 0.0


@pytest.mark.starts_processes
def test_a_different_model_on_one_worker_is_one_error_on_every_worker(first_hour_job):
    for report in first_hour_job[1]:
        if BACKEND == "tensorflow":  # tf's own variable broadcast checks shapes: its error, on every worker
            # (InvalidArgumentError "Shape mismatch", or, where a peer aborted the collective first,
            # UnavailableError naming it)
            assert report["architecture"][0] == "raised", report["architecture"]
            assert report["architecture"][1] in ("InvalidArgumentError", "UnavailableError"), report["architecture"]
            assert "Collective" in report["architecture"][2] or "collective" in report["architecture"][2]
        else:
            _raised(report["architecture"], "ValueError", "The workers built different models")
            assert "(5, 8) float32" in report["architecture"][2] and "(5, 6) float32" in report["architecture"][2]


@pytest.mark.skipif(BACKEND == "torch", reason="torch: one replica per process (the 2-worker job above gathers)")
def test_uneven_gather_in_one_process(mirrored):
    """7 rows over 2 replicas: along axis 0 exact; along axis 1 one clear
    error before any collective (TensorFlow's own came from inside one and
    left the strategy's collectives unusable), and the strategy works after."""
    strategy = mirrored(2)
    x = np.arange(42, dtype="float32").reshape(7, 6)
    (xb,) = next(iter(strategy.experimental_distribute_dataset([(x,)])))
    doubled = strategy.run(lambda a: a * 2.0, args=(xb,))
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(strategy.gather(doubled, axis=0)), x * 2)
    with pytest.raises(ValueError, match=r"Cannot gather along axis 1: .*replica 0: \(4, 6\) float32, replica 1: \(3, 6\)"):
        strategy.gather(doubled, axis=1)
    np.testing.assert_array_equal(keras.ops.convert_to_numpy(strategy.gather(doubled, axis=-2)), x * 2)
    total = strategy.reduce("SUM", strategy.run(lambda a: keras.ops.sum(a), args=(xb,)), axis=None)
    assert float(keras.ops.convert_to_numpy(total)) == float(x.sum())


@pytest.mark.skipif(BACKEND != "torch", reason="the torch backend's messages")
def test_torch_device_messages_name_the_launcher():
    with pytest.raises(ValueError, match="keras-dist launch -n N --backend torch") as error:
        keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
    assert "simulate_cpu_devices" not in str(error.value)  # itself an error on torch


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's inter-op pool (a TensorFlow process)")
@pytest.mark.starts_processes
def test_too_small_an_inter_op_pool_for_the_cpu_replicas_is_one_clear_error_not_a_hang():
    """tf-keras's ctl_correctness port hung at Mirrored(2) with an iterator
    made inside a tf.function (plain tf.distribute too, with TF's default
    pool on 2 cores): replicas + 1 inter-op threads are needed. Too few is
    one error at the strategy, naming the fix; enough runs the program."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env.pop("TF_NUM_INTEROP_THREADS", None)
    script = os.path.join(ROOT, "tests", "workers", "tf_inter_op_threads.py")
    reports = {}
    for threads in (2, 3):
        done = subprocess.run([sys.executable, script, str(threads)], env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
        reports[threads] = json.loads(done.stdout.strip().splitlines()[-1])
    assert "set_inter_op_parallelism_threads(3)" in reports[2]["error"], reports[2]
    assert reports[3]["error"] is None and reports[3]["w"] == pytest.approx(1 + 4 * 32 / 1000.0), reports[3]
