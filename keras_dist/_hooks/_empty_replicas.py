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
"""

from __future__ import annotations

import keras

from keras_dist import _context, _shard


def _has_an_empty_dimension(value) -> bool:
    try:
        dims = tuple(getattr(value, "shape", None) or ())
    except (TypeError, ValueError):  # a graph tensor of unknown rank
        return False
    return any(dim == 0 for dim in dims)


def wrap_add(original):
    """Wrapper for Keras' TensorFlow `numpy.add(x1, x2)`."""

    def add(x1, x2):
        if (_shard.current() is None and _context.replica_context() is None) or not (
            _has_an_empty_dimension(x1) or _has_an_empty_dimension(x2)
        ):
            return original(x1, x2)
        ops = keras.ops
        x1, x2 = ops.convert_to_tensor(x1), ops.convert_to_tensor(x2)
        dtype = keras.backend.result_type(x1.dtype, x2.dtype)
        return ops.cast(x1, dtype) + ops.cast(x2, dtype)  # the tensors' own add: tf's, no bias shortcut

    return add
