"""Every contact between keras_dist and Keras internals lives in this file.

Each hook wraps one Keras function or method. A wrapper first asks whether
the model (or the running step) belongs to a keras_dist strategy; if not it
calls the original unchanged, so code outside a strategy behaves exactly as
plain Keras. When a Keras upgrade moves one of these names, `install()`
fails here, loudly, naming it.

Hooks (all backends):
  Trainer.__init__                     remember the strategy in scope
  Trainer.compile                      compile under the model's strategy
                                       (on Trainer, not Model: Keras checks
                                       `compile` is not overridden before
                                       compile_from_config)
  Model.fit/evaluate/predict/*_on_batch  validate, then run in the scope;
                                       non-chief workers: no progress bar,
                                       file callbacks write to a private dir
  Model.save                           non-chief workers: private temp file
  BackupAndRestore._save_model         atomic backups (temp file, rename);
                                       non-chief workers: private dir
  BackupAndRestore._load_model         the epoch committed with the weights
  losses.Loss.__call__                 refuse per-replica averaging in run()
JAX:
  JAXTrainer.make_{train,test,predict}_function  shard the batch in-step
  backend.jax.trainer._distribute_data  leave batches to the step, which
                                       places them (uneven ones too)
TensorFlow:
  optimizers.BaseOptimizer.apply       build slots outside replicas in run()
  losses.loss.(un)scale_loss_for_distribution  scale by global-batch share
  BatchNormalization._moments          global-batch moments
  TensorFlowTrainer.make_{train,test,predict}_function  exact steps
  TensorFlowTrainer._maybe_symbolic_build  skip when all is built (Keras
                                       otherwise pulls a batch from a fresh
                                       input iterator on every fit call)
Instrumentation (not installed; used while a ScalingReport is attached):
  model.train_function                 timed batch fetches and steps
"""

from __future__ import annotations

import contextlib
import copy
import functools
import glob
import importlib
import inspect
import json
import os
import shutil
import tempfile
import time

import keras

from keras_dist import _context
from keras_dist._communication import PeerWorkerError
from keras_dist._input import check_auto_shard_policy
from keras_dist._split import validate_batch_size
from keras_dist.backends import backend_name, get_adapter

_installed = False
#: "module:Owner.attribute" -> the original, for every hook installed.
ORIGINALS: dict = {}

_STRATEGY_ATTR = "_keras_dist_strategy"
_BATCH_ARGUMENTS = {
    "fit": ("batch_size", "validation_batch_size"),
    "evaluate": ("batch_size",),
    "predict": ("batch_size",),
}
_ENTRY_POINTS = (
    "fit",
    "evaluate",
    "predict",
    "train_on_batch",
    "test_on_batch",
    "predict_on_batch",
)


def _resolve(path: str):
    module_name, _, attribute = path.rpartition(":")
    module = importlib.import_module(module_name)
    owner = module
    for part in attribute.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner, attribute.split(".")[-1]


def _patch(path: str, make_wrapper) -> None:
    """Replaces `module:Owner.attr` by `make_wrapper(original)`."""
    try:
        owner, name = _resolve(path)
        original = getattr(owner, name)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"keras_dist cannot find the Keras internal {path!r} in Keras "
            f"{keras.version()}; this Keras version is not supported by this "
            "keras_dist release."
        ) from error
    wrapper = make_wrapper(original)
    functools.update_wrapper(wrapper, original)
    wrapper.__keras_dist_original__ = original
    setattr(owner, name, wrapper)
    ORIGINALS[path] = original


