"""Multi-worker training: real worker processes on 127.0.0.1, each under a
timeout, all reaped. Each worker compares its MultiWorkerMirroredStrategy
run with a plain single-device run from the same initial weights."""

import json
import os
import re
import subprocess
import sys

import numpy as np
import pytest

from conftest import BACKEND
from keras_dist.launch import free_ports as _free_ports

pytestmark = pytest.mark.starts_processes  # worker processes, launched jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKER = os.path.join(ROOT, "tests", "workers", "mw_fit.py")


def _run_job(tmp_path, num_workers, argv, timeout=240, worker=WORKER):
    ports = _free_ports(num_workers + 1)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports[:num_workers]]}
    processes = []
    try:
        for index in range(num_workers):
            env = dict(
                os.environ,
                KERAS_BACKEND=BACKEND,
                TF_CPP_MIN_LOG_LEVEL="3",
                KERAS_DIST_COORDINATOR=f"127.0.0.1:{ports[-1]}",
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}),
                PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            )
            processes.append(
                subprocess.Popen(
                    [sys.executable, worker, str(tmp_path), *map(str, argv)],
                    env=env,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                    text=True,
                )
            )
        outputs = [p.communicate(timeout=timeout)[0] for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    return [p.returncode for p in processes], outputs


@pytest.fixture(scope="module")
def fit_and_custom_loop_jobs(tmp_path_factory):
    """`jobs(devices_per_worker)`: one 2-worker job per device count, made
    once for this module: each worker compares fit/evaluate/predict with one
    device (worker<i>.json), then the example's custom loop on the same
    strategy (custom_worker<i>.json)."""
    made = {}

    def jobs(devices_per_worker):
        if devices_per_worker not in made:
            directory = tmp_path_factory.mktemp(f"fit-custom-{devices_per_worker}dev")
            made[devices_per_worker] = (directory, *_run_job(directory, 2, [devices_per_worker, 203, 10, "custom"]))
        return made[devices_per_worker]

    return jobs


#: The 2 x 2 job is `make test-extended`'s (the marker says why); make test runs 2 x 1.
DEVICES_PER_WORKER = [
    1,
    pytest.param(
        2,
        marks=pytest.mark.extended(
            "a second device count for the shared job: make test runs 2 workers x 2 devices through examples/multi_worker.py "
            "(fit against one device) and 2 x 1 here"
        ),
    ),
]


@pytest.mark.slow("starts the module's shared job for its device count (fit, evaluate, predict, then the custom loop, against one device)")
@pytest.mark.parametrize("devices_per_worker", DEVICES_PER_WORKER)
def test_two_workers_match_single_device(fit_and_custom_loop_jobs, devices_per_worker):
    directory, codes, outputs = fit_and_custom_loop_jobs(devices_per_worker)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    results = [json.loads((directory / f"worker{i}.json").read_text()) for i in range(2)]
    for result in results:
        assert result["num_replicas"] == 2 * devices_per_worker
        assert result["weight_diff"] <= 1e-5
        assert result["predict_shape"] == [203, 1] and result["predict_diff"] <= 1e-5
        for key, value in result["evaluate_ref"].items():
            assert abs(result["evaluate"][key] - value) <= 1e-6, key
        for key, value in result["fit_ref"].items():
            assert abs(result["fit"][key] - value) <= 1e-5, key
        if BACKEND == "jax":  # CPU jobs: even batches per replica; workers with
            assert result["even_batch_per_replica"]  # several cores keep gloo's loop
            assert result["gloo_event_loops_idle"] and not any(result["gloo_event_loops_idle"])
    # identical initial weights without seeding; only the chief checkpoints
    assert results[0]["initial_checksum"] == results[1]["initial_checksum"]
    assert [r["should_checkpoint"] for r in results] == [True, False]


@pytest.mark.slow("2 workers x 2 devices with tf.data input; on JAX each worker imports JAX and TensorFlow")
@pytest.mark.needs_tensorflow
def test_two_workers_tf_data_input_matches_single_device(tmp_path):
    codes, outputs = _run_job(tmp_path, 2, [2, 203, 10, "tfdata"])
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for index in range(2):
        result = json.loads((tmp_path / f"worker{index}.json").read_text())
        assert result["num_replicas"] == 4 and result["weight_diff"] <= 1e-5
        assert result["predict_shape"] == [203, 1] and result["predict_diff"] <= 1e-5
        for key, value in result["evaluate_ref"].items():
            assert abs(result["evaluate"][key] - value) <= 1e-6, key


@pytest.mark.parametrize("devices_per_worker", DEVICES_PER_WORKER)
def test_two_workers_custom_loop_matches_single_device(fit_and_custom_loop_jobs, devices_per_worker):
    """The example's custom loop (run/reduce, partial last batch of 37), run
    by the workers after their fit (the same strategy, as a user's script
    that does both)."""
    directory, codes, outputs = fit_and_custom_loop_jobs(devices_per_worker)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    for index in range(2):
        result = json.loads((directory / f"custom_worker{index}.json").read_text())
        assert result["num_replicas"] == 2 * devices_per_worker
        assert result["weight_diff"] <= 1e-5
        assert abs(result["loss"] - result["loss_ref"]) <= 1e-5


#: TensorBoard writes with tf.summary, so on JAX it needs tensorflow; the
#: other callbacks are checked without it too, as a JAX-only install runs them.
TENSORBOARD = [pytest.param(True, id="tensorboard", marks=pytest.mark.needs_tensorflow)]
if BACKEND == "jax":
    TENSORBOARD = [
        pytest.param(
            True,
            id="tensorboard",
            marks=[
                pytest.mark.needs_tensorflow,
                pytest.mark.extended(
                    "the job again on JAX with TensorBoard: make test runs it on JAX without and on TensorFlow with it"
                ),
            ],
        ),
        pytest.param(False, id="no-tensorboard"),
    ]


@pytest.mark.slow("a 2-worker job with every file-writing callback, a progress bar and a ScalingReport plot")
@pytest.mark.parametrize("tensorboard", TENSORBOARD)
def test_only_the_chief_writes_files_and_prints_progress(tmp_path, tensorboard):
    private_tmp = tmp_path / "tmp"
    private_tmp.mkdir()
    os.environ["TMPDIR"] = str(private_tmp)  # where workers make private dirs
    try:
        mode = "callbacks+tensorboard" if tensorboard else "callbacks"
        codes, outputs = _run_job(tmp_path, 2, [1, 203, 10, mode])
    finally:
        del os.environ["TMPDIR"]
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    files = tmp_path / "files"
    assert (files / "ckpt.weights.h5").exists() and (files / "model.keras").exists()
    assert (files / "log.csv").read_text().count("\n") == 3  # header + 2 epochs, once
    backup = sorted(p.name for p in (files / "backup").iterdir())
    assert backup == ["latest.weights.h5", "training_metadata.json"]  # no temp files
    assert json.loads((files / "backup" / "training_metadata.json").read_text())["epoch"] == 2
    assert any((files / "logs").rglob("events.out.tfevents.*")) == tensorboard
    assert "Epoch 2/2" in outputs[0] and "Epoch" not in outputs[1]
    assert (files / "scaling.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in files.iterdir() if p.name.startswith(".scaling_report_")]
    assert f"ScalingReport: 2 replica(s) on {BACKEND} (2 workers; this one: cpu:0)" in outputs[0]
    assert "ScalingReport" not in outputs[1]
    assert not [p for p in private_tmp.iterdir() if p.name.startswith("keras_dist_worker")]


def test_single_worker_cluster_is_mirrored_over_local_devices(monkeypatch):
    import keras_dist

    monkeypatch.delenv("TF_CONFIG", raising=False)
    strategy = keras_dist.MultiWorkerMirroredStrategy()
    assert strategy.num_replicas_in_sync == 4
    assert strategy.extended.should_checkpoint
    assert strategy.cluster_resolver.num_workers == 1


def test_bytes_per_pack_is_followed_or_said_to_have_no_effect():
    """A packing hint no argument is silently dropped for: TensorFlow packs
    by it, torch sizes fit's gradient buckets by it
    (tests/test_torch_backend.py), and JAX, where XLA packs the compiled
    step's collectives, warns that it has no effect."""
    import warnings

    import keras_dist

    options = keras_dist.CommunicationOptions(bytes_per_pack=1024)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        strategy = keras_dist.MultiWorkerMirroredStrategy(communication_options=options)
    said = [str(w.message) for w in caught if "bytes_per_pack" in str(w.message)]
    assert strategy.extended.communication_options.bytes_per_pack == 1024
    if BACKEND == "jax":
        assert len(said) == 1 and "no effect on the JAX backend" in said[0], said
    else:
        assert said == []


def test_bad_communication_options():
    import keras_dist

    with pytest.raises(ValueError, match="timeout_seconds"):
        keras_dist.CommunicationOptions(timeout_seconds=0)
    with pytest.raises(ValueError, match="bytes_per_pack"):
        keras_dist.CommunicationOptions(bytes_per_pack=-1)
    with pytest.raises(TypeError, match=r"timeout_seconds must be a number of seconds.*'60' \(str\)"):
        keras_dist.CommunicationOptions(timeout_seconds="60")


def test_a_cluster_dict_for_a_resolver_names_simple_cluster_resolver():
    """A dict where a resolver belongs: one clear error (it was
    "'dict' object has no attribute 'task_type'")."""
    import keras_dist

    with pytest.raises(TypeError, match="takes a cluster resolver, got dict.*SimpleClusterResolver"):
        keras_dist.MultiWorkerMirroredStrategy(cluster_resolver={"worker": ["localhost:1", "localhost:2"]})


def test_example_through_the_launcher(tmp_path):
    """In a user's environment (TF_CPP_MIN_LOG_LEVEL unset): the chief's
    MATCH, and no engine chatter (C++ log lines, gloo's "connected" lines)."""
    env = {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "-n", "2", "--backend", BACKEND, "--timeout", "240",
         os.path.join(ROOT, "examples", "multi_worker.py"), "--epochs", "1", "--backup-dir", str(tmp_path / "backup")],
        capture_output=True, text=True, timeout=300, env=env, cwd=ROOT,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    assert "[worker 0] MATCH" in done.stdout, done.stdout[-2000:]
    assert "[worker 1] MATCH" not in done.stdout  # only the chief reports
    # The launcher says when both workers have joined, as the guide shows it.
    joined = r"keras-dist launch: every worker joined the cluster after \d+\.\d s"
    assert len(re.findall(f"^{joined}$", done.stderr, re.M)) == 1, done.stderr[-2000:]
    guide = open(os.path.join(ROOT, "guides", "multi_worker.md")).read()
    assert re.search(f"^{joined}$", guide, re.M)
    output = done.stdout + done.stderr
    assert "[Gloo]" not in output and " peer ranks" not in output, output[-2000:]  # gloo's own lines
    # C++ log lines beyond those the engine prints on import on this machine
    # (TensorFlow announces oneDNN on CPUs that have it, whatever
    # TF_CPP_MIN_LOG_LEVEL says).
    engine_lines = [_engine_message(line.split("] ", 1)[1]) for line in output.splitlines() if re.match(r"^\[worker \d+\] [IWEF]\d{4} \d\d:\d\d:\d\d", line)]
    assert set(engine_lines) <= _engine_import_messages(env), output[-2000:]


def _engine_message(line):
    """A C++ log line without its time stamp and thread id."""
    return re.sub(r"^[IWEF]\d{4} [\d:. ]+\s+\d+ ", "", line)


def _engine_import_messages(env):
    """The C++ log messages importing Keras on this backend and running one
    op print here, as the example starts (TF_CPP_MIN_LOG_LEVEL=3)."""
    done = subprocess.run(
        [sys.executable, "-c", "import os; os.environ.setdefault('TF_CPP_MIN_LOG_LEVEL', '3'); import keras; keras.ops.add(1.0, 1.0)"],
        capture_output=True, text=True, timeout=120, env=dict(env, KERAS_BACKEND=BACKEND),
    )
    assert done.returncode == 0, done.stderr[-2000:]
    return {_engine_message(line) for line in (done.stdout + done.stderr).splitlines() if re.match(r"^[IWEF]\d{4} ", line)}


AUTOSHARD_WORKER = os.path.join(ROOT, "tests", "workers", "mw_autoshard.py")


def _write_csv_parts(directory, sizes, seed=0):
    """CSV files of 4 features and a 0/1 label, `sizes` rows each."""
    rng = np.random.default_rng(seed)
    directory.mkdir()
    for number, size in enumerate(sizes):
        x = rng.normal(size=(size, 4))
        y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
        lines = [",".join(f"{v:.6f}" for v in row) + f",{label}" for row, label in zip(x, y)]
        (directory / f"part-{number}.csv").write_text("\n".join(lines) + "\n")


@pytest.fixture(scope="module")
def autoshard_job(tmp_path_factory):
    """One 2-worker job (2 devices per worker) that runs the FILE, OFF and
    HINT policies in turn on one strategy (worker<i>.<POLICY>.json), made
    once for this module."""
    directory = tmp_path_factory.mktemp("autoshard")
    # files of different sizes: under FILE (and HINT, where the dataset
    # marks its files with shard(SHARD_HINT, SHARD_HINT)), worker 0 (parts 0, 2, 4) holds
    # 72 rows, worker 1 (parts 1, 3) 28: it runs out first, and keeps joining
    _write_csv_parts(directory / "data", [23, 17, 30, 11, 19])
    return (directory, *_run_job(directory, 2, [2, "FILE,OFF,HINT"], timeout=360, worker=AUTOSHARD_WORKER))


@pytest.mark.slow("the module's one 2-worker job for the three policies (on JAX each worker imports JAX and TensorFlow): fit with validation, evaluate and a custom loop on per-worker tf.data streams, against one device")
@pytest.mark.needs_tensorflow
@pytest.mark.parametrize("policy", ["FILE", "OFF", "HINT"])
def test_per_worker_auto_shard_policies_train_on_every_workers_rows(autoshard_job, policy):
    """AutoShardPolicy FILE/OFF/HINT: each worker reads its own stream
    (tf's per-worker pipeline), a step's global batch is every worker's rows
    that step. fit (with validation), evaluate and a custom loop equal one
    device on those global batches; on TensorFlow each worker's rows equal
    what tf's own distributed dataset gives it."""
    directory, codes, outputs = autoshard_job
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    results = [json.loads((directory / f"worker{i}.{policy}.json").read_text()) for i in range(2)]
    for result in results:
        assert result["num_replicas"] == 4
        if policy in ("FILE", "HINT"):  # every example once, workers' streams uneven
            assert sum(result["global_rows"]) == 100 and result["stream_steps"] == [9, 4]
        else:  # OFF: every worker reads every file, each example twice
            assert sum(result["global_rows"]) == 200 and result["stream_steps"] == [13, 13]
        assert result["weight_diff"] <= 1e-5
        for key, value in result["evaluate_ref"].items():
            assert abs(result["evaluate"][key] - value) <= 1e-5, key
        assert result["epochs"] == 2 and 0.0 <= result["val_accuracy"] <= 1.0
        assert result["custom_sums"] == result["custom_sums_ref"]
        if BACKEND == "tensorflow":
            assert result["tf_stream_equal"]
    assert results[0]["global_rows"] == results[1]["global_rows"]


@pytest.mark.needs_tensorflow
def test_per_worker_streams_refused_where_they_cannot_hold(mirrored, monkeypatch):
    """predict of a per-worker stream, and a stream whose inner shapes are
    unknown: one clear error each, before anything changes."""
    import keras
    import tensorflow as tf

    strategy = mirrored(2)
    monkeypatch.setattr(type(strategy.extended), "num_workers", property(lambda self: 2))
    with strategy.scope():
        model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    x = np.ones((8, 3), "float32")
    options = tf.data.Options()
    options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
    dataset = tf.data.Dataset.from_tensor_slices((x, x[:, :1])).batch(4).with_options(options)
    with pytest.raises(ValueError, match="predict got a tf.data dataset whose options ask for AutoShardPolicy.OFF"):
        model.predict(dataset.map(lambda a, b: a), verbose=0)
    ragged = tf.data.Dataset.from_generator(
        lambda: iter([(x[:4], x[:4, :1])]),
        output_signature=(tf.TensorSpec([None, None], tf.float32), tf.TensorSpec([None, 1], tf.float32)),
    ).with_options(options)
    with pytest.raises(ValueError, match="needs every dimension but the batch one known"):
        model.fit(ragged, epochs=1, verbose=0)
    with pytest.raises(ValueError, match="needs every dimension but the batch one known"):
        strategy.experimental_distribute_dataset(ragged)
    assert all(np.array_equal(a, b) for a, b in zip(before, model.get_weights()))


RANDOM_WORKER = os.path.join(ROOT, "tests", "workers", "mw_random.py")


def _run_single(tmp_path, worker, argv, timeout=240):
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    env.pop("TF_CONFIG", None)
    env["PYTHONPATH"] = os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")])
    done = subprocess.run(
        [sys.executable, worker, str(tmp_path), *argv], env=env, capture_output=True, text=True, timeout=timeout
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]


#: The seeded-shuffle input: tf.data needs tensorflow (on JAX too); JAX also
#: checks NumPy input, as a JAX-only install has it.
SHUFFLED_INPUT = [pytest.param("tfdata", marks=pytest.mark.needs_tensorflow)]
if BACKEND == "jax":
    SHUFFLED_INPUT = [
        pytest.param(
            "tfdata",
            marks=[
                pytest.mark.needs_tensorflow,
                pytest.mark.extended("the job again on JAX with tf.data: make test runs it on JAX with NumPy, on TensorFlow with tf.data"),
            ],
        ),
        pytest.param("numpy"),
    ]


@pytest.mark.parametrize("shuffled_input", SHUFFLED_INPUT)
def test_creating_the_strategy_leaves_the_users_random_state_alone(tmp_path, shuffled_input):
    """Seeded before the strategy: NumPy, Python and (tf.data input) seeded
    tf.data draws made after it equal a single process's, and a
    seeded-shuffle fit matches one device (the multi_worker_with_keras
    tutorial's shape)."""
    _run_single(tmp_path, RANDOM_WORKER, ["seeded", shuffled_input])
    codes, outputs = _run_job(tmp_path, 2, ["seeded", shuffled_input], worker=RANDOM_WORKER)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    single = json.loads((tmp_path / "random_single.json").read_text())
    assert ("tf_data_order" in single) == (shuffled_input == "tfdata")
    for index in range(2):
        worker = json.loads((tmp_path / f"random_{index}.json").read_text())
        for key in ("numpy", "python", "tf_data_order", "initial_checksum"):
            assert worker.get(key) == single.get(key), (index, key)
        diff = max(
            float(np.max(np.abs(np.asarray(a) - np.asarray(b))))
            for a, b in zip(worker["weights"], single["weights"])
        )
        assert diff <= 1e-5, (index, diff)


def test_unseeded_workers_start_from_the_chiefs_weights(tmp_path):
    codes, outputs = _run_job(tmp_path, 2, ["unseeded"], worker=RANDOM_WORKER)
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    results = [json.loads((tmp_path / f"random_{i}.json").read_text()) for i in range(2)]
    assert len({r["initial_checksum"] for r in results}) == 1, results
    assert [r["from_chief"] for r in results] == [[7.0, 7.0], [7.0, 7.0]]  # the chief is worker 0


_JOIN = """
import keras_dist
keras_dist.simulate_cpu_devices(1)
try:
    keras_dist.MultiWorkerMirroredStrategy()
except ValueError as error:
    print("ValueError:", error)
"""


@pytest.mark.parametrize("where", ["port_taken", "not_this_machine"])
def test_an_address_this_process_cannot_serve_fails_before_joining(where):
    """TF serves the task's own address, JAX's chief the coordinator: a port
    already taken, or a host that is not this machine, is one clear error
    before joining (TF used to hang; JAX aborted with a stack dump)."""
    import socket

    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    taken = holder.getsockname()[1]
    peer = _free_ports(1)[0]
    address = f"127.0.0.1:{taken}" if where == "port_taken" else "192.0.2.1:2222"  # TEST-NET-1
    env = dict(
        os.environ,
        KERAS_BACKEND=BACKEND,
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
        TF_CONFIG=json.dumps({"cluster": {"worker": [address, f"127.0.0.1:{peer}"]}, "task": {"type": "worker", "index": 0}}),
    )
    env.pop("KERAS_DIST_COORDINATOR", None)  # JAX's chief serves its own address
    try:
        done = subprocess.run([sys.executable, "-c", _JOIN], env=env, capture_output=True, text=True, timeout=120)
    finally:
        holder.close()
    assert "ValueError:" in done.stdout, done.stdout[-2000:] + done.stderr[-3000:]
    assert "cannot be served by this process" in done.stdout and "free port" in done.stdout, done.stdout


_NEVER_JOINED = """
import keras_dist
keras_dist.simulate_cpu_devices(1)
keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.experimental.CommunicationOptions(timeout_seconds=4))
print("joined", flush=True)
"""


def test_a_worker_whose_peer_never_starts_exits_with_code_1():
    """The multi-worker guide's promise for a peer that never starts: after
    `timeout_seconds`, a `PeerWorkerError` naming whom it waited for, and
    exit code 1. Worker 0 and worker 1, each alone in its own 2-worker
    cluster, side by side. Where the engine's wait cannot be interrupted
    (JAX; TensorFlow's leader) the process was ended by SIGTERM: 143 on JAX,
    and on TensorFlow, whose SIGTERM handler kept it alive, SIGKILL 3 s
    later (137)."""
    processes = []
    for index in range(2):
        ports = _free_ports(2)
        env = dict(
            os.environ,
            KERAS_BACKEND=BACKEND,
            TF_CPP_MIN_LOG_LEVEL="3",
            PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
            TF_CONFIG=json.dumps({"cluster": {"worker": [f"127.0.0.1:{p}" for p in ports]},
                                  "task": {"type": "worker", "index": index}}),
        )
        env.pop("KERAS_DIST_COORDINATOR", None)
        processes.append(subprocess.Popen([sys.executable, "-c", _NEVER_JOINED], env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
    try:
        results = [process.communicate(timeout=150) for process in processes]
    finally:
        for process in processes:
            if process.poll() is None:
                process.kill()
            process.wait()
    for index, (process, (stdout, stderr)) in enumerate(zip(processes, results)):
        assert process.returncode == 1, (index, process.returncode, stderr[-3000:])
        assert "joined" not in stdout
        assert f"Worker {index} of 2: the job did not join within 4 s (waiting for worker {1 - index}" in stderr, \
            stderr[-3000:]


@pytest.mark.needs_tensorflow
def test_distribute_datasets_from_function_reads_one_pipeline_per_worker(tmp_path):
    """`distribute_datasets_from_function` with 2 workers x 2 devices (it
    raised NotImplementedError; found by the tf-docs multi_worker_with_ctl
    tutorial, tests/test_tutorials.py): each worker calls `dataset_fn` once
    with its input context, and a step's global batch is every worker's
    batches of that step. Full steps: each replica gets its own batch; the
    partial last step and every pass hold each row once; `run` + `reduce`
    sum the job's rows; `experimental_local_results` gives the worker's own
    replicas' parts. `fit` refuses it with the fix (on TensorFlow it hung
    in its first step's all-reduce)."""
    codes, outputs = _run_job(tmp_path, 2, [], worker=os.path.join(ROOT, "tests", "workers", "mw_from_function.py"))
    assert codes == [0, 0], "\n".join(o[-3000:] for o in outputs)
    reports = [json.loads((tmp_path / f"worker{i}.json").read_text()) for i in range(2)]
    # once per distribute_datasets_from_function call (the second: the refused fit's)
    assert [r["contexts"] for r in reports] == [[[2, 0, 4]] * 2, [[2, 1, 4]] * 2]
    assert all(r["replicas"] == 4 for r in reports)
    # a worker's local results are its own 2 replicas' parts, as in tf (on
    # JAX, where each worker holds every replica's part of a distributed
    # batch, `experimental_local_results` returned all 4)
    assert all(r["local_results"] == [2] for r in reports)
    for passes in zip(*(r["rows"] for r in reports)):  # (worker 0's pass, worker 1's pass)
        assert len(passes[0]) == len(passes[1]) == 3
        # full steps: replica (worker w, device d) gets worker w's d-th batch of the step
        assert passes[0][:2] == [[[0, 2], [4, 6]], [[8, 10], [12, 14]]]
        assert passes[1][:2] == [[[1, 3], [5, 7]], [[9, 11], [13, 15]]]
        step_rows = [sorted(v for worker in passes for part in worker[step] for v in part) for step in range(3)]
        assert step_rows == [list(range(0, 8)), list(range(8, 16)), list(range(16, 22))]
    assert reports[0]["sums"] == reports[1]["sums"] == [28.0, 92.0, 111.0] * 2
    # fit refuses it (custom loops only), naming the other spellings, before a step
    assert all("fit/evaluate/predict do not take" in (r["fit_error"] or "") for r in reports), reports[0]["fit_error"]
    assert [r["fit_iterations"] for r in reports] == [0, 0]
