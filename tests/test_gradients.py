"""What reaches the optimizer under a strategy is what one device computes
on the global batch: clipping acts on the global gradient, a
LossScaleOptimizer checks and unscales the global one, a loss function that
averages itself is scaled like any averaged loss, replicas left without
rows add nothing (and log no NaN), and a float64 model's step is float64
throughout. Every check trains a plain single-device copy beside it, under
each strategy that splits a batch (and OneDevice, where nothing should
change)."""

import keras
import numpy as np
import pytest

import keras_dist

from conftest import BACKEND
from _helpers import FEATURES, assert_fit_evaluate_predict_match, assert_same_logs, assert_same_weights, make_data, mlp

STRATEGIES = {
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-2": lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1"]),
    "mirrored-4": lambda: keras_dist.MirroredStrategy(),
    "central-storage-4": lambda: keras_dist.CentralStorageStrategy(),
}


def _fit_both(strategy, make_optimizer, loss="binary_crossentropy", num_samples=43, batch_size=10, build=mlp):
    """A single-device model and a copy under `strategy` (same initial
    weights), each fit for 2 epochs on the same batches; (reference,
    distributed, their histories)."""
    x, y = make_data(num_samples)
    reference = build()
    reference.compile(optimizer=make_optimizer(), loss=loss)
    with strategy.scope():
        distributed = build()
        distributed.set_weights(reference.get_weights())
        distributed.compile(optimizer=make_optimizer(), loss=loss)
    histories = [
        model.fit(x, y, batch_size=batch_size, epochs=2, shuffle=False, verbose=0).history
        for model in (reference, distributed)
    ]
    return reference, distributed, histories


def _iterations(model):
    return int(keras.ops.convert_to_numpy(model.optimizer.iterations))


@pytest.mark.parametrize(
    "strategy_name, clip",
    [(name, "global_clipnorm") for name in STRATEGIES]
    + [("mirrored-4", "clipnorm"), ("mirrored-4", "clipvalue")],
)
def test_clipping_acts_on_the_global_gradient(strategy_name, clip):
    """Limits small enough to clip every step: each replica clipping its own
    part (Keras 3 on TensorFlow clips before it sums) ends ~1e-3 away."""
    limit = {"clipnorm": 0.01, "clipvalue": 0.001, "global_clipnorm": 0.01}[clip]
    reference, distributed, _ = _fit_both(
        STRATEGIES[strategy_name](), lambda: keras.optimizers.SGD(0.1, momentum=0.9, **{clip: limit})
    )
    assert_same_weights(reference, distributed, atol=1e-6)
    assert _iterations(distributed) == _iterations(reference) == 10


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_loss_scale_optimizer_trains_as_one_device(strategy_name):
    """The mixed-precision recipe's optimizer (here in float32, its dynamic
    scale growing every step): the finite check and the unscaling see the
    global gradients; TensorFlow ran its inner optimizer in cross-replica
    context, which keras_dist refused."""

    def make_optimizer():
        return keras.optimizers.LossScaleOptimizer(
            keras.optimizers.SGD(0.1, momentum=0.9, global_clipnorm=1.0), dynamic_growth_steps=3
        )

    strategy = STRATEGIES[strategy_name]()
    if keras.backend.backend() == "tensorflow" and strategy_name.startswith("central-storage"):
        # Keras writes the scale inside a cond tf refuses for central variables
        with strategy.scope():
            model = mlp()
            model.compile(optimizer=make_optimizer(), loss="binary_crossentropy")
        before = model.get_weights()
        x, y = make_data(43)
        with pytest.raises(NotImplementedError, match="MirroredStrategy"):
            model.fit(x, y, batch_size=10, epochs=1, shuffle=False, verbose=0)
        for a, b in zip(before, model.get_weights()):
            np.testing.assert_array_equal(a, b)
        return
    reference, distributed, histories = _fit_both(strategy, make_optimizer)
    assert_same_weights(reference, distributed, atol=1e-5)
    assert_same_logs({"loss": histories[0]["loss"][-1]}, {"loss": histories[1]["loss"][-1]}, atol=1e-5)
    for attribute in ("iterations", "dynamic_scale"):
        values = [float(keras.ops.convert_to_numpy(getattr(m.optimizer, attribute))) for m in (reference, distributed)]
        assert values[0] == values[1], (attribute, values)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_a_loss_function_that_averages_itself_trains_as_one_device(strategy_name):
    """`compile(loss=fn)` where fn returns the batch's mean (a scalar):
    taken as each replica's mean and scaled by its share of the global
    batch (on TensorFlow its gradients were num_replicas times one
    device's)."""
    reference, distributed, histories = _fit_both(
        STRATEGIES[strategy_name](),
        lambda: keras.optimizers.SGD(0.1),
        loss=lambda y, p: keras.ops.mean(keras.ops.square(y - p)),
    )
    assert_same_weights(reference, distributed, atol=1e-6)
    np.testing.assert_allclose(histories[1]["loss"], histories[0]["loss"], rtol=1e-5)


