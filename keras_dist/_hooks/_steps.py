"""The distributed steps Keras' trainers run, asked of the backend adapter.

A model made under a strategy gets its own `make_{train,test,predict}_function`
(`install_step_functions`, from the `Trainer.__init__` hook: no trainer
class is patched), which take `adapter.make_trainer_function`; around them, on JAX, batches are left to
the step, which places them; on TensorFlow, optimizers build their slots
outside replica computation and a fully built model skips Keras' symbolic
build (which pulls a batch from a fresh input iterator on every `fit`, and
so shifts a reshuffling tf.data input by one order); a model still to build
is built from the input's element spec, and an empty input builds nothing.
On both, a stateful optimizer `apply` in cross-replica context is refused.
"""

from __future__ import annotations

import contextlib
import threading
import types

import keras
from keras.src.backend.common.stateless_scope import in_stateless_scope

from keras_dist import _context, _shard, _worker_batches
from keras_dist._engine_kind import EngineKind
from keras_dist._context import model_strategy
from keras_dist.backends import get_adapter


#: The steps whose public maker (`make_{kind}_function`) a model under a
#: strategy gets per instance.
STEP_KINDS = ("train", "test", "predict")
STEP_FUNCTION_MAKERS = tuple(f"make_{kind}_function" for kind in STEP_KINDS)
#: Their signature in every supported Keras (3.10-3.16), checked at install.
STEP_FUNCTION_MAKER_SIGNATURE = "(self, force=False)"


def check_step_function_makers(model_class) -> None:
    """`model_class`'s `make_{train,test,predict}_function` take what the
    per-instance ones do: a Keras that changed them fails at import, naming
    the method, not mid-`fit`."""
    import inspect

    for name in STEP_FUNCTION_MAKERS:
        found = str(inspect.signature(getattr(model_class, name)))
        if found != STEP_FUNCTION_MAKER_SIGNATURE:
            raise ImportError(
                f"keras_dist sets {model_class.__name__}.{name} per model under a strategy, expecting "
                f"{name}{STEP_FUNCTION_MAKER_SIGNATURE}, but Keras {keras.version()} has {name}{found}; this Keras "
                "version is not supported by this keras_dist release."
            )


def install_step_functions(model) -> None:
    """Gives `model` (made under a strategy) its own `make_train_function`,
    `make_test_function` and `make_predict_function`, which make the
    adapter's distributed step: Keras' public seam (`compile` resets the
    step functions, and `fit`/`evaluate`/`predict` call these without
    forcing), per instance, so no Keras trainer class is patched and a model
    made outside every strategy is plain Keras. A model class that defines
    one of them itself keeps its own."""
    for kind, name in zip(STEP_KINDS, STEP_FUNCTION_MAKERS):
        keras_own = getattr(keras.Model, name)
        if getattr(type(model), name) is not keras_own:  # the user's class overrides it: theirs
            continue
        object.__setattr__(model, name, types.MethodType(_step_function_maker(kind, keras_own), model))


def _step_function_maker(kind: str, keras_own):
    attribute = f"{kind}_function"

    def make_function(self, force=False):
        strategy = model_strategy(self)
        if strategy is None:
            return keras_own(self, force)
        if getattr(self, attribute) is not None and not force:
            return getattr(self, attribute)
        function = get_adapter().make_trainer_function(self, strategy, kind)
        if function is None:  # Keras' own step (JAX: eager or un-jitted; TF: a ps job's evaluate, predict)
            keras_own(self, force)
            function = _in_keras_step(getattr(self, attribute))
        if strategy.extended.num_workers > 1:
            function = _combining_worker_streams(function, kind)
        setattr(self, attribute, function)
        return function

    make_function.__name__ = f"make_{kind}_function"
    make_function.__doc__ = f"keras_dist: the strategy's distributed {kind} step (Keras' own `{make_function.__name__}` " \
                            "where the adapter runs Keras' step)."
    return make_function


#: How many of Keras' own step functions are running (process-wide: tf's
#: strategies may run a step in a thread of their own).
_keras_steps = {"running": 0}
_keras_steps_lock = threading.Lock()


def _in_keras_step(function):
    """Keras' own step `function`, counted while it runs (and traces): its
    optimizer apply is the step's, in the engine's replica context, not a
    cross-replica one."""

    def call(*args, **kwargs):
        with _keras_steps_lock:
            _keras_steps["running"] += 1
        try:
            return function(*args, **kwargs)
        finally:
            with _keras_steps_lock:
                _keras_steps["running"] -= 1

    return call


