"""JAX: the compiled steps behind `fit`, `evaluate` and `predict`.

Keras' JAX trainer runs ``step(state, data) -> (outputs, state)``; the hook
on `JAXTrainer.make_*_function` asks `make_trainer_function` for ours. The
step is Keras' own `train_step`/`test_step`/`predict_step` on global arrays,
with the batch split over the mesh inside the jitted program (SPMD: the
math of one device). One `JaxStep` holds up to three compiled programs and
picks one per batch (`program_for`):

- even host (numpy) batches of a single-process engine go in as they are,
  and `jit` splits them onto the devices (the path plain Keras takes);
- other batches (uneven, multi-process, already placed) are placed first;
- multi-process CPU engines train even batches per replica, with one packed
  gradient all-reduce (`_replica_step`), for the models that can.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import jax

from keras_dist import _heartbeat as heartbeat
from keras_dist.backends.jax import _engine, _replica_step


def trains_exactly_per_replica(model) -> bool:
    """Whether a per-replica step trains `model` as one device would:
    Keras' own `train_step` and `compute_loss_and_updates` (whose hook sums
    the gradients), and no random layers (each replica would draw its own
    numbers where one device draws them for the whole batch)."""
    from keras.src.backend.jax.trainer import JAXTrainer

    cls = type(model)
    return (
        cls.train_step is JAXTrainer.train_step
        and cls.compute_loss_and_updates is JAXTrainer.compute_loss_and_updates
        and not any(getattr(layer, "_seed_generators", None) for layer in model._flatten_layers())
    )


def _state_shardings(model, engine, kind: str) -> tuple:
    replicated = _engine.replicated_sharding(engine)

    def shardings(variables):
        return [replicated] * len(variables)

    optimizer = getattr(model, "optimizer", None)
    trainable = shardings(model.trainable_variables)
    non_trainable = shardings(model.non_trainable_variables)
    if kind == "train":
        return (trainable, non_trainable, shardings(optimizer.variables if optimizer else []), shardings(model.metrics_variables))
    if kind == "test":
        return (trainable, non_trainable, shardings(model.metrics_variables))
    return (trainable, non_trainable)


def _global_step(model, engine, kind: str) -> Callable:
    """Keras' step of this kind on the global batch, split over the mesh."""
    if kind == "train":
        return lambda state, data: model.train_step(state, _engine.constrain_batch(engine, data))
    if kind == "test":
        return lambda state, data: model.test_step(state, _engine.constrain_batch(engine, data))

    def predict(state, data):
        outputs, non_trainable = model.predict_step(state, _engine.constrain_batch(engine, data))
        outputs = _engine.gather_uneven_outputs(engine, data, outputs)
        return outputs, (state[0], non_trainable)

    return predict


class JaxStep:
    """``step(state, data)`` for Keras' JAX trainer: the compiled programs of
    one step kind, and the choice of program per batch."""

    def __init__(self, model, engine: Any, kind: str):
        if kind not in ("train", "test", "predict"):
            raise ValueError(f"kind must be 'train', 'test' or 'predict', got {kind!r}.")
        self.engine = engine
        state_shardings = _state_shardings(model, engine, kind)

        def compile_step(function, data_sharding):
            return jax.jit(
                function,
                donate_argnums=0,
                in_shardings=(state_shardings, data_sharding),
                out_shardings=(None, state_shardings),
                compiler_options=engine.compiler_options,
            )

        step = _global_step(model, engine, kind)
        #: Takes batches placed beforehand (any batch).
        self.placed_program = compile_step(step, None)
        #: Takes even host batches as they are; jit splits them on entry.
        self.host_program = compile_step(step, _engine.batch_sharding(engine, 1))
        #: Multi-process CPU: even batches trained per replica (else None).
        self.replica_program: Optional[Callable] = None
        if kind == "train" and _engine.trains_per_replica(engine) and trains_exactly_per_replica(model):
            self.replica_program = compile_step(_replica_step.make_train_step(engine, model), None)

    def program_for(self, data) -> tuple[Callable, Any]:
        """The compiled program `data` runs through, and `data` ready for it."""
        engine = self.engine
        if self.replica_program is not None and _engine.divides_evenly(engine, data):
            return self.replica_program, _engine.place_host_data(engine, data)
        if _engine.splits_evenly_on_entry(engine, data):
            return self.host_program, data
        return self.placed_program, _engine.place_host_data(engine, data)

    def __call__(self, state, data):
        heartbeat.beat()
        program, data = self.program_for(data)
        return program(state, data)


def make_trainer_function(model, strategy, kind: str) -> Optional[Callable]:
    """Keras' ``{kind}_function`` for `model` under `strategy`, or None
    where Keras' own serves (eager or un-jitted models)."""
    if model.run_eagerly or not model.jit_compile:
        return None
    engine = strategy.extended.engine
    return model._make_function(JaxStep(model, engine, kind), concatenate_outputs=kind == "predict")