def install() -> None:
    """Installs the hooks for the current backend (idempotent)."""
    global _installed
    if _installed:
        return
    _patch("keras.src.trainers.trainer:Trainer.__init__", _wrap_trainer_init)
    # On Trainer, where Keras defines it: `compile_from_config` (used by
    # load_model and clone_model) skips compiling, with a warning, when
    # `type(model).compile is not Trainer.compile`.
    _patch("keras.src.trainers.trainer:Trainer.compile", _wrap_compile)
    for name in _ENTRY_POINTS:
        _patch(f"keras.src.models.model:Model.{name}", _wrap_entry(name))
    _patch("keras.src.losses.loss:Loss.__call__", _wrap_loss_call)
    _patch("keras.src.models.model:Model.save", _wrap_save)
    _patch(f"{_BACKUP}._save_model", _wrap_backup_save)
    _patch(f"{_BACKUP}._load_model", _wrap_backup_load)
    backend = backend_name()
    if backend == "jax":
        _install_jax()
    elif backend == "tensorflow":
        _install_tensorflow()
    _installed = True


# -- all backends ---------------------------------------------------------


def model_strategy(model):
    """The keras_dist strategy a model was created under, or None."""
    return model.__dict__.get(_STRATEGY_ATTR)


def _wrap_trainer_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        object.__setattr__(self, _STRATEGY_ATTR, _context.current_strategy())

    return __init__


def _check_scope(model, strategy, action: str) -> None:
    active = _context.current_strategy()
    if strategy is None:
        if active is not None:
            raise ValueError(
                f"Cannot {action} model {model.name!r} under {active!r}: the "
                "model was created outside any strategy scope, so its "
                "variables are not distributed. Create the model inside "
                "`with strategy.scope():`."
            )
        return
    if active is not None and active is not strategy:
        raise ValueError(
            f"Cannot {action} model {model.name!r} under {active!r}: it was "
            f"created under {strategy!r}. A model trains only with the "
            "strategy it was created under; exit this scope, or rebuild the "
            "model inside the new strategy's scope."
        )


def _check_variables(strategy, variables, what: str) -> None:
    for variable in variables:
        if not strategy._owns_variable(variable):
            raise ValueError(
                f"{what} variable {variable.path!r} was created outside "
                f"the scope of {strategy!r}, so it is not distributed with "
                "the rest. Create every layer, optimizer and metric of the "
                "model inside `with strategy.scope():` (optimizers and "
                "metrics given by name, e.g. optimizer='adam', are created "
                "there for you)."
            )


def _check_model_variables(model, strategy) -> None:
    _check_variables(strategy, model.variables, "Model")
    optimizer = getattr(model, "optimizer", None)
    if optimizer is not None:
        _check_variables(strategy, optimizer.variables, "Optimizer")
    _check_variables(strategy, model.metrics_variables, "Metric")


def _wrap_compile(original):
    signature = inspect.signature(original)

    def compile(self, *args, **kwargs):
        strategy = model_strategy(self)
        _check_scope(self, strategy, "compile")
        if strategy is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        optimizer = bound.get("optimizer")
        if isinstance(optimizer, keras.optimizers.Optimizer):
            _check_variables(strategy, optimizer.variables, "Optimizer")
        for argument in ("metrics", "weighted_metrics"):
            for metric in keras.tree.flatten(bound.get(argument)):
                if isinstance(metric, keras.metrics.Metric):
                    _check_variables(strategy, metric.variables, "Metric")
        with strategy.scope():
            return original(self, *args, **kwargs)

    return compile


def _wrap_entry(name: str):
    def make(original):
        signature = inspect.signature(original)
        batch_arguments = _BATCH_ARGUMENTS.get(name, ())

        def entry(self, *args, **kwargs):
            strategy = model_strategy(self)
            _check_scope(self, strategy, name)
            if strategy is None:
                return original(self, *args, **kwargs)
            if batch_arguments:
                try:
                    bound = signature.bind(self, *args, **kwargs).arguments
                except TypeError:
                    bound = {}  # let Keras report the bad call
                for argument in batch_arguments:
                    validate_batch_size(bound.get(argument), argument)
                for argument in ("x", "validation_data"):
                    check_auto_shard_policy(bound.get(argument), strategy._num_workers())
            _check_model_variables(self, strategy)
            with _explain_peer_failures(strategy):
                if not strategy.extended.should_checkpoint and name in _BATCH_ARGUMENTS:
                    return _run_as_non_chief(original, signature, strategy, self, args, kwargs)
                with strategy.scope():
                    return original(self, *args, **kwargs)

        return entry

    return make


