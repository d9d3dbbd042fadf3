"""`model.fit` under a `ParameterServerStrategy`: the coordinator's loop.

Backend-agnostic: it uses only `keras_dist.coordinator.ClusterCoordinator`
and the adapter's step. The contract with each backend:

    step = get_adapter().make_trainer_function(model, strategy, "train")
    remote = coordinator.schedule(step, args=(per_worker_iterator,))
    remote.fetch() -> logs  # a dict of host scalars (the last step's)

`step(per_worker_iterator)` runs `model.steps_per_execution` of Keras'
`train_step` on the worker it is scheduled on, each on `next(iterator)`
of that worker's dataset, applying the update to the variables on the
parameter servers (no update lost: `optimizer.iterations` counts every
step once), and returns the last step's logs. For "test" and "predict"
`make_trainer_function` returns None: Keras' own step runs them inline on
the coordinator (as tf.keras 2 did without `pss_evaluation_shards`).

The loop (as tf.keras 2's): the input is a dataset function
(`keras_dist.experimental.DatasetCreator(fn)` or a plain callable; called
on each worker with an `InputContext` if it takes an argument) or, on
TensorFlow, a `tf.data.Dataset` (tf copies it to every worker); the
dataset must repeat and `steps_per_epoch` is required. Each epoch schedules
`steps_per_epoch / steps_per_execution` steps, joins, and reads the epoch's
logs from the metrics (on the parameter servers, updated by every worker);
callbacks run on the coordinator, batch callbacks with empty logs (a batch's
logs are not fetched: that would wait for it). Validation is
`model.evaluate`, inline on the coordinator.
"""

from __future__ import annotations

from typing import Any

#: fit arguments a dataset function makes meaningless (None/0 = not given)
_REFUSED = {
    "y": "y is part of the dataset the function makes",
    "batch_size": "the dataset function batches its dataset",
    "sample_weight": "sample weights are part of the dataset the function makes",
    "class_weight": "weight the examples in the dataset function",
    "validation_split": "pass validation_data instead",
    "validation_batch_size": "batch the validation data yourself",
}


def is_parameter_server(strategy: Any) -> bool:
    from keras_dist.strategies._parameter_server import ParameterServerStrategy

    return isinstance(strategy, ParameterServerStrategy)


def check_fit_arguments(model: Any, bound: dict) -> None:
    """Raises, naming the fix, for input `fit` under a ParameterServerStrategy
    cannot take; nothing changes before."""
    from keras_dist.strategies._parameter_server import DatasetCreator

    x = bound.get("x")
    if _is_tf_dataset(x):
        from keras_dist.backends import backend_name

        if backend_name() != "tensorflow":
            raise ValueError(
                "fit under ParameterServerStrategy on JAX takes a dataset function, not a "
                "tf.data.Dataset: the workers are Ray actors, which a dataset made here "
                "cannot be sent to. Pass keras_dist.experimental.DatasetCreator(dataset_fn), "
                "where dataset_fn(input_context) makes the repeated, batched dataset on "
                "each worker, with steps_per_epoch."
            )
    elif not isinstance(x, DatasetCreator) and not callable(x):
        raise ValueError(
            "fit under ParameterServerStrategy takes a dataset function (or, on TensorFlow, "
            f"a tf.data.Dataset), not {type(x).__name__}: each worker reads its own input. "
            "Pass keras_dist.experimental.DatasetCreator(dataset_fn) or dataset_fn "
            "itself, where dataset_fn(input_context) returns a repeated, batched "
            "dataset, with steps_per_epoch."
        )
    steps = bound.get("steps_per_epoch")
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(
            "fit under ParameterServerStrategy needs steps_per_epoch, a positive "
            f"integer (got {steps!r}): the workers' datasets repeat, so an epoch "
            "is a number of scheduled steps."
        )
    per_call = int(getattr(model, "steps_per_execution", 1) or 1)
    if steps % per_call:
        raise ValueError(
            f"steps_per_epoch={steps} is not a multiple of steps_per_execution={per_call}: "
            "each scheduled function runs steps_per_execution steps. Make it a multiple."
        )
    for name, fix in _REFUSED.items():
        if bound.get(name) not in (None, 0, 0.0):
            raise ValueError(
                f"fit under ParameterServerStrategy does not take {name}= with a "
                f"dataset function: {fix}."
            )


