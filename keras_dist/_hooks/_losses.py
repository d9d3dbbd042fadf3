"""Loss scaling and BatchNormalization moments.

Inside a per-replica step (TensorFlow's; JAX's in multi-process CPU jobs)
each replica runs Keras' own step on its rows. These hooks make it compute
what one device computes on the global batch: each replica's loss (and
regularization) is scaled by its share of the global batch, BatchNorm takes
global moments, and (JAX) the trainable variables' gradients are summed
across replicas. In custom loops, an averaging Keras loss inside
`strategy.run` is refused with the fix.
"""

from __future__ import annotations

import inspect

import keras

from keras_dist import _context, _shard
from keras_dist._moments import global_moments
from keras_dist.backends import get_adapter

_AVERAGING_REDUCTIONS = ("sum_over_batch_size", "mean", "mean_with_sample_weight")


def wrap_loss_call(original):
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


def _scaled(value, factor):
    """`value` times `factor(dtype)` inside a replica step, else None."""
    factor = factor(value.dtype)
    return None if factor is None else keras.ops.multiply(value, factor)


def wrap_scale(factor):
    """Wrapper maker for Keras' (un)scale_loss_for_distribution: multiplies
    by `factor` (`_shard.scale_factor` or `unscale_factor`) in a replica step."""

    def make(original):
        def scale(value):
            scaled = _scaled(value, factor)
            return original(value) if scaled is None else scaled

        return scale

    return make


def wrap_reduce_values(original):
    """Keras' `reduce_values` in a replica step, for the two shapes it
    returns as they are:
    - a scalar (a loss function that averages itself, e.g. ``lambda y, p:
      ops.mean(ops.square(y - p))``): taken as this replica's mean, scaled
      by its share of the global batch like any averaged loss (Keras leaves
      it unscaled, so the replicas' summed gradients were `num_replicas`
      times one device's);
    - no rows (a replica with no rows of a global batch smaller than the
      replica count): zero, its share (Keras gives back the empty values,
      and the logged loss became NaN)."""

    def reduce_values(values, sample_weight=None, reduction="sum_over_batch_size"):
        reduced = original(values, sample_weight, reduction)
        if reduction in (None, "none") or not _shard.in_replica_step():
            return reduced
        shape = tuple(values.shape)
        if shape == (0,):  # a sum of nothing, still tied to the weights (zero gradients)
            return keras.ops.sum(values)
        if shape == () and reduction in _AVERAGING_REDUCTIONS:
            # a replica with no rows: the function's mean of nothing is NaN; its share is 0
            factor = _shard.scale_factor(reduced.dtype)
            return keras.ops.where(factor > 0, reduced * factor, keras.ops.zeros_like(reduced))
        return reduced

    return reduce_values


def wrap_batch_norm_init(original):
    """`BatchNormalization(synchronized=True)` under a keras_dist strategy
    on JAX: taken (Keras on JAX refuses it in the constructor), since
    keras_dist synchronizes every BatchNormalization under a strategy
    (`wrap_moments`). Outside a strategy, Keras' own refusal stands."""

    signature = inspect.signature(original)

    def __init__(self, *args, **kwargs):
        bound = signature.bind(self, *args, **kwargs)
        if not bound.arguments.get("synchronized") or _context.current_strategy() is None:
            return original(self, *args, **kwargs)
        bound.arguments["synchronized"] = False
        original(*bound.args, **bound.kwargs)
        self.synchronized = True

    # Keras reads the constructor's parameters (its auto config) from this
    __init__.__signature__ = signature
    return __init__


def wrap_moments(original):
    """BatchNormalization normalises with the global batch's moments in a
    replica step of `fit` and inside `strategy.run` (as
    `BatchNormalization(synchronized=True)` asks; keras_dist does it for
    every BatchNormalization there, so a custom loop trains as one device
    does). Rows JAX pads an uneven shard with are left out."""

    def _moments(self, inputs, mask):
        if _shard.in_replica_step():
            return get_adapter().global_moments(inputs, self._reduction_axes, mask)
        context = _context.replica_context()
        if context is None or context.num_replicas_in_sync == 1:
            try:
                return original(self, inputs, mask)
            except NotImplementedError:
                # Keras on JAX refuses `synchronized=True`; with no replicas
                # to synchronize with, the batch's own moments are the answer.
                if not getattr(self, "synchronized", False):
                    raise
                return global_moments(inputs, self._reduction_axes, mask, list)
        rows = context.row_mask(inputs)
        if rows is not None:
            shape = keras.ops.shape(inputs)
            rows = keras.ops.reshape(rows, (shape[0],) + (1,) * (len(shape) - 2))
            rows = keras.ops.broadcast_to(rows, shape[:-1])
            mask = rows if mask is None else keras.ops.logical_and(keras.ops.cast(mask, "bool"), rows)
        return get_adapter().global_moments(inputs, self._reduction_axes, mask)

    return _moments


def wrap_additional_loss(original):
    """Regularization and `add_loss` terms: scaled like the loss per replica
    (Keras' TensorFlow trainer does the same for tf.distribute)."""

    def _aggregate_additional_loss(self, loss):
        loss = original(self, loss)
        scaled = _scaled(loss, _shard.scale_factor)
        return loss if scaled is None else scaled

    return _aggregate_additional_loss


def wrap_compute_loss_and_updates(original):
    """In a per-replica training step: the gradients of the trainable
    variables are summed over replicas (one packed all-reduce), and the
    loss handed to the loss tracker is unscaled, as Keras' TensorFlow
    trainer does."""

    def compute_loss_and_updates(self, trainable_variables, *args, training=False, **kwargs):
        if not (training and _shard.in_replica_step()):
            return original(self, trainable_variables, *args, training=training, **kwargs)
        trainable_variables = get_adapter().sum_gradients_over_replicas(trainable_variables)
        loss, (unscaled_loss, *aux) = original(
            self, trainable_variables, *args, training=training, **kwargs
        )
        unscaled_loss = unscaled_loss * _shard.unscale_factor(unscaled_loss.dtype)
        return loss, (unscaled_loss, *aux)

    return compute_loss_and_updates