@contextlib.contextmanager
def _explain_peer_failures(strategy):
    """Turns the engine's collective failure into one clear error."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or resolver.num_workers <= 1:
        yield
        return
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised unless a peer failed
        if not get_adapter().is_peer_failure(error):
            raise
        timeout = strategy._communication_options.timeout_seconds
        raise PeerWorkerError(
            f"Worker {resolver.worker_index} of {resolver.num_workers}: a "
            "collective with the other workers failed"
            + (f" (timeout_seconds={timeout:g})" if timeout else "")
            + "; another worker died or stopped responding (see its log). "
            "The job cannot continue with a worker missing: restart all of "
            "it (`keras-dist launch --max-restarts K` does), and resume "
            "with keras.callbacks.BackupAndRestore. Engine error: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
        ) from error


#: Keras callbacks that write files, and the attribute naming where.
_FILE_CALLBACKS = (
    ("ModelCheckpoint", "filepath"),
    ("CSVLogger", "filename"),
    ("TensorBoard", "log_dir"),
)


def _private_copy(callback, directory: str):
    """`callback`, writing into `directory` instead of the user's path."""
    if isinstance(callback, keras.callbacks.BackupAndRestore):
        return _private_backup(callback, directory)
    for class_name, attribute in _FILE_CALLBACKS:
        if isinstance(callback, getattr(keras.callbacks, class_name)):
            private = copy.copy(callback)
            path = str(getattr(callback, attribute)).rstrip("/\\")
            setattr(private, attribute, os.path.join(directory, os.path.basename(path)))
            return private
    return callback


_BACKUP = "keras.src.callbacks.backup_and_restore:BackupAndRestore"
#: The training metadata, stored in the weights file itself: one rename
#: commits weights and epoch together.
_METADATA_ATTRIBUTE = "keras_dist_training_metadata"


def _private_backup(callback, directory: str):
    """A non-chief worker's BackupAndRestore: restores from the chief's
    backup (the user's `backup_dir`, complete by construction: the chief
    renames finished files into place), writes its own into `directory`."""
    private = copy.copy(callback)  # still reads the user's `_weights_path`
    private.backup_dir = os.path.join(directory, "backup")  # writes, deletes
    return private


def _wrap_backup_save(original):
    def _save_model(self):
        strategy = model_strategy(self.model)
        if strategy is None or "://" in str(self.backup_dir):
            return original(self)
        _save_backup_atomically(self)

    return _save_model


def _replace_with_copy(source: str, target: str) -> None:
    temporary = f"{target}.tmp-{os.getpid()}"
    shutil.copyfile(source, temporary)
    os.replace(temporary, target)


def _save_backup_atomically(callback) -> None:
    """Keras' backup, with every file written to a temp name then renamed.

    The weights file carries the training metadata, so killing the process
    at any point leaves the previous backup or the new one, whole.
    """
    import h5py

    directory = callback.backup_dir  # a non-chief's copy: its private dir
    weights = os.path.join(directory, os.path.basename(callback._weights_path))
    metadata_path = os.path.join(
        directory, os.path.basename(callback._training_metadata_path)
    )
    os.makedirs(directory, exist_ok=True)
    for stale in glob.glob(os.path.join(directory, "*.tmp-*")):
        os.remove(stale)  # left by a process killed mid-write
    metadata = json.dumps(
        {"epoch": callback._current_epoch, "batch": callback._last_batch_seen}
    )
    if callback.double_checkpoint:
        for path in (weights, metadata_path):
            if os.path.exists(path):
                _replace_with_copy(path, f"{path}.bkp")
    temporary = f"{weights}.tmp-{os.getpid()}.weights.h5"
    callback.model.save_weights(temporary, overwrite=True)
    with h5py.File(temporary, "a") as handle:
        handle.attrs[_METADATA_ATTRIBUTE] = metadata
    os.replace(temporary, weights)  # the commit point
    temporary = f"{metadata_path}.tmp-{os.getpid()}"
    with open(temporary, "w") as handle:
        handle.write(metadata)
    os.replace(temporary, metadata_path)


