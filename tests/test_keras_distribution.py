"""keras_dist beside Keras' own distribution (`keras.distribution`), never
doubled: a Keras distribution set globally and a keras_dist strategy would
each distribute the same model (gradients reduced twice), so entering the
strategy's scope is one clear error before anything is placed, on every
backend and Keras version. Without a keras_dist strategy, Keras' own
distribution is plain Keras, bit for bit
(tests/test_hooks.py::test_code_outside_a_strategy_is_plain_keras_bit_for_bit)."""

import keras
import numpy as np
import pytest

import keras_dist
from _helpers import make_data, mlp
from conftest import BACKEND


#: Keras' DataParallel over this process's devices (torch before Keras 3.16
#: has no device listing: one named CPU).
_DEVICES = ["cpu:0", "cpu:1"] if BACKEND == "jax" else ["cpu:0"]


def _data_parallel():
    """Keras' DataParallel, or a skip where this Keras has none on this
    backend (torch before Keras 3.11: the case cannot arise)."""
    try:
        return keras.distribution.DataParallel(devices=_DEVICES)
    except AttributeError as error:  # keras.src.backend.distribution_lib is None
        pytest.skip(f"Keras {keras.version()} has no keras.distribution on the {BACKEND} backend ({error})")


@pytest.fixture
def keras_data_parallel():
    keras.distribution.set_distribution(_data_parallel())
    yield
    keras.distribution.set_distribution(None)


@pytest.mark.parametrize("make_strategy", [
    lambda: keras_dist.OneDeviceStrategy("cpu:0"),
    lambda: keras_dist.MirroredStrategy(),
    lambda: keras_dist.MultiWorkerMirroredStrategy(),
], ids=["one-device", "mirrored", "multi-worker-of-one"])
def test_a_keras_distribution_and_a_strategy_are_one_clear_error(keras_data_parallel, make_strategy):
    strategy = make_strategy()
    created = []
    with pytest.raises(ValueError, match=r"keras.distribution's DataParallel is active .* use one"):
        with strategy.scope():
            created.append(mlp())
    assert created == []  # nothing was placed
    keras.distribution.set_distribution(None)  # the fix the error names
    with strategy.scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = make_data(16)
    model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 2


def test_fit_outside_the_scope_under_a_keras_distribution_is_refused_before_a_step(mirrored):
    """A model made under a strategy, then `fit` after the user set a Keras
    distribution: refused before the first step (no weight changed)."""
    with mirrored(1 if BACKEND == "torch" else 2).scope():
        model = mlp()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x, y = make_data(16)
    before = model.get_weights()
    keras.distribution.set_distribution(_data_parallel())
    try:
        with pytest.raises(ValueError, match="use one"):
            model.fit(x, y, batch_size=8, epochs=1, verbose=0)
    finally:
        keras.distribution.set_distribution(None)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
