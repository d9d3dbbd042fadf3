"""A model nobody on the team wrote: `keras.applications.MobileNetV2`, as
Keras ships it (depthwise and pointwise convolutions, 52 BatchNormalization
layers, ReLU6, global pooling, a softmax head), trained under the strategies
of one process against the same model on one device.

Small images and a narrow network (alpha=0.35, 32x32x3, 10 classes) keep
it a test; the layers and their wiring are the application's own. The
training batch splits unevenly over the replicas (3+3+2 rows on 3), so
BatchNormalization's global moments and the loss scaling meet what a real
pipeline gives them; evaluate and predict then run on uneven and partial
batches.

One training step, not an epoch: on these inputs (random images and
labels, BatchNormalization over a few rows at 1x1 in its last layers) the
model is chaotic. A 1e-6 relative perturbation of the one-device run's
weights grows to a 0.1 weight difference in three SGD steps, as large as
the distributed run's (measured), so a longer run could not
tell a bug from round-off. One step is well conditioned: the distributed
weights are within 3e-5 of one device's after a step that moved them 0.1.

`make test-zoo` runs it (CI, after `make test`); `-m zoo` selects it.
"""

import keras
import numpy as np
import pytest

import keras_dist

#: The strategies of one process (multi-worker and parameter-server jobs
#: train their own models in tests/test_multi_worker.py and
#: test_parameter_server.py).
STRATEGIES = {
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-3": lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]),
    "central-storage-2": lambda: keras_dist.CentralStorageStrategy(["cpu:0", "cpu:1"]),
}

ROWS, BATCH = 22, 8  # evaluate/predict: batches of 8, 8, 6


def _application():
    keras.utils.set_random_seed(7)
    return keras.applications.MobileNetV2(
        input_shape=(32, 32, 3), alpha=0.35, weights=None, classes=10, classifier_activation="softmax"
    )


def _compile(model):
    model.compile(
        optimizer=keras.optimizers.SGD(0.005),
        loss="sparse_categorical_crossentropy",
        metrics=["sparse_categorical_accuracy"],
    )
    return model


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(ROWS, 32, 32, 3)).astype("float32")
    y = rng.integers(0, 10, size=(ROWS,)).astype("int32")
    return x, y


def _one_step_then_inference(model, x, y):
    history = model.fit(x[:BATCH], y[:BATCH], batch_size=BATCH, epochs=1, shuffle=False, verbose=0).history
    logs = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    return history, model.get_weights(), logs, model.predict(x, batch_size=BATCH, verbose=0)


@pytest.fixture(scope="module")
def one_device(data):
    """The application on one device, outside any strategy: its initial
    weights, then one step's history and weights, evaluate's logs and the
    predictions."""
    model = _compile(_application())
    initial = model.get_weights()
    return initial, *_one_step_then_inference(model, *data)


#: The zoo's sample (make test runs it, tests/_suite_plugin.py; make test-zoo the rest): on JAX
#: MobileNetV2 under Mirrored(3), 28 CPU-s with the one-device run it compares with. None on
#: TensorFlow: its multi-replica cases cost 31-45 CPU-s (tf traces each replica's copy).
ZOO_SAMPLE = {"jax": "[mirrored-3]", "tensorflow": None}


@pytest.mark.zoo
@pytest.mark.slow("MobileNetV2 (155 layers) compiled for each strategy and for one device")
@pytest.mark.parametrize("strategy_name", sorted(STRATEGIES))
def test_mobilenet_v2_trains_as_one_device(strategy_name, data, one_device):
    initial, history_ref, weights_ref, logs_ref, predictions_ref = one_device
    strategy = STRATEGIES[strategy_name]()
    with strategy.scope():
        model = _compile(_application())
    model.set_weights(initial)
    history, weights, logs, predictions = _one_step_then_inference(model, *data)
    for key, values in history_ref.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    # the step moved the weights the same way, BatchNorm's moving statistics
    # (non-trainable) included.
    # Round-off, grown by the model's conditioning (above): 2e-6 on JAX,
    # 3e-5 on TensorFlow, on a step of 0.1.
    step = max(float(np.max(np.abs(a - b))) for a, b in zip(weights_ref, initial))
    worst = max(float(np.max(np.abs(a - b))) for a, b in zip(weights, weights_ref))
    assert worst <= 1e-3 * step, (worst, step)
    for key, value in logs_ref.items():
        assert logs[key] == pytest.approx(value, rel=1e-5, abs=1e-6), key
    assert predictions.shape == (ROWS, 10)
    np.testing.assert_allclose(predictions, predictions_ref, rtol=1e-5, atol=1e-6)