def _wrap_backup_load(original):
    def _load_model(self):
        result = original(self)
        path = self._weights_path
        if model_strategy(self.model) is not None and os.path.exists(path):
            import h5py

            with h5py.File(path, "r") as handle:
                metadata = handle.attrs.get(_METADATA_ATTRIBUTE)
            if metadata is not None:  # authoritative over the JSON file
                self.model._initial_epoch = json.loads(metadata)["epoch"]
        return result

    return _load_model


def _worker_tag(strategy) -> str:
    return f"keras_dist_worker{strategy.cluster_resolver.worker_index}_"


def _run_as_non_chief(original, signature, strategy, model, args, kwargs):
    """A non-chief worker runs the same computation (collectives need every
    worker) but prints no progress bar and writes its callbacks' files to a
    private temporary directory, removed afterwards: only the chief writes
    the user's paths."""
    bound = signature.bind(model, *args, **kwargs)
    if "verbose" in signature.parameters:
        bound.arguments["verbose"] = 0
    private = tempfile.mkdtemp(prefix=_worker_tag(strategy))
    try:
        callbacks = bound.arguments.get("callbacks")
        if isinstance(callbacks, (list, tuple)):
            bound.arguments["callbacks"] = [_private_copy(c, private) for c in callbacks]
        with strategy.scope():
            return original(*bound.args, **bound.kwargs)
    finally:
        shutil.rmtree(private, ignore_errors=True)


def _wrap_save(original):
    def save(self, filepath, *args, **kwargs):
        strategy = model_strategy(self)
        if strategy is None or strategy.extended.should_checkpoint:
            return original(self, filepath, *args, **kwargs)
        private = tempfile.mkdtemp(prefix=_worker_tag(strategy))
        try:  # same work as the chief, nothing left at the user's path
            target = os.path.join(private, os.path.basename(str(filepath)))
            return original(self, target, *args, **kwargs)
        finally:
            shutil.rmtree(private, ignore_errors=True)

    return save


_AVERAGING_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def _wrap_loss_call(original):
    def __call__(self, *args, **kwargs):
        context = _context.replica_context()
        if (
            context is not None
            and context.num_replicas_in_sync > 1
            and self.reduction in _AVERAGING_REDUCTIONS
        ):
            raise ValueError(
                f"The loss {self.name!r} averages over this replica's part of "
                f"the batch (reduction={self.reduction!r}) inside "
                f"strategy.run with {context.num_replicas_in_sync} replicas; "
                "summed over replicas that gives the wrong gradients. Create "
                "it with reduction='none' and average with "
                "keras_dist.compute_average_loss(per_example_loss), or use "
                "reduction='sum' and divide by the global batch size."
            )
        return original(self, *args, **kwargs)

    return __call__


# -- per-replica steps (TensorFlow; JAX multi-process CPU) -------------------


def _install_replica_step_hooks() -> None:
    """Loss scaling and global BatchNorm moments inside per-replica steps."""
    _patch(
        "keras.src.losses.loss:scale_loss_for_distribution",
        _wrap_scale("scale_factor"),
    )
    _patch(
        "keras.src.losses.loss:unscale_loss_for_distribution",
        _wrap_scale("unscale_factor"),
    )
    _patch(
        "keras.src.layers.normalization.batch_normalization:"
        "BatchNormalization._moments",
        _wrap_moments,
    )


def _scaled(value, factor_name: str):
    """`value` times the adapter's `factor_name` inside a replica step, else None."""
    factor = getattr(get_adapter(), factor_name)(value.dtype)
    return None if factor is None else keras.ops.multiply(value, factor)


def _wrap_scale(factor_name: str):
    def make(original):
        def scale(value):
            scaled = _scaled(value, factor_name)
            return original(value) if scaled is None else scaled

        return scale

    return make


def _wrap_moments(original):
    def _moments(self, inputs, mask):
        adapter = get_adapter()
        if not adapter.in_replica_step():
            return original(self, inputs, mask)
        return adapter.global_moments(inputs, self._reduction_axes, mask)

    return _moments


