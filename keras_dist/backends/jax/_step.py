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
from keras_dist._engine_kind import EngineKind
from keras_dist.backends.jax import _cluster, _engine, _replica_step
from keras_dist.backends.jax._state import restore_after_failure


def trains_exactly_per_replica(model) -> bool:
    """Whether a per-replica step trains `model` as one device would:
    Keras' own `train_step` and `compute_loss_and_updates` (whose hook sums
    the gradients), and no random layers (each replica would draw its own
    numbers where one device draws them for the whole batch)."""
    from keras_dist._keras_names import internal

    JAXTrainer = internal("keras.src.backend.jax.trainer:JAXTrainer")

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
        self.model, self.kind = model, kind
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
        try:
            return program(state, data)
        except Exception:
            restore_after_failure(self.model, self.kind, state)
            raise


def _stack_batches(batches):
    """`batches` stacked leaf by leaf on a new leading axis, or None unless
    they are host arrays of one structure and shape (the usual case; the
    last, partial batch of an epoch is not)."""
    import numpy as np

    structures = {jax.tree_util.tree_structure(b) for b in batches}
    if len(structures) != 1:
        return None
    columns = list(zip(*(jax.tree_util.tree_leaves(b) for b in batches)))
    if not columns or any(
        type(leaf) is not np.ndarray or leaf.ndim == 0 or leaf.shape != column[0].shape
        for column in columns
        for leaf in column
    ):
        return None
    stacked = [np.stack(column) for column in columns]
    return jax.tree_util.tree_unflatten(structures.pop(), stacked)


class OnDeviceLoop:
    """Keras' ``{train,test}_function(state, iterator)`` that runs
    `steps_per_execution` batches in ONE compiled program (a `lax.scan` of
    the same step `JaxStep` runs), so the host dispatches once per
    execution: TPUStrategy's lever. Batches that cannot be stacked (the
    partial last batch, mixed shapes) run one by one through `JaxStep`."""

    def __init__(self, model, engine: Any, kind: str, steps: int):
        self.engine = engine
        self.steps = steps
        self.single = JaxStep(model, engine, kind)
        step = _global_step(model, engine, kind)
        state_shardings = _state_shardings(model, engine, kind)

        def loop(state, stacked):
            def body(state, data):
                logs, state = step(state, data)
                return state, logs

            state, logs = jax.lax.scan(body, state, stacked)
            return jax.tree_util.tree_map(lambda x: x[-1], logs), state

        self.loop_program = jax.jit(
            loop,
            donate_argnums=0,
            in_shardings=(state_shardings, None),
            out_shardings=(None, state_shardings),
            compiler_options=engine.compiler_options,
        )
        #: How many executions ran on device / one batch at a time (tests read it).
        self.executions = {"on_device": 0, "one_by_one": 0}

    def __call__(self, state, iterator):
        heartbeat.beat()
        batches = [next(iterator)]  # StopIteration here ends the epoch, as in Keras
        for _ in range(self.steps - 1):
            try:
                batches.append(next(iterator))
            except StopIteration:
                break
        stacked = _stack_batches(batches) if len(batches) > 1 else None
        if stacked is not None and _engine.divides_evenly(self.engine, batches[0]):
            self.executions["on_device"] += 1
            return self.loop_program(state, _place_stacked(self.engine, stacked))
        self.executions["one_by_one"] += 1
        logs = None
        for data in batches:
            logs, state = self.single(state, data)
        return logs, state


def _place_stacked(engine, stacked):
    """Stacked batches on the mesh: axis 0 the step, axis 1 split by rows."""
    from jax.sharding import NamedSharding, PartitionSpec

    def place(x):
        if engine.num_replicas == 1:
            sharding = _engine.batch_sharding(engine, 1)
        else:
            spec = PartitionSpec(None, _engine.BATCH_AXIS, *([None] * (x.ndim - 2)))
            sharding = NamedSharding(engine.mesh, spec)
        if _cluster.is_multi_process():  # every worker holds the same batches
            return jax.make_array_from_callback(x.shape, sharding, lambda index: x[index])
        return jax.device_put(x, sharding)

    return jax.tree_util.tree_map(place, stacked)


def make_trainer_function(model, strategy, kind: str) -> Optional[Callable]:
    """Keras' ``{kind}_function`` for `model` under `strategy`, or None
    where Keras' own serves (eager or un-jitted models)."""
    if strategy.extended.engine_kind is EngineKind.PARAMETER_SERVER:
        from keras_dist.backends.jax import _parameter_servers

        return _parameter_servers.make_trainer_function(model, strategy, kind)
    if model.run_eagerly or not model.jit_compile:
        return None
    engine = strategy.extended.engine
    if engine.steps_on_device and kind != "predict" and model.steps_per_execution > 1:
        return OnDeviceLoop(model, engine, kind, model.steps_per_execution)
    if engine.parameter_sharding is not None:
        from keras_dist.backends.jax._central_step import CentralStorageStep

        step = CentralStorageStep(model, engine, kind)
    else:
        step = JaxStep(model, engine, kind)
    return iterator_function(step, model.steps_per_execution, concatenate=kind == "predict")


def iterator_function(step, steps_per_execution: int, concatenate: bool) -> Callable:
    """Keras' JAX ``{kind}_function(state, iterator)`` around `step`
    (``step(state, batch) -> (outputs, state)``): up to
    `steps_per_execution` batches per call, predict's outputs concatenated.
    keras_dist's own (Keras 3.16's `_make_function` jits the step it is
    given; ours compiles its own)."""

    def iterator_step(state, iterator):
        outputs, state = step(state, next(iterator))
        every = [outputs]
        for _ in range(steps_per_execution - 1):
            try:
                batch = next(iterator)
            except StopIteration:
                break
            outputs, state = step(state, batch)
            every.append(outputs)
        if concatenate and len(every) > 1:
            outputs = _concatenate_outputs(every)
        return outputs, state

    return iterator_step


@jax.jit
def _concatenate_outputs(outputs):
    return jax.tree_util.tree_map(lambda *parts: jax.numpy.concatenate(parts), *outputs)
