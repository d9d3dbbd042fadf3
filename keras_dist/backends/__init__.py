"""Backend adapters: one per Keras backend, behind one protocol.

The core never imports jax or tensorflow; it asks `get_adapter()` for the
adapter of the backend Keras runs on, which is imported on first use.
"""

from __future__ import annotations

import importlib
from typing import Any, ContextManager, Protocol

_SUPPORTED = {"jax": "keras_dist.backends.jax", "tensorflow": "keras_dist.backends.tensorflow"}
_adapters: dict[str, Any] = {}


class BackendAdapter(Protocol):
    """What keras_dist needs from a backend (see backends/jax, /tensorflow)."""

    name: str

    def visible_devices(self) -> tuple[str, ...]:
        """Canonical names ("cpu:0", "gpu:1") of the local devices."""

    def simulate_cpu_devices(self, count: int) -> None:
        """Splits the host CPU into `count` devices (before first use)."""

    def check_cross_device_ops(self, ops, devices: tuple[str, ...]) -> None:
        """Raises if this backend cannot carry out the `CrossDeviceOps` `ops`."""

    def create_engine(self, strategy) -> Any:
        """Builds the backend object that does the distribution."""

    def scope(self, engine) -> ContextManager:
        """Makes variables created inside it placed by `engine`."""

    def owns_variable(self, engine, variable) -> bool:
        """True if the Keras `variable` is placed by `engine`."""

    def time_all_reduce(self, engine, shapes_and_dtypes, repeats: int = 5) -> float:
        """Median seconds to all-reduce buffers of these shapes (a collective)."""

    # Per-replica steps (the loss and BatchNormalization hooks ask these):
    def in_replica_step(self) -> bool:
        """True while a Keras step is being traced as one replica of many."""

    def scale_factor(self, dtype) -> Any:
        """This replica's rows / global rows inside such a step, else None."""

    def unscale_factor(self, dtype) -> Any:
        """The inverse of `scale_factor`, else None."""

    def global_moments(self, inputs, axes, mask) -> tuple:
        """BatchNormalization mean and variance over the global batch."""


def backend_name() -> str:
    import keras

    return keras.config.backend()


def get_adapter() -> BackendAdapter:
    """The adapter for the backend Keras is running on."""
    name = backend_name()
    if name not in _adapters:
        if name not in _SUPPORTED:
            raise NotImplementedError(
                f"keras_dist supports the backends {sorted(_SUPPORTED)}; Keras "
                f"is running on {name!r}. Set KERAS_BACKEND=jax or "
                "KERAS_BACKEND=tensorflow before importing keras."
            )
        _adapters[name] = importlib.import_module(_SUPPORTED[name])
    return _adapters[name]
