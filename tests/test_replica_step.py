"""JAX's per-replica training step (multi-process CPU jobs take it): each
replica runs Keras' train_step on its rows, gradients summed in one packed
all-reduce. Forced on here, in one process, and compared with a real
single-device run; models it cannot run exactly keep the SPMD step."""

import numpy as np
import pytest
import keras

from _helpers import make_data, mlp, two_heads
from conftest import BACKEND, jax_train_step

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="JAX's per-replica step")


def _compile(model, optimizer):
    model.compile(
        optimizer=optimizer,
        loss="binary_crossentropy",
        metrics=["accuracy", keras.metrics.AUC(name="auc")],
    )
    return model


def _pair(strategy, build, optimizer):
    reference = _compile(build(), optimizer())
    with strategy.scope():
        distributed = _compile(build(), optimizer())
    distributed.set_weights(reference.get_weights())
    return reference, distributed


@pytest.mark.parametrize("replicas", [2, 4])
@pytest.mark.parametrize(
    "optimizer",
    [
        lambda: keras.optimizers.Adam(0.01),
        lambda: keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, momentum=0.9)),
    ],
    ids=["adam", "loss_scale_sgd"],
)
def test_per_replica_step_matches_one_device(per_replica_step, mirrored, replicas, optimizer):
    """BatchNorm, an L2 regularizer, sample weights, AUC; 43 rows in batches
    of 8: five even batches (per replica) and a partial one (SPMD step)."""
    x, y = make_data(43)
    weights = np.linspace(0.5, 1.5, 43).astype("float32")
    strategy = mirrored(replicas)
    reference, distributed = _pair(
        strategy, lambda: mlp(batch_norm=True, regularizer="l2"), optimizer
    )
    fits = [
        m.fit(x, y, sample_weight=weights, batch_size=8, epochs=2, shuffle=False, verbose=0).history
        for m in (reference, distributed)
    ]
    step = jax_train_step(distributed)
    assert step.replica_program is not None
    assert step.program_for((x[:8], y[:8]))[0] is step.replica_program
    assert step.program_for((x[:3], y[:3]))[0] is not step.replica_program
    for a, b in zip(reference.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)
    for key, values in fits[0].items():
        np.testing.assert_allclose(fits[1][key], values, atol=1e-5, err_msg=key)
    np.testing.assert_allclose(
        distributed.evaluate(x, y, batch_size=8, verbose=0),
        reference.evaluate(x, y, batch_size=8, verbose=0),
        atol=1e-5,
    )


def test_per_replica_step_logs_each_output_loss_as_one_device(per_replica_step, mirrored):
    x, y = make_data(40)
    targets = {"a": y, "b": 2 * y - 1}

    def compile_heads(model):
        model.compile(
            optimizer=keras.optimizers.SGD(0.1),
            loss={"a": "binary_crossentropy", "b": "mse"},
            loss_weights={"a": 1.0, "b": 0.5},
        )
        return model

    reference = compile_heads(two_heads())
    with mirrored(4).scope():
        distributed = compile_heads(two_heads())
    distributed.set_weights(reference.get_weights())
    fits = [m.fit(x, targets, batch_size=8, epochs=2, shuffle=False, verbose=0).history for m in (reference, distributed)]
    assert jax_train_step(distributed).replica_program is not None
    assert set(fits[0]) == {"loss", "a_loss", "b_loss"}
    for key, values in fits[0].items():
        np.testing.assert_allclose(fits[1][key], values, atol=1e-5, err_msg=key)
    for a, b in zip(reference.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


class _CustomStep(keras.Sequential):
    def train_step(self, state, data):
        return super().train_step(state, data)


def _with_dropout():
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(4), keras.layers.Dropout(0.5), keras.layers.Dense(1, activation="sigmoid")]
    )


def _custom_step():
    return _CustomStep([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])


@pytest.mark.parametrize("build", [_with_dropout, _custom_step], ids=["dropout", "custom_train_step"])
def test_models_it_cannot_run_exactly_keep_the_spmd_step(per_replica_step, mirrored, build):
    """Random layers (each replica would draw its own numbers) and custom
    train steps (their gradients would not be summed) are left to SPMD."""
    x, y = make_data(16)
    strategy = mirrored(2)
    with strategy.scope():
        model = _compile(build(), keras.optimizers.SGD(0.1))
    model.fit(x, y, batch_size=8, verbose=0)
    assert jax_train_step(model).replica_program is None


def test_single_process_jobs_keep_the_spmd_step(mirrored):
    """By default only multi-process CPU jobs train per replica."""
    x, y = make_data(16)
    with mirrored(2).scope():
        model = _compile(mlp(), keras.optimizers.SGD(0.1))
    model.fit(x, y, batch_size=8, verbose=0)
    assert jax_train_step(model).replica_program is None


def test_gloo_event_loop_is_recognised_by_its_wait():
    from keras_dist.backends._gloo import is_gloo_event_loop

    gloo = "232 0xe 0x7f61cdffab30 0x40 0xa 0x0 0x0 0x7f61cdffaa98 0x7f6218326f36"
    grpc = "232 0x5 0x7f61cdffab30 0x64 0xffffffff 0x0 0x0 0x7f61cdffaa98 0x7f6218326f36"
    assert is_gloo_event_loop(gloo, "x86_64")
    assert not is_gloo_event_loop(grpc, "x86_64")
    assert not is_gloo_event_loop("running", "x86_64")
    assert not is_gloo_event_loop("202 0xe 0x0 0x40 0xa 0x0", "x86_64")  # a futex wait
    assert is_gloo_event_loop("22 0xe 0x7f 0x40 0xa 0x0 0x0", "aarch64")


def test_bad_gloo_event_loop_setting_is_refused(monkeypatch):
    from keras_dist.backends import _gloo

    monkeypatch.setenv("KERAS_DIST_GLOO_EVENT_LOOP", "low")
    with pytest.raises(ValueError, match="'auto'.*'idle' or 'normal'"):
        _gloo.yield_event_loop()
    monkeypatch.setenv("KERAS_DIST_GLOO_EVENT_LOOP", "normal")
    assert _gloo.yield_event_loop() == []