@pytest.mark.parametrize("strategy_name", ["mirrored-4", "central-storage-4"])
def test_a_global_batch_smaller_than_the_replica_count(strategy_name):
    """Batches of 2 (and a last one of 1) on 4 replicas: the replicas with
    no rows add nothing; the logged loss and evaluate() are one device's
    (TensorFlow logged NaN)."""
    reference, distributed, histories = _fit_both(
        STRATEGIES[strategy_name](), lambda: keras.optimizers.SGD(0.1), num_samples=9, batch_size=2
    )
    assert_same_weights(reference, distributed, atol=1e-6)
    assert np.all(np.isfinite(histories[1]["loss"]))
    np.testing.assert_allclose(histories[1]["loss"], histories[0]["loss"], rtol=1e-5)
    x, y = make_data(9)
    assert_same_logs(
        reference.evaluate(x, y, batch_size=2, verbose=0, return_dict=True),
        distributed.evaluate(x, y, batch_size=2, verbose=0, return_dict=True),
        atol=1e-6,
    )


def _convolutions():
    """Every convolution Keras' TensorFlow backend sends to tf's oneDNN
    kernels: Conv1D, Conv2D, DepthwiseConv2D, SeparableConv2D."""
    keras.utils.set_random_seed(3)
    return keras.Sequential(
        [
            keras.Input((6, 6, 2)),
            keras.layers.Conv2D(3, 3, padding="same", activation="tanh"),
            keras.layers.DepthwiseConv2D(3, activation="tanh"),
            keras.layers.SeparableConv2D(4, 2, padding="same", activation="tanh"),
            keras.layers.Reshape((16, 4)),
            keras.layers.Conv1D(2, 3),
            keras.layers.GlobalAveragePooling1D(),
            keras.layers.Dense(1, activation="sigmoid"),
        ]
    )


@pytest.mark.parametrize("strategy_name", ["mirrored-4", "central-storage-4"])
def test_convolutions_on_replicas_without_rows(strategy_name):
    """Batches of 2 (and a last one of 1) on 4 replicas through every kind
    of convolution: fit, evaluate and predict equal one device. (TensorFlow's
    oneDNN convolutions gave an empty batch the input's channels: the model
    failed in the next op.)"""
    x, y = make_data(9)
    x = np.random.RandomState(4).normal(size=(9, 6, 6, 2)).astype("float32")
    reference = _convolutions()
    reference.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    with STRATEGIES[strategy_name]().scope():
        distributed = _convolutions()
        distributed.set_weights(reference.get_weights())
        distributed.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size=2, epochs=2)


def _float_mlp():
    """An MLP in floatx (the helpers' `mlp` is float32 whatever floatx says)."""
    keras.utils.set_random_seed(1)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")]
    )


def test_a_float64_model_steps_in_float64():
    """Each replica's share of the global batch is taken in the loss's
    dtype (a float32 share left a float64 model 1e-9 off one device)."""
    if keras.backend.backend() == "jax":
        import jax

        if not jax.config.jax_enable_x64:
            pytest.skip("JAX without jax_enable_x64 computes a float64 model in float32 (plain Keras too)")
    previous, previous_policy = keras.config.floatx(), keras.config.dtype_policy()
    keras.config.set_floatx("float64")
    keras.config.set_dtype_policy("float64")
    try:
        reference, distributed, _ = _fit_both(
            keras_dist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]), lambda: keras.optimizers.SGD(0.1), build=_float_mlp
        )
    finally:
        keras.config.set_floatx(previous)
        keras.config.set_dtype_policy(previous_policy)
    assert distributed.get_weights()[0].dtype == np.float64
    assert_same_weights(reference, distributed, atol=1e-13)


@pytest.mark.parametrize("strategy_name", STRATEGIES)
def test_gradient_accumulation(strategy_name):
    """`SGD(gradient_accumulation_steps=3)` with momentum and clipping trains
    as one device, on both backends. TensorFlow refused it (its strategies
    cannot hold Keras' accumulate-or-update cond in replica context: plain
    tf.distribute fails with "merge_call called while defining a new
    graph"); keras_dist now applies it once in cross-replica context."""
    strategy = STRATEGIES[strategy_name]()

    def make_optimizer():
        return keras.optimizers.SGD(0.1, momentum=0.9, clipnorm=0.05, gradient_accumulation_steps=3)

    reference, distributed, _ = _fit_both(strategy, make_optimizer)
    assert_same_weights(reference, distributed, atol=1e-6)
    assert _iterations(distributed) == _iterations(reference)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's LossScaleOptimizer applies inside its own cond")
def test_loss_scaling_around_gradient_accumulation_is_one_clear_error_on_tensorflow():
    """A LossScaleOptimizer applies its inner optimizer inside its
    finite-gradients cond, in replica context, where the accumulating
    update (now run in cross-replica context) cannot go: refused before
    anything changes, naming what works."""
    strategy = STRATEGIES["mirrored-2"]()
    x, y = make_data(20)
    with strategy.scope():
        model = mlp()
        inner = keras.optimizers.SGD(0.1, gradient_accumulation_steps=2)
        model.compile(optimizer=keras.optimizers.LossScaleOptimizer(inner), loss="binary_crossentropy")
    before = model.get_weights()
    with pytest.raises(NotImplementedError, match="gradient_accumulation_steps=2.*loss scale"):
        model.fit(x, y, batch_size=10, epochs=1, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)
