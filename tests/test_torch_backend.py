"""The torch backend (`KERAS_BACKEND=torch`, `make test-torch`): one replica
per process (torch.distributed's model).

In one process: OneDevice, Mirrored and CentralStorage of the one device
train as plain Keras does, bit for bit, built lazily or eagerly; what torch
cannot do is one clear error. Across processes: a 2-worker job
(tests/workers/mw_torch.py, gloo on 127.0.0.1) trains an MLP with
BatchNormalization, Dropout and clipnorm through fit/evaluate/predict and a
custom loop, and each worker compares itself with one device from the same
seed; reverting any torch hook changes what that job sees.
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

pytestmark = pytest.mark.skipif(BACKEND != "torch", reason="the torch backend (make test-torch)")

HERE = os.path.dirname(os.path.abspath(__file__))
WORKER = os.path.join(HERE, "workers", "mw_torch.py")


def _data():
    rng = np.random.RandomState(0)
    x = rng.randn(50, 5).astype("float32")
    return x, (x @ rng.randn(5, 1)).astype("float32")


def _model(build):
    keras.utils.set_random_seed(3)
    layers = [keras.layers.Dense(8, activation="relu"), keras.layers.BatchNormalization(),
              keras.layers.Dropout(0.2), keras.layers.Dense(1)]
    model = keras.Sequential(([keras.Input((5,))] if build == "eager" else []) + layers)
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def _train(model):
    x, y = _data()
    history = model.fit(x, y, batch_size=16, epochs=2, shuffle=False, verbose=0).history
    return history, model.evaluate(x, y, batch_size=7, verbose=0), model.predict(x, batch_size=7, verbose=0), model.get_weights()


ONE_PROCESS = {
    "one_device": lambda: keras_dist.OneDeviceStrategy("cpu:0"),
    "mirrored": lambda: keras_dist.MirroredStrategy(),
    "central_storage": lambda: keras_dist.experimental.CentralStorageStrategy(),
    "multi_worker_of_one": lambda: keras_dist.MultiWorkerMirroredStrategy(),
}


@pytest.mark.parametrize("build", ["lazy", "eager"])
@pytest.mark.parametrize("name", sorted(ONE_PROCESS))
def test_one_process_strategies_train_as_plain_keras(name, build):
    strategy = ONE_PROCESS[name]()
    assert strategy.num_replicas_in_sync == 1
    with strategy.scope():
        model = _model(build)
    got = _train(model)
    want = _train(_model(build))
    assert got[0] == want[0] and got[1] == want[1]
    np.testing.assert_array_equal(got[2], want[2])
    for a, b in zip(got[3], want[3]):
        np.testing.assert_array_equal(a, b)


def test_one_process_custom_loop_as_plain_keras():
    strategy = keras_dist.MirroredStrategy()
    x, y = _data()
    with strategy.scope():
        model = _model("eager")
    losses = []
    for xb, yb in strategy.experimental_distribute_dataset([(x[:16], y[:16]), (x[16:26], y[16:26])]):
        def step(a, b):
            loss = keras_dist.compute_average_loss(keras.losses.mean_squared_error(b, model(a)), global_batch_size=16)
            return loss

        per_replica = strategy.run(step, args=(xb, yb))
        losses.append(float(strategy.reduce("SUM", per_replica, axis=None).detach()))
    reference = _model("eager")
    want = float(keras.ops.sum(keras.losses.mean_squared_error(y[:16], reference(x[:16]))) / 16)
    assert losses[0] == pytest.approx(want, abs=1e-6)
    assert strategy.gather(strategy.run(lambda a: a, args=(next(iter(strategy.experimental_distribute_dataset([(x[:3],)])))[0],)), axis=0).shape == (3, 5)
    assert strategy.gather(x[:2], axis=0).shape == (2, 5)  # a value not distributed comes back as it is, as in tf
    with pytest.raises(RuntimeError, match="strategy.run requires cross-replica context"):  # as in tf
        strategy.run(lambda: strategy.run(lambda: 1.0))


def test_what_torch_cannot_do_is_one_clear_error():
    with pytest.raises(ValueError, match="keras-dist launch -n 2 --backend torch"):
        keras_dist.simulate_cpu_devices(2)
    with pytest.raises(NotImplementedError, match="not supported on the torch backend"):
        keras_dist.experimental.ParameterServerStrategy(
            keras_dist.cluster_resolver.SimpleClusterResolver(
                {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"], "chief": ["127.0.0.1:3"]}, task_type="chief"
            )
        )
    strategy = keras_dist.experimental.CentralStorageStrategy()
    with strategy.scope():
        model = _model("eager")
    model.compile(optimizer="sgd", loss="mse", steps_per_execution=2)
    x, y = _data()
    from keras_dist._keras_names import keras_version

    if keras_version() >= (3, 16):  # Keras 3.16's torch trainer runs several steps per call: as one per call
        def no_dropout():
            keras.utils.set_random_seed(3)
            with strategy.scope():
                built = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                          keras.layers.BatchNormalization(), keras.layers.Dense(1)])
            return built

        one_per_call, two_per_call = no_dropout(), no_dropout()
        for built, steps in ((one_per_call, 1), (two_per_call, 2)):
            built.compile(optimizer="sgd", loss="mse", steps_per_execution=steps)
            built.fit(x, y, batch_size=16, verbose=0, shuffle=False)
        for a, b in zip(one_per_call.get_weights(), two_per_call.get_weights()):
            np.testing.assert_allclose(a, b, atol=1e-6)
        assert int(two_per_call.optimizer.iterations.numpy()) == 4
        return
    with pytest.raises(ValueError, match="must be 1 with the PyTorch backend"):  # Keras' own rule on torch, before 3.16
        model.fit(x, y, batch_size=16, verbose=0)


def test_the_adapter_conforms_and_lacks_only_optional_capabilities():
    from keras_dist.backends import check_conforms, get_adapter

    adapter = get_adapter()
    check_conforms(adapter)
    assert adapter.name == "torch"
    assert adapter.create_coordinator is None and adapter.distribute_dataset_natively is None
    assert adapter.apply_optimizer is not None


def _launch(out_dir, build, hook=None, timeout=180, workers=2):
    env = dict(os.environ, KERAS_BACKEND="torch")
    command = [sys.executable, "-m", "keras_dist.launch", "-n", str(workers), "--backend", "torch", "--max-time", str(timeout),
               WORKER, str(out_dir), build] + ([hook] if hook else [])
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout + 30)
    return done


@pytest.fixture(scope="module")
def torch_jobs(tmp_path_factory):
    """One 2-worker job per build, run once for the module."""
    results = {}

    def job(build):
        if build not in results:
            out = tmp_path_factory.mktemp(f"torch-{build}")
            done = _launch(out, build)
            assert done.returncode == 0, done.stdout + done.stderr
            results[build] = [json.load(open(out / f"worker{i}.json")) for i in range(2)]
        return results[build]

    return job


@pytest.mark.starts_processes
@pytest.mark.parametrize("build", ["lazy", "eager"])
def test_two_workers_train_as_one_device(torch_jobs, build):
    for result in torch_jobs(build):
        assert result["replicas"] == 2
        assert result["probes"]["counter"] == 10 + 2 - 6  # each replica's +1, and -3 (its rows), summed
        assert result["probes"]["gather_plain_rows"] == 2  # a value not distributed: as it is, as in tf
        assert result["probes"]["sum_plain"].startswith("refused: Cannot SUM a value that is not distributed across 2 ")
        assert result["probes"]["averaging_loss_in_run"].startswith("refused: The loss 'mean_squared_error' averages")
        assert result["probes"]["stateful_rnn"].startswith("refused")
        for key, value in result["probes"]["two_output_logs"].items():
            assert value == pytest.approx(result["reference_two_output_logs"][key], rel=1e-5), key
        assert result["fit_weights"] < 1e-5, result
        # Keras 3.16's own DDP wrapper (made where torch.distributed is up) is never made under keras_dist's step
        assert result["keras_ddp"] in ("None", "'absent (Keras before 3.16)'"), result["keras_ddp"]
        np.testing.assert_allclose(*result["fit_loss"], rtol=1e-5)
        np.testing.assert_allclose(*result["fit_mae"], rtol=1e-5)
        np.testing.assert_allclose(*result["evaluate"], rtol=1e-5)
        assert result["predict"] < 1e-5 and result["predict_rows"] == 50
        # batches of 7 (and a last of 1): worker 0 takes 4 rows of each, worker 1 3 (and none of the last)
        assert result["rows_seen"] == ({"evaluate": 29, "predict": 29} if result is torch_jobs(build)[0]
                                       else {"evaluate": 21, "predict": 21})
        assert result["loop_weights"] < 1e-5, result
        np.testing.assert_allclose(*result["loop_losses"], rtol=1e-5)
        np.testing.assert_allclose(*result["loop_metric"], rtol=1e-5)
        x, _ = _data()
        np.testing.assert_allclose(result["gathered"], x[:7] * 2.0, rtol=1e-6)


@pytest.mark.starts_processes
@pytest.mark.extended("a second worker count: make test runs the 2-worker jobs (a replica with no rows included)")
def test_four_workers_train_as_one_device(tmp_path):
    """4 processes: global batches of 16 (4 rows each), a last of 2 (two
    replicas without rows); evaluate and predict in batches of 7 and a last of 1."""
    done = _launch(tmp_path, "eager", workers=4)
    assert done.returncode == 0, done.stdout + done.stderr
    for i in range(4):
        result = json.load(open(tmp_path / f"worker{i}.json"))
        assert result["replicas"] == 4
        assert result["fit_weights"] < 1e-5 and result["loop_weights"] < 1e-5, result
        np.testing.assert_allclose(*result["fit_loss"], rtol=1e-5)
        np.testing.assert_allclose(*result["evaluate"], rtol=1e-5)
        assert result["predict"] < 1e-5 and result["predict_rows"] == 50
    rows = [json.load(open(tmp_path / f"worker{i}.json"))["rows_seen"]["evaluate"] for i in range(4)]
    assert rows == [15, 14, 14, 7], rows  # 7 rows: 2, 2, 2, 1 a batch (7 batches), and the last row: worker 0's


from test_hooks import TORCH_PROBED_BY_JOB  # noqa: E402

TORCH_HOOKS = sorted(TORCH_PROBED_BY_JOB)


def _mismatches(results, live=None):
    first = results[0]
    bad = []
    if live is not None and first["probes"] != live[0]["probes"]:
        bad.append("probes (run's increments, an averaging loss in run, a stateful LSTM, per-output losses)")
    if [r["rows_seen"] for r in results] != [{"evaluate": 29, "predict": 29}, {"evaluate": 21, "predict": 21}]:
        bad.append("rows each worker evaluated or predicted")
    if first["fit_weights"] >= 1e-5:
        bad.append("fit weights")
    if not np.allclose(*first["evaluate"], rtol=1e-5):
        bad.append("evaluate")
    if first["predict"] >= 1e-5 or first["predict_rows"] != 50:
        bad.append("predict")
    return bad


#: Hooks whose revert leaves the workers out of step (reduce_values: a replica
#: without rows fails alone, the other waits in a collective until the
#: timeout, and the job's collectives are gone): a job of their own each.
ALONE = ("keras.src.losses.loss:reduce_values",)


@pytest.fixture(scope="module")
def reverted_hooks_job(tmp_path_factory):
    """Two jobs: the run live, then again with each torch-probed hook reverted
    alone (those in ALONE in a job of their own); results by target."""
    groups = [[t for t in TORCH_HOOKS if t not in ALONE], *([t] for t in ALONE)]
    live, reverted = None, {}
    for group in groups:
        out = tmp_path_factory.mktemp("torch-reverted")
        done = _launch(out, "lazy", ",".join(group), timeout=400)
        assert done.returncode == 0, done.stdout + done.stderr
        workers = [json.load(open(out / f"worker{i}.json")) for i in range(2)]
        live = live or workers
        for target in group:
            reverted[target] = [worker["reverted"][target] for worker in workers]
    return live, reverted


@pytest.mark.starts_processes
@pytest.mark.parametrize("target", TORCH_HOOKS)
def test_every_torch_hook_changes_behaviour(target, reverted_hooks_job):
    """Reverting one hook alone (tests/test_hooks.py's liveness rule, with a
    2-process job for a probe) breaks the run's match with one device or
    with the live run, or makes it fail."""
    live, by_target = reverted_hooks_job
    assert not _mismatches(live)
    reverted = by_target[target]
    if "raised" in reverted[0]:  # make_train_function: Keras' own step is refused under a strategy
        assert all("raised" in r for r in reverted), reverted
        assert "cannot be called in cross-replica context" in reverted[0]["raised"] or target in ALONE, reverted
        return
    assert _mismatches(reverted, live), (target, reverted[0])


EXAMPLE = os.path.join(os.path.dirname(HERE), "examples", "multi_worker.py")


@pytest.mark.starts_processes
@pytest.mark.parametrize("launcher", ["torchrun"])  # keras-dist launch: tests/test_multi_worker.py's example test
def test_the_multi_worker_example_matches_one_device(launcher):
    """examples/multi_worker.py, unchanged from JAX and TensorFlow (a CNN with
    BatchNormalization on the digits, 50-row global batches over 2
    processes), started by keras_dist's launcher or by torchrun."""
    env = dict(os.environ, KERAS_BACKEND="torch")
    if launcher == "torchrun":
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone", EXAMPLE]
    else:
        command = [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", "torch", "--max-time", "240", EXAMPLE]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    output = done.stdout + done.stderr
    assert done.returncode == 0, output
    assert "2 workers, 2 replicas in sync" in output and "MATCH: multi-worker training vs one device" in output, output


MATRIX_WORKER = os.path.join(HERE, "workers", "mw_torch_matrix.py")
MODELS = ("mlp", "cnn_bn", "functional", "subclassed")
SOURCES = ("numpy", "pydataset", "generator", "dataloader")


@pytest.fixture(scope="module")
def matrix_job(tmp_path_factory):
    out = tmp_path_factory.mktemp("torch-matrix")
    env = dict(os.environ, KERAS_BACKEND="torch")
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", "torch", "--max-time", "240", MATRIX_WORKER, str(out)],
        env=env, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return out, [json.load(open(out / f"worker{i}.json")) for i in range(2)]


@pytest.mark.starts_processes
@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("model", MODELS)
def test_the_equivalence_matrix_across_processes(matrix_job, model, source):
    """Every model family × every input Keras' torch backend takes, fit 2
    epochs (uneven shards, a partial last batch), evaluate, predict: each
    worker within float32 round-off of one device from the same seed."""
    for results in matrix_job[1]:
        case = results[f"{model}/{source}"]
        assert case["weights"] < 1e-5 and case["evaluate"] < 1e-5 and case["predict"] < 1e-5, case
        assert case["predict_rows"] == 50
        np.testing.assert_allclose(*case["losses"], rtol=1e-5, atol=1e-6)


@pytest.mark.starts_processes
def test_a_self_averaging_loss_and_chief_only_files(matrix_job):
    """compile(loss=fn) returning the batch's mean already trains as one
    device; ModelCheckpoint and CSVLogger files are the chief's alone."""
    out, results = matrix_job
    for result in results:
        assert result["self_averaging_loss"]["weights"] < 1e-6
    lines = (out / "files" / "log.csv").read_text().splitlines()
    assert len(lines) == 3 and lines[0].startswith("epoch,loss,mae"), lines  # one writer: header and 2 epochs
    assert keras.models.load_model(out / "files" / "model.keras").count_params() == 8 * 5 + 8 + 8 + 1


@pytest.mark.starts_processes
@pytest.mark.bench
def test_quick_torch_ddp_benchmark_run(tmp_path):
    """benchmarks/torch_ddp.py's tiny run (make test-bench): keras_dist, plain
    Keras and hand-written DDP in one run, so its ratios cannot rot."""
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(HERE), "benchmarks", "torch_ddp.py"), "--quick", "--output", str(tmp_path)],
        capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    rows = json.loads((tmp_path / "results" / "torch_ddp.quick.json").read_text())
    assert [row["processes"] for row in rows] == [1, 2]
    for row in rows:
        assert row["keras_dist_over_ddp"] == row["keras_dist_step_ms"] / row["ddp_step_ms"] > 0
    assert rows[0]["keras_dist_over_plain_keras"] == rows[0]["keras_dist_step_ms"] / rows[0]["plain_keras_step_ms"]
    assert "| 2 |" in (tmp_path / "TORCH_DDP.quick.md").read_text()


