"""Loss helpers for custom training loops (tf.nn names)."""

from __future__ import annotations

import keras

from keras_dist.strategies import _default


def _replica_context(name: str):
    context = _default.get_replica_context()
    if context is None:
        raise ValueError(
            f"keras_dist.{name} must be called in replica context, i.e. "
            "inside the function given to strategy.run (or outside any "
            "strategy scope)."
        )
    return context


def _check_weight_shape(weight: tuple, loss: tuple) -> None:
    """Refuses a sample_weight whose known dimensions do not line up with
    the per-example losses' (one weight per example, or a scalar)."""
    if len(weight) > len(loss) or any(
        w is not None and l is not None and w not in (1, l) for w, l in zip(weight, loss)
    ):
        raise ValueError(
            f"compute_average_loss got a sample_weight of shape {weight} for per-example "
            f"losses of shape {loss}: give one weight per example of this replica (the "
            "sample_weight part of the same distributed batch), or a scalar."
        )


def compute_average_loss(per_example_loss, sample_weight=None, global_batch_size=None):
    """Sum of this replica's per-example losses / the global batch size.

    Summed over replicas (gradients are), this is the mean loss of the
    global batch, exactly as on one device. Without `global_batch_size`, the
    real number of examples in this step is all-reduced across replicas, so
    uneven and partial batches stay exact.

    ```python
    per_example = keras.losses.mean_squared_error(y, model(x))
    loss = keras_dist.compute_average_loss(per_example)
    ```
    """
    context = _replica_context("compute_average_loss")
    loss = keras.ops.convert_to_tensor(per_example_loss)
    if len(loss.shape) == 0:
        raise ValueError(
            "compute_average_loss expects per-example losses (rank >= 1); got "
            "a scalar. Use a loss with reduction='none' or 'sum'... "
            "reduction='none' gives per-example values."
        )
    if sample_weight is not None:
        weight = keras.ops.cast(keras.ops.convert_to_tensor(sample_weight), loss.dtype)
        if len(weight.shape) == len(loss.shape) + 1 and weight.shape[-1] == 1:
            weight = keras.ops.squeeze(weight, -1)  # (batch, 1) weights for (batch,) losses, as tf takes them
        _check_weight_shape(tuple(weight.shape), tuple(loss.shape))
        while len(weight.shape) < len(loss.shape):
            weight = keras.ops.expand_dims(weight, -1)
        loss = loss * weight
    mask = context.row_mask(loss)
    if mask is not None:  # padding rows of uneven shards (JAX): drop them
        mask = keras.ops.reshape(mask, (-1,) + (1,) * (len(loss.shape) - 1))
        loss = keras.ops.where(mask, loss, keras.ops.zeros_like(loss))
    total = keras.ops.sum(loss)
    if global_batch_size is None:
        count = context.global_rows(keras.ops.shape(loss)[0])
    else:
        if isinstance(global_batch_size, (int, float)) and global_batch_size <= 0:
            raise ValueError(
                f"global_batch_size must be positive, got {global_batch_size}."
            )
        count = global_batch_size
    return total / keras.ops.cast(count, total.dtype)


def scale_regularization_loss(regularization_loss):
    """The sum of a regularization loss, divided by the replicas in sync.

    Each replica adds it; summed over replicas it counts once. As
    `tf.nn.scale_regularization_loss`, a list or tuple of losses (such as
    `model.losses`) is added up first, and a tensor is summed to a scalar.

    ```python
    per_example = keras.losses.binary_crossentropy(y, model(x))
    penalties = [0.01 * keras.ops.sum(w ** 2) for w in model.trainable_weights]
    loss = keras_dist.compute_average_loss(per_example)
    loss += keras_dist.scale_regularization_loss(penalties)
    ```
    """
    context = _replica_context("scale_regularization_loss")
    if isinstance(regularization_loss, (list, tuple)):
        if not regularization_loss:
            raise ValueError(
                "scale_regularization_loss got an empty list: there is no "
                "regularization loss to scale. Add it only when the list "
                "has terms (e.g. `if model.losses:`)."
            )
        terms = [keras.ops.convert_to_tensor(term) for term in regularization_loss]
        loss = terms[0]
        for term in terms[1:]:
            loss = loss + term
    else:
        loss = keras.ops.convert_to_tensor(regularization_loss)
    loss = keras.ops.sum(loss)
    return loss / keras.ops.cast(context.num_replicas_in_sync, loss.dtype)