# -- JAX ------------------------------------------------------------------


def _install_jax() -> None:
    for kind in ("train", "test", "predict"):
        _patch(
            f"keras.src.backend.jax.trainer:JAXTrainer.make_{kind}_function",
            _wrap_jax_make_function(kind),
        )
    _patch("keras.src.backend.jax.trainer:_distribute_data", _wrap_jax_distribute_data)
    # The per-replica training step (backends/jax/_replica_step.py): the
    # same loss scaling and BatchNormalization moments as on TensorFlow,
    # plus the packed gradient sum.
    _install_replica_step_hooks()
    _patch(
        "keras.src.trainers.trainer:Trainer._aggregate_additional_loss",
        _wrap_jax_additional_loss,
    )
    _patch(
        "keras.src.backend.jax.trainer:JAXTrainer.compute_loss_and_updates",
        _wrap_jax_compute_loss_and_updates,
    )


def _wrap_jax_make_function(kind: str):
    attribute = f"{kind}_function"

    def make(original):
        def make_function(self, force=False):
            strategy = model_strategy(self)
            if strategy is None or self.run_eagerly or not self.jit_compile:
                return original(self, force)
            if getattr(self, attribute) is not None and not force:
                return getattr(self, attribute)
            function = _build_jax_function(self, strategy, kind)
            setattr(self, attribute, function)
            return function

        return make_function

    return make


def _build_jax_function(model, strategy, kind: str):
    import jax

    adapter = get_adapter()
    engine = strategy._get_engine()
    replicated = adapter.replicated_sharding(engine)
    if adapter.is_multi_process():  # every worker starts from the chief's weights
        variables = list(model.variables)
        for variable, value in zip(variables, adapter.sync_from_chief([v.value for v in variables])):
            variable.assign(value)

    def shardings(variables):
        return [replicated] * len(variables)

    optimizer_object = getattr(model, "optimizer", None)
    optimizer_variables = optimizer_object.variables if optimizer_object else []
    trainable = shardings(model.trainable_variables)
    non_trainable = shardings(model.non_trainable_variables)
    optimizer = shardings(optimizer_variables)
    metrics = shardings(model.metrics_variables)
    if kind == "train":
        state_shardings = (trainable, non_trainable, optimizer, metrics)

        def step(state, data):
            return model.train_step(state, adapter.constrain_batch(engine, data))

    elif kind == "test":
        state_shardings = (trainable, non_trainable, metrics)

        def step(state, data):
            return model.test_step(state, adapter.constrain_batch(engine, data))

    else:
        state_shardings = (trainable, non_trainable)

        def step(state, data):
            outputs, non_trainable_values = model.predict_step(
                state, adapter.constrain_batch(engine, data)
            )
            outputs = adapter.gather_uneven_outputs(engine, data, outputs)
            return outputs, (state[0], non_trainable_values)

    def compile_step(data_sharding, function=step):
        return jax.jit(
            function,
            donate_argnums=0,
            in_shardings=(state_shardings, data_sharding),
            out_shardings=(None, state_shardings),
            compiler_options=engine.compiler_options,
        )

    jitted = compile_step(None)  # data placed beforehand (any batch)
    # Even host batches go straight in: jit splits them onto the devices
    # itself, with no Python-side placement (the path plain Keras takes).
    jitted_host = compile_step(adapter.batch_sharding(engine, 1))
    # Multi-process CPU: even batches train per replica, gradients summed
    # in one packed all-reduce (backends/jax/_replica_step.py).
    jitted_replica = None
    if kind == "train" and adapter.engine_trains_per_replica(engine) and _trains_exactly_per_replica(model):
        jitted_replica = compile_step(None, adapter.make_replica_train_step(engine, model))

    def program_for(data):
        """The compiled step `data` runs through, and `data` ready for it."""
        if jitted_replica is not None and adapter.divides_evenly(engine, data):
            return jitted_replica, adapter.place_host_data(engine, data)
        if adapter.splits_evenly_on_entry(engine, data):
            return jitted_host, data
        return jitted, adapter.place_host_data(engine, data)

    def run_step(state, data):
        program, data = program_for(data)
        return program(state, data)

    run_step.program_for = program_for  # for inspection (tests lower it to HLO)
    run_step.replica_program = jitted_replica
    function = model._make_function(run_step, concatenate_outputs=kind == "predict")
    function.step = run_step
    return function