SHUFFLE_WORKER = os.path.join(HERE, "workers", "mw_torch_shuffle.py")


@pytest.mark.starts_processes
@pytest.mark.parametrize("mode", ["unseeded", "seeded_apart"])
def test_shuffled_input_is_the_same_on_every_worker_or_refused(tmp_path, mode):
    """fit(shuffle=True): unseeded workers draw alike (the chief's random
    state, taken when they joined), and each step checks every worker holds
    the same global batch; workers seeded apart get one clear error, not a
    batch mixed of two shuffles."""
    env = dict(os.environ, KERAS_BACKEND="torch")
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", "torch", "--max-time", "120",
         SHUFFLE_WORKER, str(tmp_path), mode],
        env=env, capture_output=True, text=True, timeout=180,
    )
    output = done.stdout + done.stderr
    from keras_dist._keras_names import keras_version

    if mode == "unseeded" or keras_version() >= (3, 16):
        # Keras 3.16 seeds torch's shuffle by the epoch, not the global seed:
        # workers seeded apart draw alike there, and the step's check passes
        assert done.returncode == 0, output
        results = [json.load(open(tmp_path / f"worker{i}.json")) for i in range(2)]
        assert results[0] == results[1]
    else:
        assert done.returncode != 0, output
        assert "The workers' global batches differ at this train step" in output, output


