"""TPUStrategy: a clear error where there is no TPU, and its machinery run
over the 4 simulated CPU devices through the documented test hook
(`KERAS_DIST_TPU_ON_CPU=1`), against one device: the Mirrored contract
(weights 1e-5 after an epoch, metrics 1e-6), with `steps_per_execution`
run as one on-device loop on JAX. Nothing here ran on a real TPU."""

import pytest

import keras_dist
from keras_dist._engine_kind import EngineKind
from _helpers import assert_fit_evaluate_predict_match, make_data, twin
from conftest import BACKEND
from keras_dist._devices import TPU_ON_CPU_ENV
from test_custom_loops import _check_custom_loop, _numpy_batches


@pytest.fixture
def tpu_on_cpu(monkeypatch):
    monkeypatch.setenv(TPU_ON_CPU_ENV, "1")


def test_no_tpu_is_a_clear_error(monkeypatch):
    monkeypatch.delenv(TPU_ON_CPU_ENV, raising=False)
    with pytest.raises(RuntimeError, match="found no TPU") as error:
        keras_dist.TPUStrategy()
    assert "MirroredStrategy" in str(error.value)
    assert TPU_ON_CPU_ENV in str(error.value)
    assert "cpu:0" in str(error.value)  # what it found


def test_device_assignment_is_refused(tpu_on_cpu):
    with pytest.raises(NotImplementedError, match="experimental_device_assignment"):
        keras_dist.TPUStrategy(experimental_device_assignment=object())


def test_strategy_over_cpu_devices_under_the_hook(tpu_on_cpu):
    resolver = keras_dist.cluster_resolver.TPUClusterResolver()
    assert keras_dist.tpu.experimental.initialize_tpu_system(resolver) is None  # nothing to do here
    strategy = keras_dist.TPUStrategy(resolver)
    assert strategy.num_replicas_in_sync == 4
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1", "cpu:2", "cpu:3")
    assert strategy.cluster_resolver is resolver
    assert strategy.extended.engine_kind is EngineKind.TPU  # steps_per_execution on device
    assert strategy.extended.experimental_require_static_shapes
    assert keras_dist.experimental.TPUStrategy is keras_dist.TPUStrategy


def test_multi_host_slice_needs_real_tpus(tpu_on_cpu):
    from keras_dist.cluster_resolver import ClusterSpec, SimpleClusterResolver

    two_hosts = SimpleClusterResolver(
        ClusterSpec({"worker": ["10.0.0.1:8470", "10.0.0.2:8470"]}), task_type="worker", task_id=0
    )
    with pytest.raises(RuntimeError, match="multi-host TPU slice"):
        keras_dist.TPUStrategy(two_hosts)


CASES = {
    # name: (num_samples, global batch size, batch_norm)
    "batch10-partial": (203, 10, False),  # 10 rows on 4 replicas; last batch 3
    "batchnorm-batch12": (203, 12, True),  # 12 rows: even, stacked on device
}


#: SGD with one step per execution and with four (the on-device loop);
#: Adam with four, where its slots are carried through that loop. Adam with
#: one step re-ran SGD's path (the same gradients, reduced the same way).
@pytest.mark.parametrize(
    "optimizer, steps_per_execution",
    [
        pytest.param("sgd", 1, id="sgd-1", marks=pytest.mark.extended("one step per execution: make test runs the on-device loop (sgd-4)")),
        pytest.param("sgd", 4, id="sgd-4"),
        pytest.param("adam", 4, id="adam-4", marks=pytest.mark.extended("Adam's slots through the loop: make test runs SGD's")),
    ],
)
@pytest.mark.parametrize("case", sorted(CASES))
def test_fit_evaluate_predict_match_single_device(tpu_on_cpu, case, optimizer, steps_per_execution):
    num_samples, batch_size, batch_norm = CASES[case]
    x, y = make_data(num_samples)
    reference, distributed = twin(
        keras_dist.TPUStrategy(),
        optimizer=optimizer,
        batch_norm=batch_norm,
        compile_kwargs={"steps_per_execution": steps_per_execution},
    )
    assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size, epochs=2)
    if BACKEND == "jax" and steps_per_execution > 1:
        executions = distributed.train_function.executions
        if batch_size % 4 == 0:  # even batches: every full execution ran as one program
            assert executions["on_device"] == 2 * (num_samples // batch_size // steps_per_execution)
        else:  # uneven batches cannot be stacked: one by one, still exact
            assert executions["on_device"] == 0 and executions["one_by_one"] > 0


def test_custom_loop_matches_single_device(tpu_on_cpu):
    _check_custom_loop(lambda n: keras_dist.TPUStrategy(), "batch10-partial", 4, _numpy_batches)
