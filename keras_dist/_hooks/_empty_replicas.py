"""Replicas that get no rows of a global batch (TensorFlow).

A global batch smaller than the replica count (a partial last batch of 3
rows on 4 replicas) leaves a replica with a batch of 0 rows. Keras'
TensorFlow `add` takes a shortcut for what looks like a bias: it drops
every dimension of size 0 or 1 from the second operand's shape, and if one
is left that matches the first operand's channels, it calls `bias_add`. An
operand of shape (0, 24) (two batch-shaped tensors added, as in an LSTM
cell or a residual `Add`) then passes for a bias, and tf refuses the graph
("Shape must be rank 1 but is rank 2 ... BiasAdd"). Inside a replica, when
either operand has a dimension of size 0, the two are added with tf's plain
add (after Keras' own dtype promotion); otherwise, and everywhere outside a
replica, Keras' `add` runs unchanged.

TensorFlow's oneDNN convolutions (on by default on x86 CPUs) return an
empty batch with the input's channels instead of the filters' (`(0, 8, 8,
3)` for 4 filters), so the next op refused the shapes (a ConvLSTM2D's
`x + h`, a Dense after pooling). Inside a replica step, a convolution's
output is replaced by an empty one of the right shape when its input has
no rows (a `cond` on the row count around the output only: the
convolution runs once); an input known to be empty when traced convolves
one zero row and keeps none of the result.
"""

from __future__ import annotations

import keras

from keras_dist import _context, _shard


def _in_a_replica() -> bool:
    return _shard.current() is not None or _context.replica_context() is not None


def _static_dims(value):
    """`value`'s dimensions as traced (None for one known only when run),
    or None for a graph tensor of unknown rank."""
    try:
        return tuple(getattr(value, "shape", None) or ())
    except (TypeError, ValueError):
        return None


def _has_an_empty_dimension(value) -> bool:
    return any(dim == 0 for dim in _static_dims(value) or ())


def wrap_add(original):
    """Wrapper for Keras' TensorFlow `numpy.add(x1, x2)`."""

    def add(x1, x2):
        if not _in_a_replica() or not (_has_an_empty_dimension(x1) or _has_an_empty_dimension(x2)):
            return original(x1, x2)
        ops = keras.ops
        x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
        dtype = keras.backend.result_type(x1.dtype, x2.dtype)
        return ops.cast(x1, dtype) + ops.cast(x2, dtype)  # the tensors' own add: tf's, no bias shortcut

    return add


def _batch_is_empty(inputs):
    """True, False, or None when the batch size is known only when run."""
    dims = _static_dims(inputs)
    if dims is None or (dims and dims[0] is None):
        return None
    return bool(dims) and dims[0] == 0


def wrap_convolution(original):
    """Wrapper for Keras' TensorFlow `nn.conv`, `nn.depthwise_conv` and
    `nn.separable_conv` (the input first)."""

    def convolution(inputs, *args, **kwargs):
        if not _in_a_replica():
            return original(inputs, *args, **kwargs)
        ops = keras.ops
        inputs = ops.convert_to_tensor(inputs)
        empty = _batch_is_empty(inputs)
        if empty is False:
            return original(inputs, *args, **kwargs)

        def on_one_zero_row():
            padded = ops.pad(inputs, [[0, 1]] + [[0, 0]] * (len(inputs.shape) - 1))  # still depends on `inputs`
            return original(padded, *args, **kwargs)[:0]

        if empty:
            return on_one_zero_row()
        # The batch's size is known only when the step runs: the convolution
        # always runs on at least one row (a zero row added where the batch
        # is empty, its output cut off again), forward and backward. On an
        # empty batch tf's own kernels gave the output the input's channels
        # (oneDNN) and, for DepthwiseConv2dNativeBackpropFilter on CPUs
        # without oneDNN, a kernel gradient of uninitialised memory (1e33 in
        # the weights). (Not tf.pad, which oneDNN fuses into its convolution,
        # nor a tf.cond around it, which failed under oneDNN.)
        rest = tuple(inputs.shape)[1:]
        if any(dim is None for dim in rest):  # the zero row's shape is unknown: the replica's output only
            outputs = original(inputs, *args, **kwargs)
            return ops.cond(ops.shape(inputs)[0] > 0, lambda: outputs, on_one_zero_row)
        rows = ops.shape(inputs)[0]
        zero_rows = ops.zeros((1 - ops.minimum(rows, 1),) + rest, inputs.dtype)
        return original(ops.concatenate([inputs, zero_rows], axis=0), *args, **kwargs)[:rows]

    return convolution
