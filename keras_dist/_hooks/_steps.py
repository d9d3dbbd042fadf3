"""The distributed steps Keras' trainers run, asked of the backend adapter.

`make_{train,test,predict}_function` (on each backend's trainer class) take
`adapter.make_trainer_function`; around them, on JAX, batches are left to
the step, which places them; on TensorFlow, optimizers build their slots
outside replica computation and a fully built model skips Keras' symbolic
build (which pulls a batch from a fresh input iterator on every `fit`), as
does an empty input. On both, a stateful optimizer `apply` in cross-replica
context is refused.
"""

from __future__ import annotations

import keras
from keras.src.backend.common.stateless_scope import in_stateless_scope

from keras_dist import _context, _input, _shard
from keras_dist._hooks._patching import model_strategy
from keras_dist.backends import get_adapter


def wrap_make_function(kind: str):
    """Wrapper maker for `<Trainer>.make_{kind}_function`."""
    attribute = f"{kind}_function"

    def make(original):
        def make_function(self, force=False):
            strategy = model_strategy(self)
            if strategy is None:
                return original(self, force)
            if getattr(self, attribute) is not None and not force:
                return getattr(self, attribute)
            function = get_adapter().make_trainer_function(self, strategy, kind)
            if function is None:
                original(self, force)
                function = getattr(self, attribute)
            if strategy.extended.num_workers > 1:
                function = _combining_worker_streams(function, kind)
            setattr(self, attribute, function)
            return function

        return make_function

    return make


def _combining_worker_streams(function, kind: str):
    """`function(..., iterator)` taking the job's global batches from the
    iterator when each worker reads its own stream (`_input.worker_streams`);
    else `function` as it is."""
    if kind == "predict":  # refused with per-worker streams (hooks._entry)
        return function

    def call(*args):
        stream = _input.worker_stream(kind)
        if stream is None:
            return function(*args)
        *rest, iterator = args
        return function(*rest, _input.WorkerBatches(iterator, *stream))

    return call


def wrap_distribute_data(original):
    """Batches pass through untouched under a strategy: its step places them."""

    def _distribute_data(data, layouts=None):
        if _context.current_strategy() is None:
            return original(data, layouts)
        return data

    return _distribute_data


def _check_replica_context(optimizer) -> None:
    """Refuses a stateful `apply` in the cross-replica context of a
    strategy of several replicas, as tf.keras 2 did, before anything changes.
    Replica context: `strategy.run`, and `fit`'s replica steps. Stateless
    applies (Keras' JAX steps, `stateless_apply`) are pure and pass."""
    strategy = _context.current_strategy()
    if (
        strategy is None
        or strategy.num_replicas_in_sync <= 1
        or _context.replica_context() is not None
        or _shard.in_replica_step()
        or in_stateless_scope()
    ):
        return
    raise RuntimeError(
        f"`apply_gradients()` of {optimizer.name!r} cannot be called in "
        f"cross-replica context (inside the scope of {strategy!r}, "
        f"{strategy.num_replicas_in_sync} replicas, but outside "
        "`strategy.run`). Use `strategy.run` to enter replica context: call "
        "`optimizer.apply_gradients` inside the function you pass to "
        "`strategy.run` (on JAX, `optimizer.stateless_apply`), or outside any "
        "strategy scope."
    )


def wrap_optimizer_apply(original):
    def apply(self, grads, trainable_variables=None):
        _check_replica_context(self)

        def build():  # what Keras' apply does first when unbuilt
            with keras.name_scope(self.name, caller=self):
                self.build(list(trainable_variables))
            self.built = True

        context = _context.replica_context()
        if (
            context is not None
            and not self.built
            and trainable_variables is not None
            and context.num_replicas_in_sync > 1
        ):
            get_adapter().build_outside_replicas(build)
        unbuilt = not self.built and trainable_variables is not None
        return get_adapter().apply_optimizer(
            self, build if unbuilt else None, lambda: original(self, grads, trainable_variables)
        )

    return apply


def _fully_built(model) -> bool:
    """Whether Keras' symbolic build would find nothing left to build."""
    compiled = (model._compile_metrics, model._compile_loss, model.optimizer)
    return all(layer.built for layer in model._flatten_layers()) and all(
        part is None or part.built for part in compiled
    )


def wrap_maybe_symbolic_build(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if model_strategy(self) is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        if _fully_built(self):
            return
        try:
            return original(self, iterator=iterator, data_batch=data_batch)
        except StopIteration:
            # An empty input: no batch to build from. Plain Keras (no
            # tf.distribute strategy) builds while tracing its step from the
            # input's element spec, then runs no step and warns that the
            # input ran out of data; build from that spec likewise.
            try:
                spec = iterator.data_adapter.get_tf_dataset().element_spec
            except (AttributeError, NotImplementedError, ValueError, StopIteration):
                return  # no spec either: build nothing, as plain Keras here
            return original(self, data_batch=spec)

    return _maybe_symbolic_build