def test_one_process_distribute_datasets_from_function():
    """One replica: dataset_fn gets the InputContext of one pipeline and
    its batches reach `run` whole (several workers take a tf.data dataset
    from dataset_fn, on every backend: tests/test_multi_worker.py)."""
    strategy = keras_dist.MirroredStrategy()
    x, _ = _data()
    contexts = []

    def dataset_fn(context):
        contexts.append((context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync))
        batch = context.get_per_replica_batch_size(10)
        return [x[i : i + batch] for i in range(0, 30, batch)]

    sums = [float(strategy.reduce("SUM", strategy.run(lambda a: keras.ops.sum(a), args=(b,)), axis=None))
            for b in strategy.distribute_datasets_from_function(dataset_fn)]
    assert contexts == [(1, 0, 1)]
    np.testing.assert_allclose(sums, [x[i : i + 10].sum() for i in range(0, 30, 10)], rtol=1e-5)


def test_the_same_batch_check_takes_nan_and_string_inputs():
    """The step's same-batch check reads NaN as a value (NaN equals nothing,
    itself included) and counts the rows of inputs it cannot sum."""
    import torch

    from keras_dist.backends.torch import _batch_check, _collectives, _step

    assert _collectives.same_on_every_process(torch.tensor([1.0, float("nan"), float("inf")]))
    batch = (np.array([[1.0], [np.nan]], "float32"), np.array(["a", "b"]))
    digest = _batch_check.digest(batch)
    assert digest == _batch_check.digest((np.array([[1.0], [np.nan]], "float32"), np.array(["c", "d"])))  # rows of strings
    assert digest != _batch_check.digest((np.array([[1.0], [2.0]], "float32"), np.array(["a", "b"])))
    assert digest != _batch_check.digest((np.array([[1.0], [np.nan]], "float32"), np.array(["a", "b", "c"])))
    assert digest != _batch_check.digest((np.array([[1.0], [np.nan]], "float64"), np.array(["a", "b"])))
    _step.check_same_global_batch(batch, "train")  # one process: its own batch


