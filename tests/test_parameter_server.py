"""ParameterServerStrategy on the TensorFlow engine: real ps and worker
server processes on 127.0.0.1 (`keras-dist launch --workers N --ps M`, the
test script being the chief), each job under a timeout, every process
reaped by the launcher. The JAX engine's tests are its own."""

import json
import os
import re
import subprocess
import sys

import keras
import numpy as np
import pytest

from _helpers import sharded_dense
from conftest import BACKEND

import keras_dist

pytestmark = pytest.mark.starts_processes  # worker processes, launched jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
JOB = os.path.join(ROOT, "tests", "workers", "ps_job.py")

tf_engine = pytest.mark.skipif(
    BACKEND != "tensorflow", reason="the TensorFlow engine (tf's servers and coordinator)"
)


def _job(directory, workers, ps, modes, timeout=150):
    """One `keras-dist launch --workers N --ps M` job whose chief runs
    `modes` (tests/workers/ps_job.py: "mode:steps,..."), one after another
    on the same cluster; {mode: its report}."""
    out = directory / "job"
    env = dict(
        os.environ,
        KERAS_BACKEND="tensorflow",
        TF_CPP_MIN_LOG_LEVEL="3",
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    command = [
        sys.executable, "-m", "keras_dist.launch", "--workers", str(workers), "--ps", str(ps),
        "--timeout", "90", "--max-time", str(timeout - 10), JOB, str(out), modes,
    ]
    result = subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    names = [part.split(":")[0] for part in modes.split(",")]
    return {name: json.loads((directory / f"job.{name}.json").read_text()) for name in names}


# One job per cluster shape, shared by the tests of this module that read
# it (a job's modes run one after another on its strategy; each test checks
# its own mode's report). Jobs that kill a task run alone.


@pytest.fixture(scope="module")
def one_worker_one_ps(tmp_path_factory):
    return _job(
        tmp_path_factory.mktemp("ps-1w-1ps"), 1, 1, "loop:40,fit-loop-inside:16,adam-loop:40,bad-inputs", timeout=300
    )


@pytest.fixture(scope="module")
def two_workers_two_ps(tmp_path_factory):
    # replay last: it numbers its functions itself
    return _job(tmp_path_factory.mktemp("ps-2w-2ps"), 2, 2, "loop:60,fit:32,replay:30", timeout=300)


@pytest.mark.slow("starts the module's shared 1-worker + 1-ps job (4 modes, each against one device)")
@tf_engine
def test_one_worker_matches_single_device_step_for_step(one_worker_one_ps):
    report = one_worker_one_ps["loop"]
    assert report["iterations"] == 40 and report["counter"] == 40.0
    assert report["max_diff"] < 1e-5, report


def _split_over_both_ps(devices):
    """Every variable of more than one row is split, a shard on each ps."""
    split = {path: d for path, d in devices.items() if isinstance(d, list)}
    for path, shards in split.items():
        assert [s.split("/task:")[1][0] for s in shards] == ["0", "1"], (path, shards)
    return split


@tf_engine
def test_partitioned_variables_one_worker_match_single_device_and_reload_unsharded(tmp_path):
    """FixedShardsPartitioner(2) over 2 ps: each kernel and the 16-row bias
    is tf's ShardedVariable, a shard per ps; trainers see the shards (a
    gradient tape watches one handle), layers the whole. 1 worker equals one
    device step for step; `get_weights` keeps the unsharded shapes and they
    reload into an unsharded model exactly, while `weights`,
    `trainable_weights` and `non_trainable_weights` list the shards (as
    tf.keras 2), `weights` being the other two together."""
    report = _job(tmp_path, 1, 2, "sharded-loop:30")["sharded-loop"]
    assert report["iterations"] == 30 and report["counter"] == 30.0
    assert report["max_diff"] < 1e-5, report
    assert report["shapes"] == [[8, 16], [16], [16, 1], [1]]
    assert report["trainable_shapes"] == [[4, 16], [4, 16], [8], [8], [8, 1], [8, 1], [1]]
    listed = report["listed_shapes"]
    assert listed["weights"] == listed["trainable_weights"] == report["trainable_shapes"], listed
    assert listed["non_trainable_weights"] == [], listed
    split = _split_over_both_ps(report["devices"])
    assert {"sequential/dense/kernel", "sequential/dense/bias", "sequential/dense_1/kernel"} <= set(split)
    assert report["reloaded_diff"] == 0.0


@tf_engine
def test_a_split_variable_is_listed_as_its_shards_and_got_and_set_whole():
    """In one process (a kernel split in two shards as a partitioner splits
    it): every weight list shows the shards, `weights` is trainable +
    non-trainable, a kernel made non-trainable takes its shards along, and
    `get_weights` / `set_weights` give and take it whole."""
    layer, kernel = sharded_dense()

    def shapes(variables):
        return [tuple(v.shape) for v in variables]

    assert shapes(layer.weights) == shapes(layer.trainable_weights) == [(3, 2), (3, 2), (2,)]
    assert shapes(layer.trainable_variables) == [(3, 2), (3, 2), (2,)] and layer.non_trainable_weights == []
    assert [w.shape for w in layer.get_weights()] == [(6, 2), (2,)]
    layer.set_weights([kernel + 1.0, np.ones(2, "float32")])
    np.testing.assert_array_equal(layer.weights[1].numpy(), kernel[3:] + 1.0)
    layer.kernel.trainable = False
    assert shapes(layer.trainable_weights) == [(2,)] and shapes(layer.non_trainable_weights) == [(3, 2), (3, 2)]
    assert shapes(layer.weights) == [(3, 2), (3, 2), (2,)]  # Keras' order: the layer's own lists


@tf_engine
@pytest.mark.extended(
    "partitioned variables with a second worker: make test runs them with 1 worker step for step, and fit on 2 workers "
    "and 2 ps without a partitioner"
)
def test_partitioned_variables_fit_two_workers_two_ps(tmp_path):
    report = _job(tmp_path, 2, 2, "sharded-fit:32")["sharded-fit"]
    assert report["iterations"] == 3 * 32  # every scheduled step, once
    assert len(_split_over_both_ps(report["devices"])) == 3
    assert report["evaluate"]["accuracy"] >= report["single_device_accuracy"] - 0.06, report


@pytest.mark.slow("starts the module's shared 2-worker + 2-ps job (loop, fit with callbacks and a single-device reference, replay)")
@tf_engine
def test_two_workers_two_ps_no_lost_update_and_every_variable_on_a_ps(two_workers_two_ps):
    report = two_workers_two_ps["loop"]
    # Keras' assign_add is a read-then-write: without keras_dist's atomic
    # increment two workers lost updates (47 of 60 measured).
    assert report["iterations"] == 60
    assert report["counter"] == 60.0  # each scheduled step applied once
    assert report["done"] is True
    devices = report["devices"]
    assert all("/job:ps/" in device for device in devices.values()), devices
    assert {d.split("/task:")[1][0] for d in devices.values()} == {"0", "1"}  # round-robin over both ps


@tf_engine
def test_fit_with_dataset_function_callbacks_evaluate_predict(two_workers_two_ps):
    report = two_workers_two_ps["fit"]
    history = report["history"]
    assert set(history) == {"accuracy", "loss", "val_accuracy", "val_loss"}
    assert len(history["loss"]) == 3 and history["loss"][-1] < history["loss"][0]
    assert len(report["history_plain_callable"]["loss"]) == 1  # epoch 3 of 4: a plain callable
    assert report["iterations"] == 4 * 32  # every scheduled step, exactly once
    # asynchronous: not equal to one device, but in the same band
    assert report["evaluate"]["accuracy"] >= report["single_device_accuracy"] - 0.06, report
    assert report["predict_shape"] == [256, 1]
    assert "ckpt.weights.h5" in report["files"] and "tb" in report["files"]


@tf_engine
def test_worker_killed_mid_training_is_rescheduled_and_applied_exactly_once(tmp_path):
    """tf's coordinator re-runs a dead worker's functions on the others; a
    function whose writes reached the ps before its worker died ran them
    twice (61 of 60 seen before keras_dist gated them). Every write is now
    claimed by the function's id on its ps: exactly N."""
    report = _job(tmp_path, 2, 1, "kill:60")["kill"]
    assert report.get("killed"), report
    assert "error" not in report, report
    assert report["iterations"] == 60 and report["counter"] == 60.0, report


@tf_engine
def test_a_function_run_twice_applies_each_write_once(two_workers_two_ps):
    """Each function scheduled twice under one id, the two runs racing on
    two workers (what a re-run after a worker's death is): 30 steps counted
    once each; each of a step's 6 writes (4 variables, iterations, a
    counter) skipped by exactly one run; the keys gone after join."""
    report = two_workers_two_ps["replay"]
    assert report["iterations"] == 30 and report["counter"] == 30.0, report
    assert report["skipped_writes"] == 30 * 6, report
    assert report["claimed_after_join"] == 0


@tf_engine
def test_fit_with_several_steps_per_function_applies_every_step(one_worker_one_ps):
    """steps_per_execution=4: each scheduled function loops over 4 train
    steps; each step's writes are numbered apart (a write inside the loop
    is one traced op run 4 times), so all 16 steps apply, as on one device."""
    report = one_worker_one_ps["fit-loop-inside"]
    assert report["iterations"] == 16, report
    assert report["max_diff"] < 1e-5, report


@tf_engine
def test_adam_schedule_and_batchnorm_one_worker_match_single_device(one_worker_one_ps):
    """Adam's bias correction and a learning-rate schedule read iterations
    (read once per step, before the gated updates); BatchNormalization
    writes its statistics with assign (gated too): 1 worker + 1 ps equals
    one device step for step."""
    report = one_worker_one_ps["adam-loop"]
    assert report["iterations"] == 40 and report["counter"] == 40.0
    assert report["max_diff"] < 1e-5, report


@tf_engine
def test_ps_killed_gives_a_clear_error_not_a_hang(tmp_path):
    report = _job(tmp_path, 2, 1, "ps-dies:60")["ps-dies"]
    assert report.get("killed"), report
    assert report["error"].startswith("PeerWorkerError: Parameter server ps:0 failed"), report["error"][:300]
    assert report["error_seconds"] < 60


@tf_engine
def test_bad_inputs_raise_one_clear_error_each_before_any_change(one_worker_one_ps):
    report = one_worker_one_ps["bad-inputs"]
    errors = report["errors"]
    assert "needs steps_per_epoch" in errors["missing steps_per_epoch"]
    assert "takes a dataset function" in errors["a list, not a function"]  # a tf.data.Dataset is taken (the tutorial)
    assert "takes a dataset function" in errors["arrays, not a function"]
    assert "does not take batch_size" in errors["batch_size with a function"]
    assert errors["train_on_batch"].startswith("NotImplementedError")
    assert "created outside any strategy scope" in errors["model made outside the scope"]
    assert "created outside any strategy scope" in errors["model made outside every scope"]
    assert errors["a function returning arrays"].startswith("TypeError: The dataset function '<lambda>' returned a tuple of arrays")
    assert errors["metric made outside the scope"] is None and report["metric_adopted"]  # adopted, as an optimizer is
    assert errors["jit_compile function"].startswith("ValueError: ClusterCoordinator.schedule got a tf.function(jit_compile=True)")
    if hasattr(keras.callbacks, "OrbaxCheckpoint"):  # the coordinator holds no current variables: refused, naming the fix
        assert errors["OrbaxCheckpoint"].startswith("ValueError: fit got keras.callbacks.OrbaxCheckpoint under a "
                                                    "ParameterServerStrategy"), errors["OrbaxCheckpoint"]
    assert report["unchanged"] and report["iterations"] == 0


# -- the core, without a cluster (both backends) ------------------------------


def _resolver(cluster, task="chief"):
    return keras_dist.cluster_resolver.SimpleClusterResolver(
        keras_dist.cluster_resolver.ClusterSpec(cluster), task_type=task, task_id=0
    )


def test_cluster_without_ps_is_refused():
    with pytest.raises(ValueError, match="at least one 'ps' task"):
        keras_dist.ParameterServerStrategy(_resolver({"chief": ["a:1"], "worker": ["a:2"]}))
    with pytest.raises(ValueError, match="at least one 'worker' task"):
        keras_dist.ParameterServerStrategy(_resolver({"chief": ["a:1"], "ps": ["a:2"]}))
    with pytest.raises(ValueError, match="made on the coordinator"):
        keras_dist.ParameterServerStrategy(_resolver({"chief": ["a:1"], "worker": ["a:2"], "ps": ["a:3"]}, "worker"))


@pytest.mark.skipif(BACKEND != "jax", reason="TensorFlow's fit takes the dataset (tests/test_tutorials.py)")
@pytest.mark.needs_tensorflow
def test_a_tf_data_dataset_given_to_fit_on_jax_names_the_dataset_function():
    """tf's tutorial passes a tf.data.Dataset to fit; on JAX the workers are
    Ray actors it cannot be sent to: one clear error, before any actor
    starts or any weight changes."""
    import tensorflow as tf

    strategy = keras_dist.ParameterServerStrategy(
        _resolver({"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]})
    )
    with strategy.scope():
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.SGD(), loss="mse")
    before = model.get_weights()
    with pytest.raises(ValueError, match="not a tf.data.Dataset.*Ray actors.*DatasetCreator"):
        model.fit(tf.data.Dataset.range(3), epochs=1, steps_per_epoch=2, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)


def test_experimental_names():
    assert keras_dist.experimental.ParameterServerStrategy is keras_dist.ParameterServerStrategy
    partitioners = keras_dist.experimental.partitioners
    assert partitioners.MinSizePartitioner.__module__ == "keras_dist._partitioners"
    creator = keras_dist.experimental.DatasetCreator(lambda context: context)
    assert creator(["batch"]) == ["batch"]
    with pytest.raises(TypeError, match="takes a function"):
        keras_dist.experimental.DatasetCreator([1, 2])


@pytest.mark.parametrize(
    "returned, what",
    [
        (None, "None"),
        (np.zeros((4, 2)), "an array of shape"),
        ((np.zeros((4, 2)), np.zeros((4,))), "a tuple of arrays"),
        ({"x": np.zeros((4, 2))}, "a dict of arrays"),
        (3, "a value of type int"),
    ],
    ids=["none", "array", "x-y-tuple", "dict", "number"],
)
def test_a_dataset_function_returning_data_not_a_dataset_is_one_clear_error(returned, what):
    """tf.keras' DatasetCreator refused a function that returns no dataset;
    keras_dist's runs it on each worker (the cluster tests show the error
    reaching `fit` and `create_per_worker_dataset`), checked the same way."""
    from keras_dist.strategies._parameter_server import call_dataset_fn

    def dataset_fn(input_context):
        return returned

    for call in (
        lambda: keras_dist.experimental.DatasetCreator(dataset_fn)(keras_dist.InputContext()),
        lambda: call_dataset_fn(dataset_fn, keras_dist.InputContext()),
        lambda: call_dataset_fn(lambda: returned, None),
    ):
        with pytest.raises(TypeError, match=f"returned {what}.*not a dataset.*repeat"):
            call()
    batches = [(np.zeros((2, 2)), np.zeros((2,)))]
    assert call_dataset_fn(lambda: batches, None) is batches  # a list of batches is a dataset


def test_server_checks_its_arguments():
    cluster = {"worker": ["127.0.0.1:1"], "ps": ["127.0.0.1:2"]}
    with pytest.raises(ValueError, match="job_name is required"):
        keras_dist.Server(cluster)
    with pytest.raises(ValueError, match="not a task of job"):
        keras_dist.Server(cluster, job_name="ps", task_index=3)
    with pytest.raises(ValueError, match="protocol"):
        keras_dist.Server(cluster, job_name="ps", task_index=0, protocol="http")


@pytest.mark.skipif(BACKEND != "jax", reason="JAX has no server process")
def test_server_on_jax_names_the_alternative():
    with pytest.raises(NotImplementedError, match="Ray actors"):
        keras_dist.Server({"ps": ["127.0.0.1:1"]}, job_name="ps", task_index=0, start=False)


@tf_engine
def test_server_starts_and_has_a_target():
    from keras_dist.launch import free_ports

    port = free_ports(1)[0]
    server = keras_dist.Server({"ps": [f"127.0.0.1:{port}"]}, job_name="ps", task_index=0, start=False)
    assert server.target == f"grpc://127.0.0.1:{port}"


# -- partitioners: tf's own as the oracle --------------------------------------

SHAPES = [(1,), (6, 1), (10, 3), (7, 5, 2), (1000, 64), (3, 0), (257, 1024)]
DTYPES = ["float32", "float16", "int64", "int8", "bool", "bfloat16", "string", "float64"]


@pytest.mark.needs_tensorflow
@pytest.mark.parametrize("dtype", DTYPES)
def test_partitioners_match_tf(dtype):
    import tensorflow as tf

    ours = keras_dist.experimental.partitioners
    theirs = tf.distribute.experimental.partitioners
    makers = [
        lambda p: p.FixedShardsPartitioner(num_shards=3),
        lambda p: p.FixedShardsPartitioner(num_shards=1),
        lambda p: p.MinSizePartitioner(min_shard_bytes=4, max_shards=10),
        lambda p: p.MinSizePartitioner(min_shard_bytes=1000, max_shards=4, bytes_per_string=8),
        lambda p: p.MinSizePartitioner(),
        lambda p: p.MaxSizePartitioner(max_shard_bytes=4),
        lambda p: p.MaxSizePartitioner(max_shard_bytes=100, max_shards=3),
        lambda p: p.MaxSizePartitioner(max_shard_bytes=1 << 20),
    ]
    checked = 0
    for make in makers:
        for shape in SHAPES:
            if 0 in shape and "MaxSize" in repr(make(ours)):
                continue  # tf divides by the axis' size: zero rows raise in both
            for axis in range(len(shape)):
                want = make(theirs)(tf.TensorShape(shape), tf.as_dtype(dtype), axis=axis)
                assert make(ours)(shape, dtype, axis=axis) == want, (make(ours), shape, dtype, axis)
                # tf's own arguments (TensorShape, DType) work as well
                assert make(ours)(tf.TensorShape(shape), tf.as_dtype(dtype), axis=axis) == want
                checked += 1
    assert checked > 100


def test_partitioners_refuse_bad_arguments():
    p = keras_dist.experimental.partitioners
    for make in (lambda: p.MinSizePartitioner(min_shard_bytes=0), lambda: p.MinSizePartitioner(max_shards=0),
                 lambda: p.MaxSizePartitioner(max_shard_bytes=0), lambda: p.MaxSizePartitioner(1, max_shards=-1)):
        with pytest.raises(ValueError, match="must be positive"):
            make()
    assert np.array_equal(p.FixedShardsPartitioner(2)((10, 3), "float32"), [2, 1])


#: backend -> (the example, its ps tasks): TensorFlow's engine, JAX's Ray actors.
EXAMPLES = {"tensorflow": ("parameter_server.py", 1), "jax": ("parameter_server_jax.py", 2)}
#: What engines print that a user cannot act on: C++ log lines of TF, XLA,
#: gRPC or absl (and the continuation of a multi-line one: a server's config,
#: the CPU-feature notice), Ray's notices, JAX's fork warning.
ENGINE_NOISE = re.compile(
    r"\] ([IWEF]\d{4} \d\d:\d\d|WARNING: All log messages before absl|device_count \{|To enable the "
    r"following instructions|Token authentication is|os\.fork\(\) was called|\(raylet\)|\(pid=)"
)


@pytest.mark.slow("a launched parameter-server job: Ray and its actors (JAX) or 1 ps and 2 worker server processes (TensorFlow) start, then fit and a custom loop")
def test_example_through_the_launcher():
    """The backend's example as the guide runs it: `keras-dist launch
    --workers 2 --ps M` (server processes on TensorFlow; on JAX the
    strategy starts Ray actors), fit then a custom loop; every step applied
    once and accuracy in one device's band ("MATCH")."""
    example, ps = EXAMPLES[BACKEND]
    env = dict(  # TF_CPP_MIN_LOG_LEVEL unset, as a user runs it: the launcher quiets the engines
        {k: v for k, v in os.environ.items() if k != "TF_CPP_MIN_LOG_LEVEL"}, KERAS_BACKEND=BACKEND,
        PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]),
    )
    result = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", "--workers", "2", "--ps", str(ps), "--timeout", "90",
         "--max-time", "140", os.path.join(ROOT, "examples", example)],
        env=env, capture_output=True, text=True, timeout=150,
    )
    assert result.returncode == 0 and "[chief] MATCH" in result.stdout, result.stdout[-3000:] + result.stderr[-3000:]
    noise = [line for line in (result.stdout + result.stderr).splitlines() if ENGINE_NOISE.search(line)]
    assert not noise, noise  # no engine notice reaches the user
    # What it is doing while the cluster starts (a slow phase: Ray's actors,
    # or the server processes, each importing its engine).
    if BACKEND == "jax":
        assert "[chief] keras_dist: starting the parameter-server cluster on Ray: 2 worker and 2 ps actors" in result.stderr
        assert re.search(r"^\[chief\] keras_dist: the parameter-server cluster is up after \d+\.\d s$", result.stderr, re.M)
    else:
        assert re.search(r"^keras-dist launch: every ps and worker server is up after \d+\.\d s$", result.stderr, re.M)


