"""Every optimizer Keras ships, as Keras ships it, trained under the
strategies of one process against the same model on one device.

The optimizers are other people's code: each writes its own state as it
likes (Nadam assigns a momentum product inside the replica step, Lamb and
Muon take norms of whole variables, Ftrl and Adafactor keep per-variable
accumulators, ScheduleFreeAdamW copies the weights into its momentum when
it builds). Each is built both ways users build one: lazily at the first
`fit` step, and eagerly (`optimizer.build(model.trainable_variables)` in
the scope). Two epochs of 4 uneven batches (8, 8, 8, 6 rows; 3+3+2 rows
per replica on 3 replicas) must end within 1e-6 of one device (measured:
3e-7 or less; Muon's Newton-Schulz iteration 2.5e-7).

The one-device reference always builds its optimizer eagerly: Keras'
TensorFlow backend builds ScheduleFreeAdamW lazily inside the traced step,
where its `assign(momentum, copy(variable))` starts the momentum at zero,
so plain Keras' first step replaces every weight by the learning rate
(measured: all weights 0.01 after one step; JAX, and keras_dist on both
backends, start the momentum at the weights as the paper does).

`make test-zoo` runs it (CI, after `make test`); `-m zoo` selects it.
tests/test_central_storage.py keeps Nadam under CentralStorageStrategy in
`make test` (tf refused its write: "You must specify an aggregation
method to update a AggregatingVariable in Replica Context").
"""

import keras
import numpy as np
import pytest

import keras_dist

#: The zoo's sample (make test-zoo-sample, tests/_suite_plugin.py) takes no case here: each trains all 14 optimizers (about 1 CPU-min); make test-zoo runs them.
ZOO_SAMPLE = None

pytestmark = pytest.mark.zoo

OPTIMIZERS = [
    "Adadelta", "Adafactor", "Adagrad", "Adam", "AdamW", "Adamax", "Ftrl",
    "Lamb", "Lion", "Muon", "Nadam", "RMSprop", "SGD", "ScheduleFreeAdamW",
]  # fmt: skip

STRATEGIES = {
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored-3": lambda: keras_dist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"]),
    "central-storage-3": lambda: keras_dist.CentralStorageStrategy(["cpu:0", "cpu:1", "cpu:2"]),
}


def test_the_list_is_every_optimizer_keras_ships():
    shipped = {
        name
        for name in dir(keras.optimizers)
        if isinstance(getattr(keras.optimizers, name), type)
        and issubclass(getattr(keras.optimizers, name), keras.optimizers.Optimizer)
    }
    wrappers = {"Optimizer", "LossScaleOptimizer", "MultiOptimizer", "OptimizerMap"}
    assert shipped - wrappers == set(OPTIMIZERS)


def _model(name, eager):
    keras.utils.set_random_seed(3)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(2)]
    )
    model.compile(optimizer=getattr(keras.optimizers, name)(learning_rate=0.01), loss="mse")
    if eager:
        model.optimizer.build(model.trainable_variables)
    return model


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(30, 5)).astype("float32")
    return x, np.stack([x.sum(1), x[:, 0] - x[:, 1]], axis=1).astype("float32")


@pytest.fixture(scope="module")
def one_device(data):
    """Each optimizer's weights after the one-device run (trained once)."""
    x, y = data
    weights = {}
    for name in OPTIMIZERS:
        reference = _model(name, eager=True)
        reference.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        weights[name] = reference.get_weights()
    return weights


@pytest.mark.slow("every optimizer Keras ships (14), each trained under the strategy and on one device (up to 64 s in make test-zoo)")
@pytest.mark.parametrize("build", ["lazy", "eager"])
@pytest.mark.parametrize("strategy_name", list(STRATEGIES))
def test_every_keras_optimizer_trains_as_one_device(strategy_name, build, data, one_device):
    x, y = data
    failures = {}
    for name in OPTIMIZERS:
        strategy = STRATEGIES[strategy_name]()
        with strategy.scope():
            distributed = _model(name, eager=build == "eager")
        distributed.fit(x, y, batch_size=8, epochs=2, shuffle=False, verbose=0)
        assert int(distributed.optimizer.iterations.numpy()) == 8, name
        diff = max(
            float(np.max(np.abs(a - b))) for a, b in zip(one_device[name], distributed.get_weights())
        )
        if not diff <= 1e-6:
            failures[name] = diff
    assert not failures, f"weights differ from one device's: {failures}"
