"""`keras_dist.tpu.experimental.initialize_tpu_system`, as in `tf.tpu.experimental`."""

from __future__ import annotations

from typing import Any

__all__ = ["initialize_tpu_system"]


def initialize_tpu_system(cluster_resolver: Any = None) -> None:
    """Readies the TPU system of `cluster_resolver` (default: this TPU VM).

    TensorFlow: tf's `initialize_tpu_system` where a TPU runtime is present.
    JAX: joins a multi-host slice (`jax.distributed.initialize()`); one host
    needs nothing. A no-op on a machine without TPUs, and when called again.
    Returns None (tf returns the TPU topology, which keras_dist does not use).

    ```python
    resolver = keras_dist.cluster_resolver.TPUClusterResolver()
    keras_dist.tpu.experimental.initialize_tpu_system(resolver)
    ```
    """
    import keras_dist  # noqa: F401  (installs the hooks, loads the backend)
    from keras_dist import _foreign
    from keras_dist.backends import get_adapter
    from keras_dist.cluster_resolver import TPUClusterResolver

    resolver = _foreign.accept(cluster_resolver, "cluster_resolver")  # TensorFlow: tf's own too
    resolver = resolver if resolver is not None else TPUClusterResolver()
    get_adapter().initialize_tpu_system(resolver)