def test_gradient_buckets_follow_ddp_s_sizes_or_bytes_per_pack():
    """The reducer's buckets: reverse order, one dtype per bucket, DDP's 1
    MiB first and 25 MiB after, or CommunicationOptions' bytes_per_pack."""
    import torch

    from keras_dist.backends.torch import _reducer

    mib = 1024 * 1024
    sizes = [mib // 4, 16, mib // 4, 16, 3 * mib // 4, 2 * mib, 5 * mib]  # float32: 1 MiB, 64 B, 1 MiB, 64 B, 3, 8, 20 MiB
    parameters = [torch.zeros(n) for n in sizes]
    assert _reducer.bucket_indices(parameters) == [[6], [5, 4, 3, 2, 1, 0]]
    assert _reducer.bucket_indices(parameters, bytes_per_pack=mib) == [[6], [5], [4], [3, 2], [1, 0]]
    mixed = [torch.zeros(4), torch.zeros(4, dtype=torch.float64), torch.zeros(4)]
    assert _reducer.bucket_indices(mixed) == [[2], [1], [0]]


def test_the_folded_batch_check_tells_equal_from_different_batches():
    """The same-batch check a step sends with its gradients' sum: [h, h*h]
    of each process's hash bytes, summed; equal batches exactly when N *
    sum(h*h) == sum(h)**2 (the sums of 2 and of 256 processes made here by
    hand, as the all-reduce would make them)."""
    import torch

    from keras_dist.backends.torch import _batch_check

    batch = (np.arange(12, dtype="float32").reshape(6, 2), np.arange(6))
    other = (np.arange(12, dtype="float32").reshape(6, 2), np.arange(6)[::-1].copy())
    for n in (2, 256):
        same = [_batch_check.BatchCheck(batch, "train", n) for _ in range(n)]
        assert same[0].values("cpu").dtype == torch.float32
        same[0].verify(sum(check.values("cpu") for check in same))
        assert same[0].done
        mixed = [_batch_check.BatchCheck(batch, "train", n) for _ in range(n - 1)] + [_batch_check.BatchCheck(other, "train", n)]
        with pytest.raises(ValueError, match="global batches differ at this train step"):
            mixed[0].verify(sum(check.values("cpu") for check in mixed))
    # beyond 256 processes the squares' sums would pass float32's 2**24: float64
    assert _batch_check.BatchCheck(batch, "train", 257).values("cpu").dtype == torch.float64
    # folded: one call of the sum for the values and the check, the check popped off
    calls = []

    def all_reduce_sum(values):
        calls.append(len(values))
        return [v * 2 for v in values]

    check = _batch_check.BatchCheck(batch, "evaluate", 2)
    summed = check.fold([torch.ones(3)], all_reduce_sum, "cpu")
    assert calls == [2] and len(summed) == 1 and summed[0].tolist() == [2.0] * 3 and check.done
    check.verify_alone(all_reduce_sum, "cpu")  # made already: no second collective
    assert calls == [2]


GUIDE_WORKER = os.path.join(HERE, "workers", "torch_loop_guide.py")


def _assert_guide_matches(distributed, one_device):
    np.testing.assert_allclose(distributed["losses"], one_device["losses"], atol=2e-6)
    assert distributed["train_acc"] == pytest.approx(one_device["train_acc"], abs=1e-6)
    assert distributed["val_acc"] == pytest.approx(one_device["val_acc"], abs=1e-6)
    assert distributed["iterations"] == one_device["iterations"] == 2 * 19  # 600 rows in batches of 32
    for a, b in zip(distributed["weights"], one_device["weights"]):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-6)
    assert distributed["losses"][-1] < distributed["losses"][0]  # it learns


