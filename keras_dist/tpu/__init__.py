"""`keras_dist.tpu`: tf.tpu's names that a TPUStrategy program uses."""

from keras_dist.tpu import experimental

__all__ = ["experimental"]
