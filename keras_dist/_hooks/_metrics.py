"""Keras metrics inside `strategy.run`: updates count only real rows, and
`result()` is the value over all replicas.

On JAX an uneven split of a global batch pads each replica's shard to the
same length (SPMD needs equal shapes; see `ReplicaContext.row_mask`). The
two functions every built-in sample-wise metric goes through, the
Mean/Sum reduction (accuracy, crossentropy, MAE, ...) and the confusion
matrix update (AUC, precision, recall, ...), get the padding rows'
sample weight set to 0 there, so a metric updated inside `run` and read
after gives its value over the real global batch. Elsewhere (TensorFlow,
even shards, outside `run`) nothing changes.

`metric.result()` called inside `run` gives the metric's value over every
replica's updates so far, the same on each replica, as tf-keras gave it
(it wrapped every metric's `result` to read its sync-on-read variables
aggregated); Keras 3 gives each replica its own share. Every metric made
gets its `result` wrapped so (an instance attribute, as tf-keras did):
inside `run` it reads the metric's variables over all replicas (the
replica context's `_sync_on_read`); anywhere else it is the class's own
`result`, untouched.
"""

from __future__ import annotations

import inspect
import types

import keras

from keras_dist import _context


def _masked_weight(sample_weight, like):
    """`sample_weight` with this replica's padding rows of `like` at 0, or
    `sample_weight` itself where there is no padding."""
    context = _context.replica_context()
    if context is None or like is None:
        return sample_weight
    rows = context.row_mask(like)
    if rows is None:
        return sample_weight
    if sample_weight is None:
        return keras.ops.cast(rows, "float32")
    weight = keras.ops.convert_to_tensor(sample_weight)
    if "float" not in str(weight.dtype):
        weight = keras.ops.cast(weight, "float32")
    rows = keras.ops.cast(rows, weight.dtype)
    if len(weight.shape) >= 1:
        rows = keras.ops.reshape(rows, (rows.shape[0],) + (1,) * (len(weight.shape) - 1))
    return weight * rows


def wrap_reduce_to_samplewise_values(original):
    def reduce_to_samplewise_values(values, sample_weight, reduce_fn, dtype):
        shape = getattr(values, "shape", None)
        like = values if shape is not None and len(shape) >= 1 else None
        return original(values, _masked_weight(sample_weight, like), reduce_fn, dtype)

    return reduce_to_samplewise_values


def wrap_update_confusion_matrix_variables(original):
    signature = inspect.signature(original)

    def update_confusion_matrix_variables(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        y_pred = keras.ops.convert_to_tensor(bound.arguments["y_pred"])
        bound.arguments["sample_weight"] = _masked_weight(bound.arguments.get("sample_weight"), y_pred)
        return original(*bound.args, **bound.kwargs)

    return update_confusion_matrix_variables


def _result(metric):
    """`type(metric).result(metric)`, over all replicas inside `run`."""
    result = type(metric).result
    context = _context.replica_context()
    if context is None:
        return result(metric)
    with context._sync_on_read():
        return result(metric)


def wrap_metric_init(original):
    def __init__(self, *args, **kwargs):
        original(self, *args, **kwargs)
        # object.__setattr__: past Keras' attribute tracking (not a state)
        object.__setattr__(self, "result", types.MethodType(_result, self))

    return __init__
