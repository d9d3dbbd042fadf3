"""Keras' `OrbaxCheckpoint` (Keras >= 3.13) under a strategy whose job is
one process: it saves, restores and resumes as plain Keras does on one
device (issue #49). A multi-worker job refuses it before any step
(tests/test_first_hour.py), as does a parameter-server coordinator
(tests/test_parameter_server.py, the bad-inputs job).

orbax-checkpoint brings jax: on JAX it is in the `[orbax]` extra `make test`
installs; on TensorFlow `make test-tensorflow-with-orbax` runs this file
where both are installed (tests/conftest.py, `needs_orbax`).
"""

import os

import keras
import numpy as np
import pytest

import keras_dist
from conftest import BACKEND

pytestmark = [
    pytest.mark.needs_orbax,
    pytest.mark.skipif(not hasattr(keras.callbacks, "OrbaxCheckpoint"), reason="Keras before 3.13 has no OrbaxCheckpoint"),
]

RNG = np.random.RandomState(0)
X = (RNG.randn(64, 5) * 0.5).astype("float32")
Y = (X @ RNG.randn(5, 1)).astype("float32")


def _make():
    # fixed names: Orbax stores the state tree by layer path, and a model
    # made later in the process would get other automatic names
    keras.utils.set_random_seed(1)
    model = keras.Sequential(
        [keras.Input((5,)), keras.layers.Dense(8, activation="tanh", name="hidden"), keras.layers.Dense(1, name="out")],
        name="net",
    )
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse")
    return model


def _strategy(kind):
    if kind == "one-device":
        return keras_dist.OneDeviceStrategy("cpu:0")
    if BACKEND == "torch":
        return keras_dist.MirroredStrategy(["cpu:0"])
    devices = [f"cpu:{i}" for i in range(4)]
    return keras_dist.MirroredStrategy(devices) if kind == "mirrored" else keras_dist.experimental.CentralStorageStrategy(devices)


def _in(strategy, make):
    if strategy is None:
        return make()
    with strategy.scope():
        return make()


def _run(strategy, directory):
    """Two epochs with the checkpoint; then a fresh model restored from it,
    and one more epoch of each."""
    model = _in(strategy, _make)
    model.fit(X, Y, batch_size=16, epochs=2, shuffle=False, verbose=0,
              callbacks=[keras.callbacks.OrbaxCheckpoint(str(directory), max_to_keep=2)])
    trained = [np.array(w) for w in model.get_weights()]
    restored = _in(strategy, _make)
    restored.load_weights(str(directory))
    restored_weights = [np.array(w) for w in restored.get_weights()]
    restored.fit(X, Y, batch_size=16, epochs=1, shuffle=False, verbose=0)
    return sorted(os.listdir(directory)), trained, restored_weights, [np.array(w) for w in restored.get_weights()]


def _gap(a, b):
    return max(float(np.max(np.abs(x - y))) for x, y in zip(a, b))


@pytest.mark.parametrize("kind", ["one-device", "mirrored", "central-storage"])
def test_orbax_checkpoint_saves_restores_and_resumes_as_one_device(kind, tmp_path):
    plain = _run(None, tmp_path / "plain")
    distributed = _run(_strategy(kind), tmp_path / kind)
    assert distributed[0] == plain[0] == ["0", "1"]  # the same steps kept, written once each
    assert _gap(distributed[1], plain[1]) < 1e-6  # trained as one device
    assert _gap(distributed[2], distributed[1]) == 0.0  # restored exactly
    assert _gap(distributed[2], plain[2]) < 1e-6
    assert _gap(distributed[3], plain[3]) < 1e-6  # resumed as plain Keras resumes
    # the checkpoint a strategy wrote loads into a plain model, exactly
    one = _make()
    one.load_weights(str(tmp_path / kind))
    assert _gap(one.get_weights(), distributed[1]) == 0.0


@pytest.mark.skipif(BACKEND != "jax", reason="TensorFlow: tests/test_parameter_server.py's bad-inputs job; torch has no "
                                             "ParameterServerStrategy")
def test_orbax_checkpoint_under_a_parameter_server_coordinator_is_one_clear_error(tmp_path):
    """The coordinator's copy of the variables is current only after each
    epoch's join: refused before any Ray actor starts or any weight or
    checkpoint is written."""
    resolver = keras_dist.cluster_resolver.SimpleClusterResolver(
        keras_dist.cluster_resolver.ClusterSpec(
            {"chief": ["localhost:1"], "worker": ["localhost:2"], "ps": ["localhost:3"]}),
        task_type="chief", task_id=0,
    )
    strategy = keras_dist.ParameterServerStrategy(resolver)
    model = _in(strategy, _make)
    before = model.get_weights()
    checkpoint = keras.callbacks.OrbaxCheckpoint(str(tmp_path / "ckpt"))
    with pytest.raises(ValueError, match="OrbaxCheckpoint under a ParameterServerStrategy") as raised:
        model.fit(keras_dist.experimental.DatasetCreator(lambda context: None), epochs=1, steps_per_epoch=2,
                  callbacks=[checkpoint], verbose=0)
    assert "keras.callbacks.BackupAndRestore" in str(raised.value)
    assert _gap(before, model.get_weights()) == 0.0
    assert not os.path.exists(tmp_path / "ckpt" / "0")