@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: keras_dist.OneDeviceStrategy("cpu:0"),
        lambda: keras_dist.MirroredStrategy(),
        lambda: keras_dist.CentralStorageStrategy(),
    ],
    ids=["one-device", "mirrored", "central-storage"],
)
def test_keras_io_torch_loop_guide_ported_to_strategy_run(make_strategy):
    """keras-io's "training loop from scratch in PyTorch" (tests/workers/
    torch_loop_guide.py: its header lists each change) under each strategy
    of one process: the default strategy's losses, accuracies and weights."""
    sys.path.insert(0, os.path.join(HERE, "workers"))
    try:
        import torch_loop_guide
    finally:
        sys.path.pop(0)
    _assert_guide_matches(torch_loop_guide.guide(make_strategy()), torch_loop_guide.guide(keras_dist.get_strategy()))


@pytest.mark.starts_processes
def test_keras_io_torch_loop_guide_on_two_workers_trains_as_one_device(tmp_path):
    """The same guide under MultiWorkerMirroredStrategy, 2 processes (gloo):
    each replica's share of the DataLoader's shuffled global batches, the
    partial last batch, Adam through `optimizer.apply` inside `run`, the
    metrics over both replicas; every worker equals one device."""
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", "torch", "--max-time", "180",
         GUIDE_WORKER, str(tmp_path)],
        env=dict(os.environ, KERAS_BACKEND="torch"), capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    results = [json.load(open(tmp_path / f"worker{i}.json")) for i in range(2)]
    for result in results:
        assert result["replicas"] == 2
        _assert_guide_matches(result["distributed"], result["one_device"])
    assert results[0]["distributed"]["weights"] == results[1]["distributed"]["weights"]


