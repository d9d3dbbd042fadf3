"""TensorFlow backend: `tf.distribute` strategies underneath.

Variables are `tf.distribute` mirrored (metrics: sync-on-read sums). Each
step receives the whole global batch and every replica takes its own
contiguous rows, so any batch size splits exactly (tf.data's rebatching
cannot: with an unknown batch size it hands whole batches to replicas).
keras_dist owns what Keras 3's TF trainer gets wrong: each replica's loss is
scaled by its share of the *global* batch (local rows / global rows) instead
of by 1 / replica count, BatchNormalization uses global-batch moments
(two-pass, all-reduced), per-step logs are read from the aggregated
metrics, and ``*_on_batch`` calls split their batch instead of copying it to
every replica.
"""

from keras_dist.backends.tensorflow._adapter import TensorFlowAdapter

#: The adapter `keras_dist.backends.get_adapter()` returns on TensorFlow.
ADAPTER = TensorFlowAdapter()

__all__ = ["ADAPTER", "TensorFlowAdapter"]
