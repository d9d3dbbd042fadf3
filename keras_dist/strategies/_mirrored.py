"""`OneDeviceStrategy`, `MirroredStrategy`, `CentralStorageStrategy`: one
process's devices (engine kinds ONE_DEVICE, LOCAL and CENTRAL_STORAGE)."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from keras_dist import _cross_device_ops, _devices
from keras_dist._engine_kind import EngineKind
from keras_dist.backends import get_adapter
from keras_dist.strategies._base import Strategy, StrategyExtended


class OneDeviceStrategy(Strategy):
    """Places variables and computation on one device.

    ```python
    strategy = keras_dist.OneDeviceStrategy("cpu:0")
    ```
    """

    def __init__(self, device: str):
        if not isinstance(device, str):
            raise TypeError(
                "OneDeviceStrategy takes one device name such as 'cpu:0' or "
                f"'/gpu:0'; got {device!r}."
            )
        visible = get_adapter().visible_devices()
        super().__init__(_OneDeviceExtended(self, _devices.resolve_devices([device], visible)))


class _OneDeviceExtended(StrategyExtended):
    engine_kind = EngineKind.ONE_DEVICE


class MirroredStrategy(Strategy):
    """Synchronous data parallelism over local devices.

    Every variable is mirrored on each device; each global batch is split
    across the replicas (also when it does not divide evenly) and gradients
    are summed over all of them, so training matches one device on the same
    global batch.

    Args:
        devices: device names (``"cpu:0"``, ``"/gpu:1"``...). ``None`` uses
            all local accelerators, or all local CPU devices if there are
            none.
        cross_device_ops: how values are summed across replicas: a
            `keras_dist.NcclAllReduce`, `HierarchicalCopyAllReduce` or
            `ReductionToOneDevice`; ``None`` lets the backend's engine choose.
            Checked here, for this backend and these devices.

    ```python
    strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
    strategy.num_replicas_in_sync  # 2
    keras_dist.MirroredStrategy(
        cross_device_ops=keras_dist.HierarchicalCopyAllReduce(num_packs=0)
    )
    ```
    """

    def __init__(
        self,
        devices: Optional[Sequence[str]] = None,
        cross_device_ops: Optional[_cross_device_ops.CrossDeviceOps] = None,
    ):
        adapter = get_adapter()
        resolved = _devices.resolve_devices(devices, adapter.visible_devices())
        cross_device_ops = _cross_device_ops.validate(cross_device_ops, resolved)
        adapter.check_cross_device_ops(cross_device_ops, resolved)
        super().__init__(StrategyExtended(self, resolved, cross_device_ops))
        if devices is None and len(resolved) == 1:
            _note_one_replica(resolved[0])


class _CentralStorageExtended(StrategyExtended):
    def __init__(self, strategy, compute_devices, parameter_device):
        super().__init__(strategy, compute_devices)
        self._parameter_device = parameter_device

    engine_kind = EngineKind.CENTRAL_STORAGE

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (self._parameter_device,)


class CentralStorageStrategy(Strategy):
    """Variables live once, on a parameter device; compute is replicated.

    As `tf.distribute.experimental.CentralStorageStrategy`: every variable
    (weights, optimizer slots, metrics) exists once, on `parameter_device`;
    each step reads the weights onto the compute devices, splits the global
    batch across them, sums the gradients, and the optimizer applies them
    once, on the parameter device. Training matches one device on the same
    global batch, as with `MirroredStrategy`.

    Args:
        compute_devices: devices that run the replicas (``None``: all local
            accelerators, or all local CPU devices where there are none).
        parameter_device: where the variables live (``None``: the CPU when
            there are several compute devices, else the one compute device).

    ```python
    strategy = keras_dist.experimental.CentralStorageStrategy(["cpu:0", "cpu:1"])
    strategy.extended.parameter_devices   # ('cpu:0',)
    ```
    """

    def __init__(
        self,
        compute_devices: Optional[Sequence[str]] = None,
        parameter_device: Optional[str] = None,
    ):
        visible = get_adapter().visible_devices()
        compute = _devices.resolve_devices(compute_devices, visible)
        if parameter_device is None:
            if len(compute) == 1:
                parameter = compute[0]
            else:
                parameter = next((d for d in visible if d.startswith("cpu:")), compute[0])
        elif isinstance(parameter_device, str):
            parameter = _devices.resolve_devices([parameter_device], visible)[0]
        else:
            raise TypeError(
                "CentralStorageStrategy(parameter_device=...) takes one device "
                f"name such as 'cpu:0'; got {parameter_device!r}."
            )
        super().__init__(_CentralStorageExtended(self, compute, parameter))

    def __repr__(self) -> str:
        devices = ", ".join(self._extended.worker_devices)
        return (
            f"CentralStorageStrategy(compute_devices=[{devices}], "
            f"parameter_device={self._extended.parameter_devices[0]})"
        )


_logger = logging.getLogger("keras_dist")


_noted_one_replica = False


def _note_one_replica(device: str) -> None:
    """Says once per process that `MirroredStrategy()` found one device (a
    warning: Python shows those on stderr with no logging set up)."""
    global _noted_one_replica
    if _noted_one_replica:
        return
    _noted_one_replica = True
    from keras_dist.backends import backend_name

    if backend_name() == "torch":  # a replica is a process there
        _logger.warning(
            "MirroredStrategy() found one device (%s), so it runs one replica. On the torch backend a replica is a "
            "process: run several with `keras-dist launch -n N --backend torch script.py` and "
            "keras_dist.MultiWorkerMirroredStrategy() in the script.",
            device,
        )
        return
    _logger.warning(
        "MirroredStrategy() found one device (%s), so it runs one replica. "
        "To try several replicas on this host's CPU, call "
        "keras_dist.simulate_cpu_devices(n) before the backend starts (right "
        "after the imports, before any computation).",
        device,
    )
