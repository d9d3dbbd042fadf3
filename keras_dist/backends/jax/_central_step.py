"""JAX: the steps behind `fit`, `evaluate` and `predict` for
CentralStorageStrategy.

Every variable (weights, optimizer slots, metrics) lives once, on the
parameter device (`engine.parameter_sharding`). One training step is two
compiled programs and the transfers between them:

1. the weights, non-trainable state and metric variables are copied onto
   the compute devices, and Keras' own `train_step` runs on the global
   batch split over them (the same SPMD program as MirroredStrategy, so the
   same exactness for uneven batches, BatchNorm and metrics), up to the
   optimizer: `optimizer.stateless_apply` is intercepted while the program
   is traced, and its gradients (summed over the whole global batch)
   become an output instead;
2. the gradients go to the parameter device, where a second program runs
   `optimizer.stateless_apply` once, on the only copy of the weights and
   of the optimizer's slots.

Between steps nothing stays on the compute devices. The optimizer's
variables never leave the parameter device, except where the loss needs
them (a `LossScaleOptimizer`, or a custom `train_step` /
`compute_loss_and_updates`, which may read them).
"""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import jax.numpy as jnp

from keras_dist import _heartbeat as heartbeat
from keras_dist.backends.jax import _engine
from keras_dist.backends.jax._state import restore_after_failure


class CentralStorageError(ValueError):
    """A custom `train_step` that CentralStorageStrategy cannot split."""


@contextlib.contextmanager
def _capture_apply(optimizer, captured: dict):
    """While tracing: `optimizer.stateless_apply` records its gradients and
    returns its inputs unchanged (the update runs on the parameter device)."""

    def capture(optimizer_variables, grads, trainable_variables):
        captured["grads"] = list(grads)
        captured["trainable"] = list(trainable_variables)
        return captured["trainable"], list(optimizer_variables)

    had_own = "stateless_apply" in vars(optimizer)
    previous = vars(optimizer).get("stateless_apply")
    optimizer.stateless_apply = capture
    try:
        yield
    finally:
        if had_own:
            optimizer.stateless_apply = previous
        else:
            del optimizer.stateless_apply


def _reads_optimizer_state(model) -> bool:
    """Whether computing the loss may read the optimizer's variables."""
    from keras.src.optimizers.base_optimizer import BaseOptimizer

    from keras_dist._keras_names import internal

    JAXTrainer = internal("keras.src.backend.jax.trainer:JAXTrainer")

    cls = type(model)
    return (
        cls.train_step is not JAXTrainer.train_step
        or cls.compute_loss_and_updates is not JAXTrainer.compute_loss_and_updates
        or type(model.optimizer).scale_loss is not BaseOptimizer.scale_loss
    )


