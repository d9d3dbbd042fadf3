"""TensorFlow's `fit` step under keras_dist: `compile(jit_compile=True)` was
dropped silently; it is honoured under OneDeviceStrategy (exactly plain
Keras' XLA run), and under every other strategy, where tf's XLA cannot run
it on these devices (plain tf.distribute fails mid-step), one clear error
before training. One replica counts steps over data of unknown size right:
tests/test_inputs.py. Tracing a step grows linearly with the model's depth
(tf's all-reduce gradient walked every replica's graph under
CentralStorageStrategy)."""

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import assert_same_weights
from conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's step")

_ONE_DEVICE = {
    "one-device-cpu0": lambda: keras_dist.OneDeviceStrategy("cpu:0"),
    "one-device-cpu1": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
}


def _data():
    x = np.random.default_rng(0).normal(size=(13, 3)).astype("float32")
    return x, x.sum(axis=1, keepdims=True)


def _model(jit_compile):
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse", metrics=["mae"], jit_compile=jit_compile)
    return model


@pytest.mark.parametrize("jit_compile", [True, False])
@pytest.mark.parametrize("name", list(_ONE_DEVICE))
def test_jit_compile_is_honoured_under_one_device_strategy_as_plain_keras(name, jit_compile):
    x, y = _data()
    reference = _model(jit_compile)
    with _ONE_DEVICE[name]().scope():
        model = _model(jit_compile)
    model.set_weights(reference.get_weights())
    expected = reference.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0).history
    history = model.fit(x, y, batch_size=5, epochs=2, shuffle=False, verbose=0).history
    assert_same_weights(reference, model, atol=1e-6)
    for key in expected:
        np.testing.assert_allclose(history[key], expected[key], rtol=1e-6)
    np.testing.assert_allclose(model.predict(x, batch_size=5, verbose=0), reference.predict(x, batch_size=5, verbose=0), atol=1e-6)
    # the replica's step is compiled by XLA exactly when the model asks for it
    assert getattr(model.train_function.replica, "_jit_compile", False) is jit_compile


@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1"]),
        lambda: keras_dist.MirroredStrategy(["cpu:1"]),
        lambda: keras_dist.CentralStorageStrategy(["cpu:0", "cpu:1"]),
    ],
    ids=["mirrored-2", "mirrored-cpu1", "central-storage-2"],
)
def test_jit_compile_under_other_strategies_is_one_clear_error_before_training(make_strategy):
    x, y = _data()
    with make_strategy().scope():
        model = _model(True)
    before = model.get_weights()
    with pytest.raises(ValueError, match=r"jit_compile=True\) under \w+Strategy on TensorFlow.*jit_compile=False"):
        model.fit(x, y, batch_size=4, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == 0
    model.compile(keras.optimizers.SGD(0.05), "mse", jit_compile=False)  # the fix the error names
    model.fit(x, y, batch_size=4, verbose=0)
    assert int(keras.ops.convert_to_numpy(model.optimizer.iterations)) == -(-len(x) // 4)


def _bn_stack(depth):
    keras.utils.set_random_seed(3)
    layers = [keras.Input((4,))]
    for _ in range(depth):
        layers += [keras.layers.Dense(4), keras.layers.BatchNormalization()]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.05), "mse")
    return model


@pytest.mark.parametrize("make_strategy", [
    pytest.param(lambda: keras_dist.CentralStorageStrategy(["cpu:0", "cpu:1"]), id="central-storage-2"),
    pytest.param(lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1"]), id="mirrored-2"),
])
def test_tracing_a_step_does_not_walk_the_other_replicas_graphs(make_strategy, monkeypatch):
    """tf's replica all-reduce is a `tf.custom_gradient`, which walks back
    from its result looking for variables. Under CentralStorageStrategy the
    result depends on every replica's graph, so each BatchNormalization
    layer's moment all-reduce walked the other replicas' whole graphs:
    quadratic in depth (here 4362 ops walked at depth 2, 47190 at depth 8;
    MobileNetV2's first step: 100 of 108 CPU-s). keras_dist's all-reduce
    ends every walk at the replicas' inputs: the ops walked grow as the
    model does (356 -> 1244), and the step is still exact."""
    from tensorflow.python.ops import op_selector

    walked = []
    original = op_selector.get_backward_walk_ops

    def counted(*args, **kwargs):
        ops = original(*args, **kwargs)
        walked.append(len(ops))
        return ops

    monkeypatch.setattr(op_selector, "get_backward_walk_ops", counted)
    x = np.random.default_rng(0).normal(size=(16, 4)).astype("float32")
    y = x.sum(axis=1, keepdims=True)
    walked_per_depth = {}
    for depth in (2, 8):
        reference = _bn_stack(depth)
        reference.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        with make_strategy().scope():
            model = _bn_stack(depth)
        walked.clear()
        model.fit(x, y, batch_size=8, epochs=1, shuffle=False, verbose=0)
        assert walked, "no all-reduce walk seen: the step no longer goes through tf.custom_gradient (update this test)"
        walked_per_depth[depth] = sum(walked)
        assert_same_weights(model, reference, atol=1e-5)
    assert walked_per_depth[8] <= 5 * walked_per_depth[2], walked_per_depth  # 4x the layers
