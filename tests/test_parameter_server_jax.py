"""ParameterServerStrategy on JAX (Ray actors): what "works" means, measured
against an actual single-device run (issue #14, JAX part).

One local Ray per module (started by the first strategy, shut down at the
end); each test's cluster is stopped when the test is done.
"""

import time

import numpy as np
import pytest

import keras
import keras_dist
from conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="ParameterServerStrategy's JAX engine (Ray actors)")

FEATURES = 6


def _resolver(workers, ps, host="localhost"):
    return keras_dist.cluster_resolver.SimpleClusterResolver(
        {
            "chief": [f"{host}:2000"],
            "worker": [f"{host}:{2100 + i}" for i in range(workers)],
            "ps": [f"{host}:{2200 + i}" for i in range(ps)],
        },
        task_type="chief",
        task_id=0,
    )


@pytest.fixture(scope="module", autouse=True)
def _ray_session():
    yield
    import ray

    if ray.is_initialized():
        ray.shutdown()


def _cluster(strategy):
    return strategy.extended.engine.cluster


@pytest.fixture
def make_cluster():
    """`make_cluster(workers, ps, partitioner=None)` -> (strategy, coordinator); stopped after the test."""
    from keras_dist.backends.jax import _parameter_servers

    made = []

    def make(workers, ps, partitioner=None):
        strategy = keras_dist.ParameterServerStrategy(_resolver(workers, ps), variable_partitioner=partitioner)
        coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
        made.append(strategy)
        return strategy, coordinator

    yield make
    for strategy in made:
        _parameter_servers.shutdown(strategy)


def _model(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")]
    )


def _task(n=512, seed=0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, FEATURES)).astype("float32")
    w = rng.normal(size=(FEATURES,)).astype("float32")
    y = (x @ w > 0).astype("float32")[:, None]
    return x, y


def _batches(x, y, batch):
    return [(x[i : i + batch], y[i : i + batch]) for i in range(0, len(x), batch)]


def _reference(model, optimizer):
    """The same model, outside any strategy, with the same initial weights."""
    reference = keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")]
    )
    reference.set_weights(model.get_weights())
    reference.compile(optimizer=optimizer, loss="binary_crossentropy", metrics=["accuracy"])
    return reference


def _train_step(model, strategy):
    from keras_dist.backends import get_adapter

    return get_adapter().make_trainer_function(model, strategy, "train")


def _max_diff(a, b):
    return max(float(np.max(np.abs(u - v))) for u, v in zip(a, b))


def test_one_worker_one_ps_equals_one_device_step_for_step(make_cluster):
    import ray

    strategy, coordinator = make_cluster(1, 1)
    cluster = _cluster(strategy)
    assert ray.is_initialized()
    x, y = _task(256)
    batches = _batches(x, y, 32) * 2  # 16 steps
    with strategy.scope():
        model = _model()
        model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
    reference = _reference(model, keras.optimizers.Adam(0.01))
    step = _train_step(model, strategy)
    iterator = iter(coordinator.create_per_worker_dataset(lambda: iter(batches)))
    diffs = []
    for i, (bx, by) in enumerate(batches):
        logs = coordinator.schedule(step, args=(iterator,))
        coordinator.join()
        expected = reference.train_on_batch(bx, by, return_dict=True)
        diffs.append(_max_diff(model.get_weights(), reference.get_weights()))
        assert abs(float(logs.fetch()["loss"]) - expected["loss"]) < 1e-5
    assert max(diffs) < 1e-5, diffs
    assert int(model.optimizer.iterations) == len(batches)
    assert _max_diff([v.value for v in model.optimizer.variables], [v.value for v in reference.optimizer.variables]) < 1e-5
    report = cluster.ps_reports()[0]
    assert report["applied"] == len(batches) and report["duplicates"] == 0
