"""BatchNormalization statistics over the global batch, from one replica.

Inside a per-replica step each replica sees only its rows; Keras'
`BatchNormalization` would normalize with those rows' moments. This
computes what one device computes over the whole batch, in Keras ops, with
the backend's all-reduce passed in:

    mean, variance = global_moments(x, axes=[0], mask=None, all_reduce_sum=psum_list)
"""

from __future__ import annotations

from typing import Callable, Sequence

import keras
from keras import ops


def global_moments(
    inputs,
    axes: Sequence[int],
    mask,
    all_reduce_sum: Callable[[list], list],
):
    """Mean and variance over the global batch, as one device computes them.

    Two passes (mean first, then squared deviations), each summed across
    replicas by `all_reduce_sum` (a list of tensors in, their sums out);
    with a mask, Keras' masked formula (weights + epsilon). Half-precision
    inputs are reduced in float32, as Keras does.
    """
    dtype = keras.backend.standardize_dtype(inputs.dtype)
    x = ops.cast(inputs, "float32") if dtype in ("float16", "bfloat16") else inputs
    axes = list(axes)
    if mask is None:
        local_sum = ops.sum(x, axis=axes, keepdims=True)
        local_count = ops.sum(ops.ones_like(x), axis=axes, keepdims=True)
        total, count = all_reduce_sum([local_sum, local_count])
        mean = ops.divide_no_nan(total, count)
        deviation = ops.square(x - ops.stop_gradient(mean))
        (squares,) = all_reduce_sum([ops.sum(deviation, axis=axes, keepdims=True)])
        variance = ops.divide_no_nan(squares, count)
        mean, variance = ops.squeeze(mean, axes), ops.squeeze(variance, axes)
    else:
        weights = ops.cast(
            ops.broadcast_to(ops.expand_dims(mask, -1), ops.shape(x)), "bool"
        )
        masked = ops.where(weights, x, ops.zeros_like(x))
        local_sum = ops.sum(masked, axis=axes, keepdims=True)
        local_weight = ops.sum(ops.cast(weights, x.dtype), axis=axes, keepdims=True)
        total, weight = all_reduce_sum([local_sum, local_weight])
        epsilon = ops.cast(keras.config.epsilon(), x.dtype)
        mean = total / (weight + epsilon)
        deviation = ops.where(weights, x - mean, ops.zeros_like(x))
        (squares,) = all_reduce_sum(
            [ops.sum(ops.square(deviation), axis=axes, keepdims=True)]
        )
        variance = squares / (weight + epsilon)
        mean, variance = ops.squeeze(mean), ops.squeeze(variance)
    if keras.backend.standardize_dtype(x.dtype) != dtype:
        mean, variance = ops.cast(mean, dtype), ops.cast(variance, dtype)
    return mean, variance
