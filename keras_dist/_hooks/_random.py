"""Random draws in a per-replica step: one device's, row for row.

On one device, `Dropout` draws one mask for the whole global batch. A
replica of a per-replica step (TensorFlow's; JAX's in multi-process CPU
jobs) holds only its rows, and with the same seed as every other replica
it would draw the first rows of that mask for its own: every replica the
same mask, not one device's. Here each replica draws the mask of the
global batch with that seed and keeps its own rows of it, so a model with
dropout trains as on one device. Outside a replica step Keras' own runs.
"""

from __future__ import annotations

import keras

from keras_dist import _shard


def wrap_dropout(original):
    """Wrapper for a backend's `random.dropout(inputs, rate, noise_shape, seed)`."""

    def dropout(inputs, rate, noise_shape=None, seed=None):
        shard = _shard.current()
        if shard is None or shard.start is None or rate in (0.0, 1.0):
            return original(inputs, rate, noise_shape, seed)
        if noise_shape is not None and isinstance(noise_shape[0], int) and noise_shape[0] == 1:
            return original(inputs, rate, noise_shape, seed)  # one mask row for every example
        ops = keras.ops
        shape = ops.shape(inputs)
        if noise_shape is None:
            noise_shape = tuple(shape)
        noise_shape = tuple(shape[i] if dim is None else dim for i, dim in enumerate(noise_shape))
        global_noise = (shard.global_rows,) + noise_shape[1:]
        # one device's scaled mask (0 or 1 / (1 - rate)) over the global batch
        mask = original(ops.ones(global_noise, dtype=inputs.dtype), rate, None, seed)
        mask = ops.slice(mask, (shard.start,) + (0,) * (len(global_noise) - 1), (shard.local_rows,) + tuple(global_noise[1:]))
        return inputs * mask

    return dropout
