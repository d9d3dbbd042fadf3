"""Test set-up: one backend per pytest process, 4 simulated CPU devices."""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402

import keras_dist  # noqa: E402

NUM_DEVICES = 4
keras_dist.simulate_cpu_devices(NUM_DEVICES)

BACKEND = keras.config.backend()


def pytest_report_header(config):
    return f"keras {keras.version()}, backend {BACKEND}, {NUM_DEVICES} simulated CPU devices"


@pytest.fixture
def mirrored():
    """`mirrored(n)`: a MirroredStrategy over the first n CPU devices."""

    def make(num_replicas):
        return keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(num_replicas)])

    return make


@pytest.fixture(autouse=True)
def _no_leaked_scope():
    yield
    from keras_dist import _context

    leaked = _context.open_scopes()
    _context.reset()
    assert not leaked, f"test left strategy scopes open: {leaked}"


@pytest.fixture
def per_replica_step(monkeypatch):
    """JAX: engines of several replicas train `fit`'s even batches per replica
    (as multi-process CPU jobs do), here in one process."""
    from keras_dist.backends.jax import _engine

    monkeypatch.setattr(
        _engine, "trains_per_replica", lambda engine: engine.num_replicas > 1 and engine.compiler_options is None
    )


def jax_train_step(model):
    """A fresh `JaxStep` for `model`'s training, built as `fit` builds it."""
    from keras_dist._hooks import model_strategy
    from keras_dist.backends.jax._step import JaxStep

    return JaxStep(model, model_strategy(model).extended.engine, "train")