def test_fit_of_a_model_made_outside_every_scope_given_a_dataset_creator_names_the_scope():
    """Plain Keras said "Unrecognized data type: x=DatasetCreator(...)"."""
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    creator = keras_dist.experimental.DatasetCreator(lambda context: [(np.zeros((2, 2)), np.zeros((2, 1)))])
    with pytest.raises(ValueError, match="created outside any strategy scope.*strategy.scope"):
        model.fit(creator, epochs=1, steps_per_epoch=1, verbose=0)
    assert int(model.optimizer.iterations.numpy()) == 0


@tf_engine
def test_in_process_workers_with_too_few_inter_op_threads_are_one_clear_error_not_a_hang():
    """The tf tutorial's in-process cluster with workers given fewer than
    workers + 1 inter-op threads (on a 2-core machine, TensorFlow's
    default): plain tf.distribute's `join` waits for ever. One error naming
    the config, before any step; with enough threads the same fit runs."""
    env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
               PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    result = subprocess.run(
        [sys.executable, os.path.join(ROOT, "tests", "workers", "ps_in_process_threads.py")],
        env=env, capture_output=True, text=True, timeout=180,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    too_few, enough = report["too_few"], report["enough"]
    assert "inter_op_parallelism_threads = 3" in too_few["error"], too_few
    assert too_few["changed"] == [False] * 4 and too_few["iterations"] == 0, too_few
    assert enough["error"] is None and enough["iterations"] == 20 and all(enough["changed"]), enough