def _trains_exactly_per_replica(model) -> bool:
    """Whether a per-replica JAX step trains `model` as one device would:
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


def _wrap_jax_distribute_data(original):
    def _distribute_data(data, layouts=None):
        adapter = get_adapter()
        engine = adapter.engine_of_distribution(keras.distribution.distribution())
        if engine is None:
            return original(data, layouts)
        return data  # the step places it (`program_for` in _build_jax_function)

    return _distribute_data


def _wrap_jax_additional_loss(original):
    """Regularization and `add_loss` terms: scaled like the loss per replica
    (Keras' TensorFlow trainer does the same for tf.distribute)."""

    def _aggregate_additional_loss(self, loss):
        loss = original(self, loss)
        scaled = _scaled(loss, "scale_factor")
        return loss if scaled is None else scaled

    return _aggregate_additional_loss


def _wrap_jax_compute_loss_and_updates(original):
    """In a per-replica training step: the gradients of the trainable
    variables are summed over replicas (one packed all-reduce), and the
    loss handed to the loss tracker is unscaled, as Keras' TensorFlow
    trainer does."""

    def compute_loss_and_updates(self, trainable_variables, *args, training=False, **kwargs):
        adapter = get_adapter()
        if not (training and adapter.in_replica_step()):
            return original(self, trainable_variables, *args, training=training, **kwargs)
        trainable_variables = adapter.sum_gradients_over_replicas(trainable_variables)
        loss, (unscaled_loss, *aux) = original(
            self, trainable_variables, *args, training=training, **kwargs
        )
        unscaled_loss = unscaled_loss * adapter.unscale_factor(unscaled_loss.dtype)
        return loss, (unscaled_loss, *aux)

    return compute_loss_and_updates


# -- TensorFlow -----------------------------------------------------------


def _install_tensorflow() -> None:
    _patch(
        "keras.src.optimizers.base_optimizer:BaseOptimizer.apply",
        _wrap_tf_optimizer_apply,
    )
    _install_replica_step_hooks()
    for kind in ("train", "test"):
        _patch(
            f"keras.src.backend.tensorflow.trainer:"
            f"TensorFlowTrainer.make_{kind}_function",
            _wrap_tf_make_step_function(kind),
        )
    _patch(
        "keras.src.backend.tensorflow.trainer:"
        "TensorFlowTrainer.make_predict_function",
        _wrap_tf_make_predict_function,
    )
    _patch(
        "keras.src.backend.tensorflow.trainer:"
        "TensorFlowTrainer._maybe_symbolic_build",
        _wrap_tf_maybe_symbolic_build,
    )


def _fully_built(model) -> bool:
    """Whether Keras' symbolic build would find nothing left to build."""
    compiled = (model._compile_metrics, model._compile_loss, model.optimizer)
    return all(layer.built for layer in model._flatten_layers()) and all(
        part is None or part.built for part in compiled
    )


def _wrap_tf_maybe_symbolic_build(original):
    def _maybe_symbolic_build(self, iterator=None, data_batch=None):
        if model_strategy(self) is not None and _fully_built(self):
            return
        return original(self, iterator=iterator, data_batch=data_batch)

    return _maybe_symbolic_build


def _wrap_tf_optimizer_apply(original):
    def apply(self, grads, trainable_variables=None):
        context = _context.replica_context()
        if (
            context is not None
            and not self.built
            and trainable_variables is not None
            and context.num_replicas_in_sync > 1
        ):
            variables = list(trainable_variables)

            def build():
                with keras.name_scope(self.name, caller=self):
                    self.build(variables)
                self.built = True

            get_adapter().build_outside_replicas(build)
        return original(self, grads, trainable_variables)

    return apply


def _distributed_engine(model):
    """The tf.distribute strategy of a model with more than one replica."""
    strategy = model_strategy(model)
    if strategy is None or strategy.num_replicas_in_sync == 1:
        return None
    return strategy._get_engine()


def _wrap_tf_make_step_function(kind: str):
    attribute = f"{kind}_function"

    def make(original):
        def make_function(self, force=False):
            engine = _distributed_engine(self)
            if engine is None:
                return original(self, force)
            if getattr(self, attribute) is not None and not force:
                return getattr(self, attribute)
            function = get_adapter().make_step_function(
                engine,
                getattr(self, f"{kind}_step"),
                lambda: self.metrics_variables,
                self.get_metrics_result,
                self.steps_per_execution,
                self.run_eagerly,
            )
            setattr(self, attribute, function)
            return function

        return make_function

    return make


def _wrap_tf_make_predict_function(original):
    def make_predict_function(self, force=False):
        engine = _distributed_engine(self)
        if engine is None:
            return original(self, force)
        if self.predict_function is not None and not force:
            return self.predict_function
        self.predict_function = get_adapter().make_predict_function(
            engine, self.predict_step, self.run_eagerly
        )
        return self.predict_function

    return make_predict_function


# -- instrumentation --------------------------------------------------------


class _TimedIterator:
    """Yields `first`, then `iterator`'s batches, timing each fetch."""

    def __init__(self, first, iterator):
        self._first = [first]
        self._iterator = iterator
        self.fetch_seconds = 0.0
        self.batches = 0
        self.rows = 0

    def __iter__(self):
        return self

    def __next__(self):
        if self._first:
            batch = self._first.pop()
        else:
            start = time.perf_counter()
            try:
                batch = next(self._iterator)
            finally:
                self.fetch_seconds += time.perf_counter() - start
        self.batches += 1
        self.rows += batch_rows(batch)
        return batch


def batch_rows(batch) -> int:
    """Rows of a batch: the leading size of its first array."""
    for leaf in keras.tree.flatten(batch):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) >= 1 and shape[0] is not None:
            return int(shape[0])
    return 0