@pytest.mark.starts_processes
def test_torchrun_s_failure_summary_shows_the_root_cause(tmp_path):
    """Under torchrun a worker's uncaught exception is written to torchrun's
    error file (TORCHELASTIC_ERROR_FILE), so its summary names it (it
    showed `error_file: <N/A>` and no traceback)."""
    script = tmp_path / "fails.py"
    script.write_text("import os\nimport keras_dist\n"
                      "if os.environ['RANK'] == '1':\n    raise ValueError('bad row 7 on this worker')\n")
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", str(script)],
        capture_output=True, text=True, timeout=240, env=dict(os.environ, KERAS_BACKEND="torch"),
    )
    assert done.returncode != 0
    summary = done.stderr[done.stderr.rfind("Root Cause"):]
    assert "error_file: <N/A>" not in summary, summary
    assert "ValueError: bad row 7 on this worker" in summary and "fails.py" in summary, summary


#: The torch collectives each step makes on 2 processes (issue #50 counts
#: them down to one per training step): a step that grows one fails here.
#: fit: the gradient sum, one asynchronous bucket launched as backward
#: produced the gradients (the same-batch check sent with it), and the
#: metrics' variables; with BatchNormalization its global moments too (a
#: mean and a variance forward, their gradients backward). evaluate: the
#: metrics (the check with them). predict: the check, then every process's
#: rows (their shapes, their values). Left out: the SIGTERM agreement's
#: small all-gather, about once a second of steps (so per step it depends on
#: the machine's speed; it made this test flaky under load).
COLLECTIVES_PER_STEP = {
    "mlp": {"fit": {"all_reduce": 1.0, "all_reduce_async": 1.0}, "evaluate": {"all_reduce": 1.0},
            "predict": {"all_gather": 2.0, "all_reduce": 1.0}},
    "batchnorm": {"fit": {"all_reduce": 5.0, "all_reduce_async": 1.0}, "evaluate": {"all_reduce": 1.0},
                  "predict": {"all_gather": 2.0, "all_reduce": 1.0}},
}