class CentralStorageStep:
    """``step(state, data)`` for Keras' JAX trainer under CentralStorageStrategy."""

    def __init__(self, model, engine: Any, kind: str):
        if kind not in ("train", "test", "predict"):
            raise ValueError(f"kind must be 'train', 'test' or 'predict', got {kind!r}.")
        self.engine = engine
        self.kind = kind
        self.model = model
        self.replicated = _engine.replicated_sharding(engine)
        self.parameters = engine.parameter_sharding
        self.reads_optimizer_state = kind == "train" and _reads_optimizer_state(model)
        compute = self._compute_function()

        def compile_compute(data_sharding):
            return jax.jit(
                compute,
                in_shardings=(self.replicated, data_sharding),
                compiler_options=engine.compiler_options,
            )

        #: Takes batches placed beforehand (any batch).
        self.placed_program = compile_compute(None)
        #: Takes even host batches as they are; jit splits them on entry.
        self.host_program = compile_compute(_engine.batch_sharding(engine, 1))
        self.apply_program = None
        if kind == "train":
            optimizer = model.optimizer
            self.apply_program = jax.jit(
                lambda opt, grads, weights: optimizer.stateless_apply(opt, grads, weights),
                donate_argnums=(0, 2),
                in_shardings=self.parameters,
                out_shardings=self.parameters,
            )

    # -- the program on the compute devices --------------------------------
    def _compute_function(self):
        model, engine = self.model, self.engine

        if self.kind == "test":
            def test(state, data):
                logs, (_, non_trainable, metrics) = model.test_step(state, _engine.constrain_batch(engine, data))
                return logs, non_trainable, metrics

            return test

        if self.kind == "predict":
            def predict(state, data):
                outputs, non_trainable = model.predict_step(state, _engine.constrain_batch(engine, data))
                return _engine.gather_uneven_outputs(engine, data, outputs), non_trainable

            return predict

        optimizer = model.optimizer
        reads_optimizer_state = self.reads_optimizer_state

        def train(state, data):
            trainable, non_trainable, optimizer_state, metrics = state
            if not reads_optimizer_state:  # unread: XLA drops these
                optimizer_state = [jnp.zeros(v.shape, v.dtype) for v in optimizer.variables]
            captured: dict = {}
            with _capture_apply(optimizer, captured):
                logs, new_state = model.train_step(
                    (trainable, non_trainable, optimizer_state, metrics),
                    _engine.constrain_batch(engine, data),
                )
            _check_split(captured, new_state[0])
            return logs, new_state[1], new_state[3], captured["grads"]

        return train

    # -- one step -----------------------------------------------------------
    def program_for(self, data):
        if _engine.splits_evenly_on_entry(self.engine, data):
            return self.host_program, data
        return self.placed_program, _engine.place_host_data(self.engine, data)

    def __call__(self, state, data):
        heartbeat.beat()
        try:
            return self._step(state, data)
        except Exception:
            restore_after_failure(self.model, self.kind, state)
            raise

    def _step(self, state, data):
        program, data = self.program_for(data)
        to_compute = lambda values: jax.device_put(list(values), self.replicated)  # noqa: E731
        to_parameters = lambda values: jax.device_put(list(values), self.parameters)  # noqa: E731
        if self.kind == "train":
            trainable, non_trainable, optimizer_state, metrics = state
            shipped = optimizer_state if self.reads_optimizer_state else None
            logs, non_trainable, metrics, grads = program(
                (to_compute(trainable), to_compute(non_trainable), None if shipped is None else to_compute(shipped), to_compute(metrics)),
                data,
            )
            trainable, optimizer_state = self.apply_program(optimizer_state, to_parameters(grads), trainable)
            return logs, (trainable, to_parameters(non_trainable), optimizer_state, to_parameters(metrics))
        if self.kind == "test":
            trainable, non_trainable, metrics = state
            logs, non_trainable, metrics = program(
                (to_compute(trainable), to_compute(non_trainable), to_compute(metrics)), data
            )
            return logs, (trainable, to_parameters(non_trainable), to_parameters(metrics))
        trainable, non_trainable = state
        outputs, non_trainable = program((to_compute(trainable), to_compute(non_trainable)), data)
        return outputs, (trainable, to_parameters(non_trainable))


def _check_split(captured: dict, new_trainable) -> None:
    """The step must update the weights through `optimizer.stateless_apply`
    and nothing else: that is the update moved to the parameter device."""
    if "grads" not in captured:
        raise CentralStorageError(
            "CentralStorageStrategy on JAX applies the optimizer on the parameter "
            "device, so train_step must update the weights with "
            "self.optimizer.stateless_apply(optimizer_variables, grads, "
            "trainable_variables), as Keras' own train_step does; this model's "
            "train_step never called it. Call it, or use MirroredStrategy."
        )
    if len(new_trainable) != len(captured["trainable"]) or any(
        a is not b for a, b in zip(new_trainable, captured["trainable"])
    ):
        raise CentralStorageError(
            "CentralStorageStrategy on JAX: train_step must return the trainable "
            "variables that self.optimizer.stateless_apply returned, unchanged "
            "(the update itself runs on the parameter device). Use MirroredStrategy "
            "for a train_step that changes the weights in other ways."
        )
