"""Keras metrics updated inside `strategy.run` count only real rows.

On JAX an uneven split of a global batch pads each replica's shard to the
same length (SPMD needs equal shapes; see `ReplicaContext.row_mask`). The
two functions every built-in sample-wise metric goes through, the
Mean/Sum reduction (accuracy, crossentropy, MAE, ...) and the confusion
matrix update (AUC, precision, recall, ...), get the padding rows'
sample weight set to 0 there, so a metric updated inside `run` and read
after gives its value over the real global batch. Elsewhere (TensorFlow,
even shards, outside `run`) nothing changes.
"""

from __future__ import annotations

import inspect

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