def _is_tf_dataset(x: Any) -> bool:
    """A tf.data.Dataset (not a function making one, nor a distributed dataset)."""
    from keras_dist._input import is_dataset_object

    return is_dataset_object(x) and hasattr(x, "take")


def _host_logs(logs: Any) -> dict:
    import numpy as np

    out = {}
    for key, value in dict(logs or {}).items():
        array = np.asarray(value)
        out[key] = float(array) if array.ndim == 0 else array
    return out


def _epoch_logs(model: Any, last: Any) -> dict:
    """The metrics' values after the epoch (every worker's steps), over the
    last step's logs for names the metrics do not have."""
    logs = _host_logs(last)
    try:
        results = model.get_metrics_result()
    except Exception:  # noqa: BLE001 - a custom model without Keras metrics
        return logs
    for key, value in _host_logs(results).items():
        if key in logs or not logs:
            logs[key] = value
    return logs


def _is_out_of_range(error: BaseException) -> bool:
    return type(error).__name__ in ("OutOfRangeError", "StopIteration")


def fit(model: Any, strategy: Any, bound: dict) -> Any:
    """`model.fit` under `strategy` (a ParameterServerStrategy), with the
    call's arguments `bound` (already checked by `check_fit_arguments`)."""
    import keras

    from keras_dist._hooks._steps import _fully_built
    from keras_dist._input import InputContext
    from keras_dist.strategies._parameter_server import call_dataset_fn
    from keras_dist.backends import get_adapter
    from keras_dist.coordinator import ClusterCoordinator

    dataset_fn = bound["x"]
    steps_per_epoch = bound["steps_per_epoch"]
    epochs = bound.get("epochs", 1)
    initial_epoch = bound.get("initial_epoch", 0)
    verbose = bound.get("verbose", "auto")
    verbose = 2 if verbose == "auto" else verbose  # tf.keras 2's choice under PS
    validation_data = bound.get("validation_data")
    validation_steps = bound.get("validation_steps")
    validation_freq = bound.get("validation_freq", 1)
    per_call = int(getattr(model, "steps_per_execution", 1) or 1)

    if not _fully_built(model):  # build on the coordinator from one batch
        source = dataset_fn if _is_tf_dataset(dataset_fn) else call_dataset_fn(dataset_fn, InputContext(1, 0, 1))
        batch = next(iter(source))
        with strategy.scope():  # the metrics' and optimizer's variables are the strategy's
            model._symbolic_build(data_batch=batch)
    coordinator = ClusterCoordinator(strategy)
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))
    step = get_adapter().make_trainer_function(model, strategy, "train")

    callbacks = bound.get("callbacks")
    if not isinstance(callbacks, keras.callbacks.CallbackList):
        callbacks = keras.callbacks.CallbackList(
            callbacks,
            add_history=True,
            add_progbar=verbose != 0,
            verbose=verbose,
            epochs=epochs,
            steps=steps_per_epoch,
            model=model,
        )
    model.stop_training = False
    model._initial_epoch = None
    callbacks.on_train_begin()
    initial_epoch = model._initial_epoch or initial_epoch
    logs = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callbacks.on_epoch_begin(epoch)
        last = None
        try:
            for begin in range(0, steps_per_epoch, per_call):
                callbacks.on_train_batch_begin(begin)
                last = coordinator.schedule(step, args=(iterator,))
                callbacks.on_train_batch_end(begin + per_call - 1, {})
            coordinator.join()
            logs = _epoch_logs(model, last.fetch())
        except Exception as error:  # noqa: BLE001 - re-raised, explained
            if _is_out_of_range(error):
                raise ValueError(
                    "A worker's dataset ran out during fit under "
                    "ParameterServerStrategy: the dataset function must return "
                    "a repeating dataset (dataset.repeat()); steps_per_epoch "
                    "sets the epoch's length."
                ) from error
            raise
        if validation_data is not None and (epoch + 1) % validation_freq == 0:
            val_x, val_y, val_weight = (
                keras.utils.unpack_x_y_sample_weight(validation_data)
                if isinstance(validation_data, (tuple, list))
                else (validation_data, None, None)
            )
            val = model.evaluate(
                val_x,
                val_y,
                sample_weight=val_weight,
                steps=validation_steps,
                verbose=0,
                return_dict=True,
            )
            logs.update({f"val_{k}": v for k, v in val.items()})
        callbacks.on_epoch_end(epoch, logs)
        if model.stop_training:
            break
    callbacks.on_train_end(logs)
    return model.history
