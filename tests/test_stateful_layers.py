"""Stateful recurrent layers (`stateful=True`) under every strategy of one
process, built lazily and eagerly: one device's math where the step sees
the global batch, else one clear error before anything changes.

Found porting tf-keras's `keras_stateful_lstm_model_correctness_test.py`
(its methods need a TPU: tests/peer/README.md): on TensorFlow an LSTM with
`stateful=True` under MirroredStrategy(4) failed deep in the graph
(`BroadcastGradientArgs`), as the layer's state holds one row per row of
the global batch and each replica got a quarter of them.
"""

import numpy as np
import pytest
import keras

import keras_dist
from conftest import BACKEND

BATCH = 8

#: name -> (make the strategy, replicas its steps split the global batch over)
STRATEGIES = {
    "default": (keras_dist.get_strategy, 1),
    "one-device": (lambda: keras_dist.OneDeviceStrategy("cpu:1"), 1),
    "mirrored-1": (lambda: keras_dist.MirroredStrategy(["cpu:0"]), 1),
    "mirrored-2": (lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1"]), 2),
    "mirrored-4": (lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]), 4),
    "central-storage-4": (lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(4)]), 4),
}

REFUSED = r"Layer '\w+' is stateful \(stateful=True\).*splits the batch over \d replicas.*Train it on one replica"


def _model(build):
    keras.utils.set_random_seed(5)
    layers = [keras.layers.LSTM(3, stateful=True), keras.layers.Dense(1)]
    if build == "eager":  # batch size known up front, as stateful layers usually are
        layers.insert(0, keras.Input((4, 2), batch_size=BATCH))
    model = keras.Sequential(layers)
    model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse", metrics=["mae"])
    return model


def _data():
    rng = np.random.default_rng(7)
    x = rng.normal(size=(3 * BATCH, 4, 2)).astype("float32")
    return x, x[:, :, 0].sum(axis=1, keepdims=True)


def _train(model, x, y):
    """fit, evaluate and two predicts (the state carries over between batches and calls)."""
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    evaluated = model.evaluate(x, y, batch_size=BATCH, verbose=0)
    predicted = [model.predict(x, batch_size=BATCH, verbose=0) for _ in range(2)]
    states = [keras.ops.convert_to_numpy(s) for s in model.layers[0].states]
    return history, evaluated, predicted, model.get_weights(), states


@pytest.mark.parametrize("build", ["lazy", "eager"])
@pytest.mark.parametrize(
    "name",
    [
        pytest.param(name, marks=pytest.mark.extended("another replica count of MirroredStrategy: make test runs 2"))
        if name in ("mirrored-1", "mirrored-4") else name
        for name in sorted(STRATEGIES)
    ],
)
def test_a_stateful_lstm_trains_as_one_device_or_is_refused(name, build):
    """Where the steps see the global batch (one replica; JAX's steps in
    one process) fit/evaluate/predict equal one device's, the state carried
    from batch to batch; where they split it (TensorFlow on 2+ replicas)
    one clear error names the fix, before the weights or the state change.
    Built lazily, plain Keras on JAX cannot build it (nor can keras_dist);
    on TensorFlow a strategy asks for it built first."""
    make, replicas = STRATEGIES[name]
    x, y = _data()
    strategy = make()
    if BACKEND == "jax" and build == "lazy":
        # plain Keras on JAX cannot build a stateful layer in its first
        # (traced) step; under a strategy it fails the same way
        for scope in (keras_dist.get_strategy().scope(), strategy.scope()):
            with scope:
                model = _model(build)
            with pytest.raises(ValueError, match="create a variable while in a stateless scope"):
                model.fit(x, y, batch_size=BATCH, verbose=0)
        return
    expected = _train(_model(build), x, y)
    with strategy.scope():
        model = _model(build)
    if build == "lazy" and name != "default":
        # TensorFlow: plain Keras builds it while tracing its first step; a
        # strategy builds the model before (Keras' symbolic build, where a
        # stateful layer cannot make its state): one clear error, the fix
        # named, then the fix works
        with pytest.raises(ValueError, match=r"stateful \(stateful=True\) and not built yet.*model.build"):
            model.fit(x, y, batch_size=BATCH, verbose=0)
        with strategy.scope():
            model.build((BATCH, 4, 2))
    if replicas > 1 and BACKEND == "tensorflow":
        if build == "eager":
            before = model.get_weights()
        for call in (
            lambda: model.fit(x, y, batch_size=BATCH, verbose=0),
            lambda: model.evaluate(x, y, batch_size=BATCH, verbose=0),
            lambda: model.predict(x, batch_size=BATCH, verbose=0),
        ):
            with pytest.raises(ValueError, match=REFUSED):
                call()
        if build == "eager":
            for a, b in zip(before, model.get_weights()):
                np.testing.assert_array_equal(a, b)
            assert int(model.optimizer.iterations.numpy()) == 0
        return
    got = _train(model, x, y)
    for key in expected[0]:
        np.testing.assert_allclose(got[0][key], expected[0][key], rtol=1e-5, atol=1e-6, err_msg=key)
    np.testing.assert_allclose(got[1], expected[1], rtol=1e-5, atol=1e-6)
    for a, b in zip(got[2] + got[3] + got[4], expected[2] + expected[3] + expected[4]):
        np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["mirrored-2", "central-storage-4"])
def test_a_stateful_lstm_inside_run_on_several_replicas_is_refused(name):
    """Inside `strategy.run` each replica gets its own rows: the layer's
    state (the global batch's rows) cannot be split there, on either
    backend; one replica runs it as one device."""
    strategy = STRATEGIES[name][0]()
    with strategy.scope():
        model = _model("eager")
    x, _ = _data()
    state = [keras.ops.convert_to_numpy(s) for s in model.layers[0].states]
    dataset = strategy.experimental_distribute_dataset([x[:BATCH]])
    with pytest.raises(ValueError, match=REFUSED):
        for batch in dataset:
            strategy.run(lambda b: model(b), args=(batch,))
    for a, b in zip(state, model.layers[0].states):
        np.testing.assert_array_equal(a, keras.ops.convert_to_numpy(b))
    one = keras_dist.OneDeviceStrategy("cpu:0")
    with one.scope():
        single = _model("eager")
    reference = _model("eager")
    out = one.run(lambda b: single(b), args=(x[:BATCH],))
    np.testing.assert_allclose(keras.ops.convert_to_numpy(out), keras.ops.convert_to_numpy(reference(x[:BATCH])), atol=1e-6)

