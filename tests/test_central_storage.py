"""CentralStorageStrategy: variables live once, on the parameter device, and
training matches one device on the same global batches (the Mirrored
contract: weights 1e-5 after an epoch, metrics 1e-6)."""

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import assert_fit_evaluate_predict_match, make_data, twin
from conftest import BACKEND
from test_custom_loops import _check_custom_loop, _numpy_batches

CASES = {
    # name: (num_samples, global batch size, batch_norm)
    "batch10-partial": (203, 10, False),  # 10 rows on 4 replicas; last batch 3
    "batchnorm-batch10": (203, 10, True),
    "partial-1003-64": (1003, 64, False),
}


def central(num_replicas, parameter_device=None):
    return keras_dist.CentralStorageStrategy(
        [f"cpu:{i}" for i in range(num_replicas)], parameter_device=parameter_device
    )


#: SGD on 1, 2 and 4 replicas; Adam where its slots, kept on the parameter
#: device, meet the most uneven shards (4 replicas). On 1 and 2 replicas Adam
#: re-ran SGD's code path (the same gradients, reduced the same way), as in
#: test_equivalence.py; tests/test_optimizer_zoo.py trains every Keras
#: optimizer under CentralStorage (make test-zoo).
@pytest.mark.parametrize(
    "num_replicas, optimizer",
    [
        pytest.param(1, "sgd", id="sgd-1", marks=pytest.mark.extended("one replica: make test runs 2 and 4")),
        pytest.param(2, "sgd", id="sgd-2"),
        pytest.param(4, "sgd", id="sgd-4"),
        pytest.param(4, "adam", id="adam-4", marks=pytest.mark.extended("Adam on the path make test runs with SGD")),
    ],
)
@pytest.mark.parametrize("case", ["batch10-partial", "batchnorm-batch10"])
def test_fit_evaluate_predict_match_single_device(num_replicas, optimizer, case):
    num_samples, batch_size, batch_norm = CASES[case]
    x, y = make_data(num_samples)
    reference, distributed = twin(central(num_replicas), optimizer=optimizer, batch_norm=batch_norm)
    assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size, epochs=1)


def test_an_optimizer_writing_its_own_state_in_the_replica_step_trains_as_one_device():
    """Keras' Nadam assigns its momentum product inside the replica step (an
    aggregation "none" variable, the same value on every replica); tf's
    CentralStorageStrategy refused it ("You must specify an aggregation
    method to update a AggregatingVariable in Replica Context").
    tests/test_optimizer_zoo.py covers every Keras optimizer (make test-zoo)."""
    num_samples, batch_size, _ = CASES["batch10-partial"]
    x, y = make_data(num_samples)
    reference, distributed = twin(central(4), optimizer="nadam")
    assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size, epochs=1)


@pytest.mark.parametrize("num_replicas", [1, 4])
@pytest.mark.parametrize("case", ["batch10-partial", "partial-1003-64"])
def test_custom_loop_matches_single_device(num_replicas, case):
    _check_custom_loop(lambda n: central(n), case, num_replicas, _numpy_batches)


def _devices_holding(variable) -> set:
    """Canonical names of the devices that hold a copy of `variable`."""
    value = variable.value
    if BACKEND == "jax":
        return {f"{d.platform}:{d.id}" for d in value.sharding.device_set}
    from keras_dist._devices import canonical_device

    copies = getattr(variable._value, "values", None)  # tf's per-device variables
    if copies is not None:
        return {canonical_device(c.device) for c in copies}
    return {canonical_device(variable._value.device)}


def test_every_variable_lives_once_on_the_parameter_device():
    strategy = central(2, parameter_device="cpu:3")  # not a compute device
    assert strategy.extended.parameter_devices == ("cpu:3",)
    assert strategy.extended.worker_devices == ("cpu:0", "cpu:1")
    x, y = make_data(64)
    _, model = twin(strategy, optimizer="adam", batch_norm=True)
    model.fit(x, y, batch_size=16, epochs=1, verbose=0)
    weights = model.weights + model.optimizer.variables  # BatchNorm statistics included
    assert len(weights) > 10
    for variable in weights:
        assert _devices_holding(variable) == {"cpu:3"}, variable.path
    for variable in model.metrics_variables:
        if BACKEND == "jax":
            assert _devices_holding(variable) == {"cpu:3"}, variable.path
        else:
            # tf: metric accumulators keep a partial value per compute device
            # (SyncOnRead), summed when read; see guides/distributed_training.md
            assert _devices_holding(variable) == {"cpu:0", "cpu:1"}, variable.path