def _combining_worker_streams(function, kind: str):
    """`function(..., iterator)` taking the job's global batches from the
    iterator when each worker reads its own stream (`_worker_batches.worker_streams`);
    else `function` as it is."""
    if kind == "predict":  # refused with per-worker streams (hooks._entry)
        return function

    def call(*args):
        stream = _worker_batches.worker_stream(kind)
        if stream is None:
            return function(*args)
        *rest, iterator = args
        return function(*rest, _worker_batches.WorkerBatches(iterator, *stream))

    return call


def wrap_distribute_data(original):
    """Batches pass through untouched under a strategy: its step places them."""

    def _distribute_data(data, *args, **kwargs):  # Keras 3.16 adds is_super_batch
        if _context.current_strategy() is None:
            return original(data, *args, **kwargs)
        return data

    return _distribute_data


def _check_replica_context(optimizer) -> None:
    """Refuses a stateful `apply` in the cross-replica context of a
    strategy, as tf.keras 2 did (one replica too: OneDeviceStrategy,
    MirroredStrategy of one device), before anything changes. Replica
    context: `strategy.run`, and `fit`'s replica steps. Stateless applies
    (Keras' JAX steps, `stateless_apply`) are pure and pass; outside any
    strategy's scope (the default strategy) an apply is plain Keras, and
    under a ParameterServerStrategy it is a scheduled function's update."""
    strategy = _context.current_strategy()
    if (
        strategy is None
        # a scheduled function's apply: the parameter servers' update
        or strategy.extended.engine_kind is EngineKind.PARAMETER_SERVER
        or _keras_steps["running"]
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


#: Optimizers whose `apply` runs on gradients already summed over the
#: replicas. Per thread for an optimizer's own apply: replica threads run
#: at once (MultiWorkerMirroredStrategy has no merge_call between them), and
#: one replica's mark must not tell another that its gradients are summed.
_local = threading.local()
#: id(inner optimizer) -> depth, process-wide: Keras' LossScaleOptimizer
#: calls its inner optimizer from replica threads tf starts anew; every
#: caller of that inner optimizer comes through the LossScaleOptimizer hook,
#: which sums first.
_inner_presummed: dict = {}
_inner_lock = threading.Lock()


def _thread_marks() -> dict:
    marks = getattr(_local, "presummed", None)
    if marks is None:
        marks = _local.presummed = {}
    return marks


@contextlib.contextmanager
def _gradients_presummed(optimizer, across_threads: bool = False):
    key = id(optimizer)
    marks, lock = (_inner_presummed, _inner_lock) if across_threads else (_thread_marks(), contextlib.nullcontext())
    with lock:
        marks[key] = marks.get(key, 0) + 1
    try:
        yield
    finally:
        with lock:
            marks[key] -= 1
            if not marks[key]:
                del marks[key]


def _is_presummed(optimizer) -> bool:
    return id(optimizer) in _thread_marks() or id(optimizer) in _inner_presummed


def _summed_for_apply(grads):
    """`grads` summed over the replicas where the adapter says they are
    still one replica's (else None), under a keras_dist strategy only."""
    if _context.current_strategy() is None:
        return None
    return get_adapter().sum_gradients_for_apply(grads)


def wrap_optimizer_apply(original):
    """Under a strategy, Keras clips (clipnorm, clipvalue, global_clipnorm)
    and accumulates the gradients it is given, and on TensorFlow sums them
    over the replicas only afterwards: each replica would clip its own part.
    Here they are summed first (`sum_gradients_for_apply`), so the clipping
    and every update see the global batch's gradients, as on one device;
    Keras' own sum then passes them through (`wrap_all_reduce_sum_gradients`)."""

    def apply(self, grads, trainable_variables=None):
        presummed = _is_presummed(self)  # an inner optimizer, called by a LossScaleOptimizer
        if not presummed:
            _check_replica_context(self)
        grads = list(grads)

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
        summed = None if presummed else _summed_for_apply(grads)

        def run():
            if summed is None:
                return original(self, grads, trainable_variables)
            with _gradients_presummed(self):
                return original(self, summed, trainable_variables)

        apply_optimizer = get_adapter().apply_optimizer  # an optional capability
        if apply_optimizer is None:
            return run()
        return apply_optimizer(self, build if unbuilt else None, run)

    return apply


def _check_loss_scaling_supported(optimizer) -> None:
    """TensorFlow, CentralStorageStrategy: Keras' LossScaleOptimizer writes
    its scale inside a `cond` in replica context, which tf refuses for
    variables kept on one central device (plain tf.distribute too)."""
    from keras_dist.strategies._mirrored import CentralStorageStrategy
    from keras_dist.backends import backend_name

    strategy = _context.current_strategy()
    if backend_name() == "tensorflow" and isinstance(strategy, CentralStorageStrategy):
        raise NotImplementedError(
            f"{type(optimizer).__name__} {optimizer.name!r} cannot train under "
            f"{strategy!r} on the TensorFlow backend: Keras updates its loss scale "
            "inside a cond, which tf.distribute refuses for variables kept on one "
            "central device (plain tf.distribute fails the same way). Use "
            "MirroredStrategy (the same math), or the JAX backend."
        )


def _check_no_accumulation_under_loss_scaling(optimizer) -> None:
    """TensorFlow: a LossScaleOptimizer applies its inner optimizer inside
    its own finite-gradients cond in replica context, where gradient
    accumulation's cross-replica update cannot run."""
    from keras_dist.backends import backend_name

    steps = getattr(optimizer.inner_optimizer, "gradient_accumulation_steps", None)
    if backend_name() == "tensorflow" and steps:
        raise NotImplementedError(
            f"LossScaleOptimizer {optimizer.name!r} wraps an optimizer with "
            f"gradient_accumulation_steps={steps}, which the TensorFlow backend cannot "
            "run under a strategy: the loss scale's cond holds the accumulating "
            "update in replica context. Accumulate without loss scaling, train "
            "with a global batch that many times larger, or use the JAX backend."
        )


def wrap_loss_scale_apply(original):
    """`LossScaleOptimizer.apply` under a strategy: the gradients are summed
    over the replicas first, so the finite check (Keras takes the first
    replica's) and the inner optimizer's clipping see the global batch's
    gradients; the inner optimizer takes them as they are."""

    def apply(self, grads, trainable_variables=None):
        grads = list(grads)
        summed = _summed_for_apply(grads)
        if summed is None:
            return original(self, grads, trainable_variables)
        _check_loss_scaling_supported(self)
        _check_no_accumulation_under_loss_scaling(self)
        with _gradients_presummed(self.inner_optimizer, across_threads=True):
            return original(self, summed, trainable_variables)

    return apply


def wrap_all_reduce_sum_gradients(original):
    """TensorFlow: Keras' sum of the gradients over replicas, skipped for
    gradients `wrap_optimizer_apply` summed already."""

    def _all_reduce_sum_gradients(self, grads_and_vars):
        if _is_presummed(self):
            return list(grads_and_vars)
        return original(self, grads_and_vars)

    return _all_reduce_sum_gradients


def _fully_built(model) -> bool:
    """Whether Keras' symbolic build would find nothing left to build."""
    compiled = (model._compile_metrics, model._compile_loss, model.optimizer)
    return all(layer.built for layer in model._flatten_layers()) and all(
        part is None or part.built for part in compiled
    )


def _known_element_spec(iterator):
    """The spec of the batches `iterator` (Keras' epoch iterator) yields,
    where every dimension but the batch one is known; else None."""
    try:
        spec = iterator.data_adapter.get_tf_dataset().element_spec
    except (AttributeError, NotImplementedError, ValueError, TypeError):
        return None
    for leaf in keras.tree.flatten(spec):
        shape = getattr(leaf, "shape", None)
        if type(leaf).__name__ != "TensorSpec" or shape is None or shape.rank is None:
            return None  # ragged, sparse or of unknown rank: build from a batch
        if shape.rank and any(dim is None for dim in shape.as_list()[1:]):
            return None
    return spec


@contextlib.contextmanager
def _stateful_layers_built_first(model):
    """Under a strategy the model is built symbolically before its first
    step, where a stateful recurrent layer cannot make its state variables
    (Keras: "create a variable while in a stateless scope"); plain Keras on
    TensorFlow builds it while tracing its step instead. One clear error
    naming the fix."""
    unbuilt = [layer.name for layer in model._flatten_layers() if getattr(layer, "stateful", False) and not layer.built]
    try:
        yield
    except ValueError as error:
        if unbuilt and "stateless scope" in str(error):
            raise ValueError(
                f"Layer '{unbuilt[0]}' is stateful (stateful=True) and not built yet: under a strategy the model is "
                "built before its first step, where a stateful layer cannot make its state. Build the model first: "
                "start it with keras.Input(shape, batch_size=...), or call model.build((batch_size, ...)) in the "
                "strategy's scope."
            ) from error
        raise


def wrap_maybe_symbolic_build(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if model_strategy(self) is None:
            return original(self, iterator=iterator, data_batch=data_batch)
        if _fully_built(self):
            return
        if iterator is not None and data_batch is None:
            # Keras draws a batch from a fresh iterator of the input here,
            # under a strategy only: a tf.data `shuffle` then gives the
            # first epoch its second order, and training is not one
            # device's. Build from the input's spec instead, where it is
            # known: no batch is drawn, as on one device.
            spec = _known_element_spec(iterator)
            if spec is not None:
                with _stateful_layers_built_first(self):
                    return original(self, data_batch=spec)
        try:
            with _stateful_layers_built_first(self):
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