def _wait_for_logs(result) -> None:
    """Blocks until a train function's logs are computed.

    JAX dispatches asynchronously: without this, a step's time would be
    its dispatch. (JAX returns ``(logs, state)``, TensorFlow the logs.)
    """
    logs = result[0] if isinstance(result, tuple) else result
    for leaf in keras.tree.flatten(logs):
        if hasattr(leaf, "shape"):
            keras.ops.convert_to_numpy(leaf)


def time_train_function(model, record):
    """Makes each call of `model.train_function` report its timings.

    `record(start, end, fetch_seconds, batches, rows, first_batch)` is
    called after every call. Keras passes the batch iterator as the train
    function's last argument (JAX: ``(state, iterator)``, TensorFlow:
    ``(iterator)``); the wrapper hands on an iterator that times every
    fetch, and waits for the step's logs, so a call's time is the step's
    own. (On TensorFlow without a strategy, Keras then takes the batches
    one by one in Python instead of inside its compiled loop: the same
    steps on the same batches.) Returns ``undo()``, which restores the
    original function; a wrapper left behind (fit raised) passes calls
    straight through once undone.
    """
    original = model.train_function
    original = getattr(original, "__keras_dist_untimed__", original)
    active = [True]

    def train_function(*args):
        if not active[0]:
            return original(*args)
        *head, iterator = args
        start = time.perf_counter()
        first = next(iterator)  # StopIteration: no more data, as Keras expects
        fetched = time.perf_counter()
        timed = _TimedIterator(first, iterator)
        result = original(*head, timed)
        _wait_for_logs(result)
        end = time.perf_counter()
        record(start, end, (fetched - start) + timed.fetch_seconds, timed.batches, timed.rows, first)
        return result

    train_function.__keras_dist_untimed__ = original
    model.train_function = train_function

    def undo():
        active[0] = False
        if model.train_function is train_function:
            model.train_function = original

    return undo