@pytest.mark.starts_processes
def test_the_collectives_each_step_makes_are_counted(tmp_path):
    """Every torch.distributed collective per fit, evaluate and predict step
    on 2 processes (tests/workers/mw_torch_collectives.py), by kind."""
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", "torch", "--max-time", "240",
         os.path.join(HERE, "workers", "mw_torch_collectives.py"), str(tmp_path)],
        env=dict(os.environ, KERAS_BACKEND="torch"), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    for worker in range(2):
        report = json.load(open(tmp_path / f"worker{worker}.json"))
        # count metrics' logs as one device's (Keras 3.16's torch trainer
        # summed the already global metric variables over the processes again)
        for call, (distributed, plain) in report.pop("counts").items():
            for key in ("tp", "fn"):
                assert np.allclose(distributed[key], plain[key]) and np.all(np.asarray(plain[key]) > 0), (call, key)
        # each worker pinned to one core: gloo's event loop yields it (SCHED_IDLE)
        idle = report.pop("gloo_event_loops_idle")
        assert idle and all(idle), idle
        # the gradient sum's paths against one device: two buckets (4 steps, 2
        # asynchronous sums each; with Keras' gradient accumulation; under a
        # LossScaleOptimizer with clipnorm); a second backward or changed gradients
        # before the apply (the buckets' sums set aside, the gradients summed
        # in one packed all-reduce)
        reducer = report.pop("reducer")
        assert all(case["weights"] < 1e-5 for case in reducer.values()), reducer
        assert reducer["two_buckets"]["async_sums_per_step"] == 2.0, reducer
        assert reducer["accumulated"]["async_sums_per_step"] == reducer["loss_scaled"]["async_sums_per_step"] == 2.0
        assert reducer["backward_twice"]["async_sums_per_step"] == 1.0, reducer
        assert report == COLLECTIVES_PER_STEP, report