def test_default_devices():
    strategy = keras_dist.CentralStorageStrategy()
    assert strategy.num_replicas_in_sync == 4
    assert strategy.extended.parameter_devices == ("cpu:0",)
    one = keras_dist.CentralStorageStrategy(["cpu:2"])
    assert one.extended.parameter_devices == ("cpu:2",)  # the one compute device
    assert "parameter_device=cpu:0" in repr(strategy)


def test_bad_parameter_device():
    with pytest.raises(TypeError, match="one device name"):
        keras_dist.CentralStorageStrategy(parameter_device=["cpu:0"])
    with pytest.raises(ValueError, match="cpu:9"):
        keras_dist.CentralStorageStrategy(parameter_device="cpu:9")


def test_experimental_spelling_is_the_same_class():
    assert keras_dist.experimental.CentralStorageStrategy is keras_dist.CentralStorageStrategy
    assert keras_dist.experimental.MultiWorkerMirroredStrategy is keras_dist.MultiWorkerMirroredStrategy
    assert keras_dist.experimental.TPUStrategy is keras_dist.TPUStrategy
    with pytest.raises(AttributeError, match="NoSuchStrategy"):
        keras_dist.experimental.NoSuchStrategy


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's step is split at optimizer.stateless_apply; tf's is not")
def test_jax_train_step_that_skips_stateless_apply_is_a_clear_error():
    class NoOptimizer(keras.Sequential):
        def train_step(self, state, data):
            trainable, non_trainable, optimizer_state, metrics = state
            return {"loss": keras.ops.zeros(())}, state

    strategy = central(2)
    with strategy.scope():
        model = NoOptimizer([keras.Input((3,)), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    from keras_dist.backends.jax._central_step import CentralStorageError

    with pytest.raises(CentralStorageError, match="stateless_apply"):
        model.fit(np.ones((8, 3)), np.ones((8, 1)), batch_size=4, verbose=0)
    for a, b in zip(before, model.get_weights()):
        np.testing.assert_array_equal(a, b)  # nothing changed; the model still works
    assert model.predict(np.ones((2, 3)), verbose=0).shape == (2, 1)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a layer built inside tf.function: TensorFlow code")
def test_a_layer_built_lazily_inside_tf_function_lives_on_the_parameter_device_and_trains_as_one_device():
    """tf-keras's custom-loop tests build a Dense at its first call inside a
    `tf.function` step; tf's CentralStorage creator failed there (`Using a
    symbolic tf.Tensor as a Python bool`), under plain tf.distribute too."""
    import tensorflow as tf

    x, y = make_data(40)
    batches = [(x[i : i + 10], y[i : i + 10]) for i in range(0, 40, 10)]

    def train(strategy):
        with strategy.scope():
            layer = keras.layers.Dense(1, kernel_initializer=keras.initializers.GlorotUniform(seed=4))
            optimizer = keras.optimizers.SGD(0.1)

        @tf.function
        def step(inputs):
            def replica_step(features, labels):
                with tf.GradientTape() as tape:
                    loss = keras_dist.compute_average_loss(keras.losses.mean_squared_error(labels[:, None], layer(features)))
                optimizer.apply_gradients(zip(tape.gradient(loss, layer.trainable_variables), layer.trainable_variables))
                return loss

            return strategy.run(replica_step, args=inputs)

        for inputs in strategy.experimental_distribute_dataset(batches):
            step(inputs)
        return layer

    reference = train(keras_dist.get_strategy())
    layer = train(central(4, parameter_device="cpu:3"))
    for variable in layer.weights:
        assert _devices_holding(variable) == {"cpu:3"}, variable.path
    for a, b in zip(reference.get_weights(), layer.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-6, rtol=0)
