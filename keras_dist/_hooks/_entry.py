"""Scope and entry checks: a model remembers the strategy it was created
under; `compile`, `fit`, `evaluate`, `predict` and `*_on_batch` check it and
run inside that strategy's scope (`compile` adopts an unused optimizer made
outside it: `_optimizers`)."""

from __future__ import annotations

import contextlib
import inspect

import keras
import numpy as np

from keras_dist import _context, _tf_data
from keras_dist._communication import PeerWorkerError
from keras_dist._hooks import _distributed_input, _files, _optimizers, _ps_fit, _sigterm, _steps
from keras_dist._context import model_strategy, remember_strategy
from keras_dist._input import check_batched
from keras_dist._worker_batches import worker_streams
from keras_dist._split import validate_batch_size
from keras_dist.backends import get_adapter

_BATCH_ARGUMENTS = {
    "fit": ("batch_size", "validation_batch_size"),
    "evaluate": ("batch_size",),
    "predict": ("batch_size",),
}
ENTRY_POINTS = ("fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")


def wrap_trainer_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        strategy = _context.current_strategy()
        remember_strategy(self, strategy)
        if strategy is not None:
            _steps.install_step_functions(self)

    return __init__


def _check_scope(model, strategy, action: str) -> None:
    active = _context.current_strategy()
    if strategy is None:
        if active is not None:
            raise ValueError(
                f"Cannot {action} model {model.name!r} under {active!r}: the "
                "model was not created in the distribution strategy scope "
                "(it was created outside any strategy scope), so its "
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
        if not strategy.extended.variable_created_in_scope(variable):
            # tf.keras 2's words for a metric, which ported tests match
            metrics = " All metrics must be created in the same distribution strategy scope as the model." if what == "Metric" else ""
            raise ValueError(
                f"{what} variable {variable.path!r} was not created in the "
                f"distribution strategy scope (it was created outside the "
                f"scope of {strategy!r}), so it is not distributed with the "
                f"rest.{metrics} Create every layer, optimizer and metric of the "
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


def wrap_compile(original):
    signature = inspect.signature(original)

    def compile(self, *args, **kwargs):
        strategy = model_strategy(self)
        _check_scope(self, strategy, "compile")
        if strategy is None:
            return original(self, *args, **kwargs)
        bound = signature.bind(self, *args, **kwargs).arguments
        steps = bound.get("steps_per_execution", 1)
        if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
            raise ValueError(
                f"steps_per_execution must be a positive integer (steps run per "
                f"call of the compiled function), got {steps!r}. Use 1 (the "
                "default) or more."
            )
        if not _ps_fit.is_parameter_server(strategy):  # (its own checks: placement on the ps)
            _check_variables(strategy, self.variables, "Model")  # layers built outside the scope
        optimizer = bound.get("optimizer")
        adopt = None
        if isinstance(optimizer, keras.optimizers.Optimizer):  # made outside the scope: adopted if unused
            adopt = _optimizers.prepare_adoption(strategy, optimizer)
        adopters = [adopt] if adopt is not None else []
        for argument in ("metrics", "weighted_metrics"):  # made outside the scope: adopted (Keras 3 + tf takes them)
            for metric in keras.tree.flatten(bound.get(argument)):
                if isinstance(metric, keras.metrics.Metric):
                    adopt_metric = _optimizers.prepare_metric_adoption(strategy, metric)
                    if adopt_metric is not None:
                        adopters.append(adopt_metric)
        with strategy.scope():
            for adopt in adopters:  # every check passed: nothing changed before this
                adopt()
            return original(self, *args, **kwargs)

    return compile


def _arguments(signature, model, args, kwargs):
    """A call's arguments by name; None where the call does not bind (Keras
    reports the bad call itself)."""
    try:
        return signature.bind(model, *args, **kwargs).arguments
    except TypeError:
        return None


def _check_no_dataset_creator(name, signature, model, args, kwargs):
    """A `DatasetCreator` only a model of a ParameterServerStrategy takes;
    plain Keras says "Unrecognized data type" of it."""
    from keras_dist.strategies._parameter_server import DatasetCreator

    if name != "fit":
        return
    arguments = _arguments(signature, model, args, kwargs)
    if arguments is not None and isinstance(arguments.get("x"), DatasetCreator):
        raise ValueError(
            "fit got a keras_dist DatasetCreator, which a model takes only under a "
            "ParameterServerStrategy, but this model was created outside any strategy "
            "scope. Create and compile it inside `with strategy.scope():`."
        )


def wrap_entry(name: str):
    """The wrapper maker for `Model.<name>` (one of `ENTRY_POINTS`)."""

    def make(original):
        signature = inspect.signature(original)
        batch_arguments = _BATCH_ARGUMENTS.get(name, ())

        def entry(self, *args, **kwargs):
            strategy = model_strategy(self)
            _check_scope(self, strategy, name)
            if strategy is None:  # plain Keras, given the default strategy's distributed datasets' batches
                _check_no_dataset_creator(name, signature, self, args, kwargs)
                args, kwargs = _distributed_input.replace_distributed_datasets(name, signature, None, self, args, kwargs)
                return original(self, *args, **kwargs)
            _files.check_orbax_checkpoint((_arguments(signature, self, args, kwargs) or {}).get("callbacks"),
                                          strategy, name)
            if _ps_fit.is_parameter_server(strategy) and name in ("fit", "train_on_batch"):
                return _parameter_server_fit(self, strategy, name, signature, args, kwargs)
            args, kwargs = _distributed_input.replace_distributed_datasets(name, signature, strategy, self, args, kwargs)
            if batch_arguments:
                bound = _arguments(signature, self, args, kwargs) or {}  # a bad call: Keras reports it
                for argument in batch_arguments:
                    validate_batch_size(bound.get(argument), argument)
                for argument in ("x", "validation_data"):
                    what = name if argument == "x" else f"{name}'s {argument}"
                    check_batched(bound.get(argument), strategy.num_replicas_in_sync, self, what)
                if strategy.extended.should_checkpoint:
                    _files.check_backup_dirs_writable(bound.get("callbacks"))
            _check_model_variables(self, strategy)
            empties = {}
            if batch_arguments:
                args, kwargs, empties = _per_worker_streams(name, signature, strategy, self, args, kwargs)
                _check_same_call_on_every_worker(name, signature, strategy, self, args, kwargs, empties)
            try:
                with _sigterm.stop_on_sigterm(strategy) if name == "fit" else contextlib.nullcontext() as agree:
                    if agree is not None:
                        args, kwargs = _with_callback(signature, self, args, kwargs, agree)
                    return _run_entry(original, signature, strategy, self, name, args, kwargs, empties)
            except StopIteration as error:  # Keras' first batch, on JAX
                raise _no_batch_error(name) from error

        return entry

    return make


#: What `_check_same_call_on_every_worker` compares, by entry point: the
#: input's size (rows, or batches where it has a length, -1 unknown) and
#: the arguments that set how many steps run.
_SAME_ON_EVERY_WORKER = {
    "fit": ("x", "validation_data", "batch_size", "epochs", "initial_epoch", "steps_per_epoch",
            "validation_steps", "validation_batch_size", "validation_freq", "validation_split"),
    "evaluate": ("x", "batch_size", "steps"),
    "predict": ("x", "batch_size", "steps"),
}


def _input_size(value) -> int:
    """Rows of an array input (its first array's), the length of one with a
    length (PyDataset, DataLoader) or tf.data's cardinality; -1 unknown."""
    if value is None:
        return -1
    if isinstance(value, (list, tuple, dict)) and not hasattr(value, "shape"):
        leaves = [leaf for leaf in keras.tree.flatten(value) if hasattr(leaf, "shape")]
        value = leaves[0] if leaves else value
    shape = getattr(value, "shape", None)
    if shape is not None and len(shape) and shape[0] is not None:
        return int(shape[0])
    if hasattr(value, "cardinality"):
        try:
            return int(value.cardinality())
        except Exception:  # noqa: BLE001 - not a tf.data dataset after all
            return -1
    try:
        return len(value)
    except TypeError:
        return -1


def _argument_code(argument: str, value) -> int:
    if argument in ("x", "validation_data"):
        return _input_size(value)
    if value is None or isinstance(value, bool) or not isinstance(value, (int, float)):
        return -1
    return int(round(value * 1_000_000)) if argument == "validation_split" else int(value)


def _check_same_call_on_every_worker(name, signature, strategy, model, args, kwargs, empties) -> None:
    """In a multi-worker job every worker must call `name` with the same
    input and step arguments: each takes its rows of the same global
    batches, step by step. Compared before the first step (one all-gather):
    a worker with fewer rows or another `epochs` would otherwise train some
    steps, then fail or wait at a step the others never reach."""
    if strategy.extended.num_workers < 2:
        return
    bound = _arguments(signature, model, args, kwargs)
    if bound is None:
        return  # Keras reports the bad call
    names = _SAME_ON_EVERY_WORKER[name]
    own = np.array([
        -2 if argument in ("x", "validation_data") and empties.get(
            _STEP_KINDS[name] if argument == "x" else "test") is not None  # a per-worker stream: sizes differ
        else _argument_code(argument, bound.get(argument))
        for argument in names
    ], dtype=np.int32)
    (every,) = get_adapter().values_from_every_worker([own])
    every = np.asarray(every)
    differ = [i for i in range(len(names)) if len(set(every[:, i].tolist())) > 1]
    if differ:
        listing = "; ".join(
            f"{names[i]}: " + ", ".join(f"worker {w} {_shown(names[i], int(every[w, i]))}" for w in range(len(every)))
            for i in differ
        )
        raise ValueError(
            f"{name} was called with different input or arguments on the workers ({listing}). Every worker of a "
            f"MultiWorkerMirroredStrategy job must call {name} with the same data (every worker takes its own rows "
            "of each global batch) and the same arguments. Nothing was trained."
        )


def _shown(argument: str, code: int) -> str:
    if argument in ("x", "validation_data"):
        return {-1: "(size unknown)", -2: "(its own stream)"}.get(code, f"{code} rows or batches")
    if code == -1:
        return "None"
    return str(code / 1_000_000) if argument == "validation_split" else str(code)


def _with_callback(signature, model, args, kwargs, callback):
    """`fit`'s arguments with `callback` added last to its callbacks."""
    bound = signature.bind(model, *args, **kwargs)
    callbacks = bound.arguments.get("callbacks")
    bound.arguments["callbacks"] = [*(callbacks or []), callback]
    return bound.args[1:], bound.kwargs


def _run_entry(original, signature, strategy, model, name, args, kwargs, empties):
    """Keras' `name` under the strategy: a non-chief's file-writing
    callbacks write to private copies; a lost peer is one clear error."""
    with _explain_peer_failures(strategy), worker_streams(empties):
        if not strategy.extended.should_checkpoint and name in _BATCH_ARGUMENTS:
            return _files.run_as_non_chief(original, signature, strategy, model, args, kwargs)
        with strategy.scope():
            return original(model, *args, **kwargs)


_STEP_KINDS = {"fit": "train", "evaluate": "test", "predict": "predict"}


def _per_worker_streams(name, signature, strategy, model, args, kwargs):
    """Multi-worker tf.data input whose options ask for AutoShardPolicy
    FILE, OFF or HINT: each worker reads its own stream (`_tf_data`),
    whose steps' rows are combined over the job (`WorkerBatches`).

    Returns the call's arguments with those datasets replaced by this
    worker's streams, and, per step kind given input, its stream's empty
    batch and most rows a step (None: every worker reads the same global
    batches)."""
    extended = strategy.extended
    bound = signature.bind(model, *args, **kwargs)
    empties = {}
    for argument, kind in (("x", _STEP_KINDS[name]), ("validation_data", "test")):
        value = bound.arguments.get(argument)
        if value is None:
            continue
        if not _tf_data.reads_per_worker(value, extended.num_workers):
            empties[kind] = None
            continue
        if name == "predict":
            raise ValueError(
                f"predict got a tf.data dataset whose options ask for "
                f"AutoShardPolicy.{_tf_data.auto_shard_policy(value)}: each worker would "
                "predict its own stream, and predict returns every row of its input "
                "in order. Predict with AutoShardPolicy.AUTO or DATA (every worker "
                "returns all rows), or call predict on a model outside the strategy."
            )
        stream, empty, max_rows = _tf_data.worker_stream(
            value, extended.num_workers, extended.worker_index, strategy.num_replicas_in_sync
        )
        empties[kind] = (empty, max_rows)
        bound.arguments[argument] = stream
    return bound.args[1:], bound.kwargs, empties


def _parameter_server_fit(model, strategy, name, signature, args, kwargs):
    """fit under a ParameterServerStrategy: the coordinator's loop
    (`_ps_fit`), after every check passed."""
    if name == "train_on_batch":
        raise NotImplementedError(
            "train_on_batch is not supported under ParameterServerStrategy (as in "
            "tf.keras): steps run on the workers. Use fit with a dataset function "
            "and steps_per_epoch, or a ClusterCoordinator loop."
        )
    bound = signature.bind(model, *args, **kwargs).arguments
    _ps_fit.check_fit_arguments(model, bound)
    _check_model_variables(model, strategy)
    with strategy.scope():
        return _ps_fit.fit(model, strategy, bound)


def _no_batch_error(name: str) -> ValueError:
    """For an input that ran out before its first batch.

    Keras' JAX trainer takes the first batch to build the model with a bare
    `next()`: on an empty input the StopIteration would leave `fit` as is
    (and become a RuntimeError in any generator that calls it).
    """
    return ValueError(
        f"{name} got no batch: the input is empty (or an iterator already "
        "used up), so there is nothing to run. Check the input pipeline (a "
        "`take`, `skip`, `filter` or `shard` that leaves nothing, or arrays "
        "with 0 rows) and pass at least one batch."
    )


@contextlib.contextmanager
def _explain_peer_failures(strategy):
    """Turns the engine's collective failure into one clear error."""
    extended = strategy.extended
    if extended.num_workers <= 1:
        yield
        return
    try:
        yield
    except Exception as error:  # noqa: BLE001 - re-raised unless a peer failed
        if not get_adapter().is_peer_failure(error):
            raise
        timeout = extended.communication_options.timeout_seconds
        raise PeerWorkerError(
            f"Worker {extended.worker_index} of {extended.num_workers}: a "
            "collective with the other workers failed"
            + (f" (timeout_seconds={timeout:g})" if timeout else "")
            + "; another worker died or stopped responding (see its log). "
            "The job cannot continue with a worker missing: restart all of "
            "it (`keras-dist launch --max-restarts K` does), and resume "
            "with keras.callbacks.BackupAndRestore. Engine error: "
            f"{type(error).__name__}: {str(error).strip().splitlines()[0]}"
        ) from error
