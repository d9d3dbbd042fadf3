"""`OneDeviceStrategy`, `MirroredStrategy`, `CentralStorageStrategy`: one
process's devices (engine kinds ONE_DEVICE, LOCAL and CENTRAL_STORAGE)."""

from __future__ import annotations

import logging
from typing import Optional, Sequence

from keras_dist import _cross_device_ops, _devices
from keras_dist._engine_kind import EngineKind
from keras_dist.backends import get_adapter
from keras_dist.strategies._base import Strategy, StrategyExtended


def _one_worker_of_several() -> Optional[str]:
    """How this process's environment makes it one worker of a synchronous
    multi-worker job (TF_CONFIG with several chief/worker tasks and no ps,
    as `keras-dist launch -n N` sets it; torchrun's variables with
    WORLD_SIZE > 1), or None."""
    import os

    from keras_dist.cluster_resolver import TFConfigClusterResolver
    from keras_dist.cluster_resolver._torchrun import in_torchrun_job

    if os.environ.get("TF_CONFIG"):
        resolver = TFConfigClusterResolver()
        try:
            jobs = resolver.cluster_spec().as_dict()
            task_type, index = resolver.task_type, resolver.task_id
        except ValueError:  # a malformed TF_CONFIG: MultiWorkerMirroredStrategy says what is wrong
            return None
        workers = len(jobs.get("chief", ())) + len(jobs.get("worker", ()))
        if task_type in ("chief", "worker") and workers > 1 and not jobs.get("ps"):
            return f"task {task_type}:{index} of the {workers} chief/worker tasks in TF_CONFIG"
    elif in_torchrun_job() and int(os.environ["WORLD_SIZE"]) > 1:
        return f"rank {os.environ['RANK']} of the {os.environ['WORLD_SIZE']} processes torchrun's variables describe"
    return None


def _refuse_in_a_multi_worker_job(name: str) -> None:
    """A one-process strategy in one worker of a multi-worker job would train
    one model per worker, each on all the data, all writing the same files
    (tf.distribute does that silently): refused, naming the strategy meant."""
    where = _one_worker_of_several()
    if where is not None:
        raise ValueError(
            f"{name} in a multi-worker job ({where}): each worker would train its own model on all of the data "
            "and write the same files. To train one model over every worker's devices use "
            "keras_dist.MultiWorkerMirroredStrategy(); to train independent models, start each process on its own "
            "(without keras-dist launch / torchrun, TF_CONFIG unset)."
        )


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
        _refuse_in_a_multi_worker_job("OneDeviceStrategy")
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
        _refuse_in_a_multi_worker_job("MirroredStrategy")
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
        _refuse_in_a_multi_worker_job("CentralStorageStrategy")
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
    _logger.warning(
        "MirroredStrategy() found one device (%s), so it runs one replica. %s", device, _devices.more_cpu_replicas_hint()
    )
