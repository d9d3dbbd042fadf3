"""Backend adapters: one per Keras backend, behind `BackendAdapter`.

The core never imports jax or tensorflow; it asks `get_adapter()` for the
adapter of the backend Keras runs on. The adapter module is imported on
first use, and its `ADAPTER` is checked against `BackendAdapter` then.
"""

from __future__ import annotations

import importlib

from keras_dist.backends._base import (
    CAPABILITY_GROUPS,
    OPTIONAL_CONCERNS,
    REQUIRED_CONCERNS,
    BackendAdapter,
    OptionalCapabilities,
    check_conforms,
    concern_methods,
    concern_of,
    optional_methods,
    required_methods,
)

__all__ = [
    "CAPABILITY_GROUPS",
    "OPTIONAL_CONCERNS",
    "REQUIRED_CONCERNS",
    "BackendAdapter",
    "OptionalCapabilities",
    "backend_name",
    "check_conforms",
    "concern_methods",
    "concern_of",
    "get_adapter",
    "optional_methods",
    "required_methods",
]

#: Keras backend name -> the module whose `ADAPTER` serves it.
SUPPORTED = {
    "jax": "keras_dist.backends.jax",
    "tensorflow": "keras_dist.backends.tensorflow",
    "torch": "keras_dist.backends.torch",
}
_adapters: dict[str, BackendAdapter] = {}


def backend_name() -> str:
    import keras

    return keras.config.backend()


def get_adapter() -> BackendAdapter:
    """The adapter for the backend Keras is running on."""
    name = backend_name()
    adapter = _adapters.get(name)
    if adapter is None:
        if name not in SUPPORTED:
            raise NotImplementedError(
                f"keras_dist supports the backends {sorted(SUPPORTED)}; Keras "
                f"is running on {name!r}. Set KERAS_BACKEND=jax, "
                "tensorflow or torch before importing keras."
            )
        adapter = importlib.import_module(SUPPORTED[name]).ADAPTER
        check_conforms(adapter)
        _adapters[name] = adapter
    return adapter
