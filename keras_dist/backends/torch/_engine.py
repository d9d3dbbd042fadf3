"""PyTorch: devices, the engine of a strategy, where variables go.

torch's model is one process per device (`torch.distributed`, as torchrun
and DDP use it), and keras_dist keeps it: on the torch backend a replica is
a process. A strategy's engine is this process's one device and, in a job
of several processes, the process group over them:

- `OneDeviceStrategy`, `MirroredStrategy` and `CentralStorageStrategy` of
  one device: one replica, Keras' own math;
- `MultiWorkerMirroredStrategy`: one replica per worker process (gloo on
  CPU, NCCL on GPU), each step's global batch split over them;
- several devices in one process: one clear error naming the launcher.
"""

from __future__ import annotations

import dataclasses

import torch

from keras_dist._engine_kind import EngineKind, engine_builder
from keras_dist.backends.torch import _cluster


@dataclasses.dataclass
class TorchEngine:
    """One replica's side of a strategy: its device, and the job's replicas."""

    #: What the strategy asked for.
    kind: EngineKind
    #: keras_dist's name of this replica's device ("cpu:0", "gpu:1").
    device: str
    #: The replicas in sync (the job's processes for MULTI_WORKER, else 1).
    num_replicas: int
    #: This replica's index (its process's rank).
    replica_id: int

    @property
    def torch_device(self) -> torch.device:
        return torch_device(self.device)

    @property
    def multi_process(self) -> bool:
        return self.num_replicas > 1


def torch_device(name: str) -> torch.device:
    """torch's device for a keras_dist device name ("gpu:1" -> cuda:1; a
    job's "cpu:k" is process k's CPU: torch's "cpu")."""
    kind, index = name.split(":")
    if kind == "gpu":
        return torch.device("cuda", int(index))
    if kind == "cpu":
        return torch.device("cpu")
    raise ValueError(f"The torch backend has no device {name!r} (its devices: cpu, gpu).")


def _local_gpus() -> int:
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def visible_devices() -> tuple[str, ...]:
    """This process's devices. In a job, its own: the GPU of its local rank
    (one device per process), or "cpu:<rank>"."""
    if _cluster.is_multi_process():
        return (_cluster.process_device(),)
    gpus = _local_gpus()
    return tuple(f"gpu:{i}" for i in range(gpus)) + ("cpu:0",)


def global_devices() -> tuple[str, ...]:
    """Every process's device, in rank order (one each)."""
    if not _cluster.is_multi_process():
        return visible_devices()
    return _cluster.job_devices()


def simulate_cpu_devices(count: int) -> None:
    """torch cannot split the host CPU into several devices: a replica is a
    process. One device is accepted (what there is); more is one error
    naming the way to run several CPU replicas."""
    if int(count) == 1:
        return
    raise ValueError(
        f"simulate_cpu_devices({count}) on the torch backend: torch has one CPU device per process, and keras_dist "
        "runs one replica per process there (torch.distributed's model). Run several CPU replicas as processes: "
        f"`keras-dist launch -n {count} --backend torch script.py` (or torchrun --nproc-per-node {count}) with "
        "keras_dist.MultiWorkerMirroredStrategy() in the script."
    )


def check_cross_device_ops(ops, devices) -> None:
    """One device per process: nothing is reduced inside a process, so any
    of keras_dist's `CrossDeviceOps` is accepted (between processes the
    process group's backend sums: gloo, NCCL)."""


def _one_process_device(extended) -> str:
    devices = tuple(extended.worker_devices)
    if len(devices) != 1:
        raise NotImplementedError(
            f"{type(extended.container_strategy).__name__} over {len(devices)} devices in one process "
            f"({', '.join(devices)}): on the torch backend a replica is a process (torch.distributed's model, as "
            "with DDP). Start one process per device, `keras-dist launch -n N --backend torch script.py` or "
            "`torchrun --nproc-per-node N script.py`, with keras_dist.MultiWorkerMirroredStrategy() in the script; "
            "or give this strategy one device."
        )
    return devices[0]


def _one_replica_engine(extended) -> TorchEngine:
    device = _one_process_device(extended)
    parameter = tuple(extended.parameter_devices)
    if len(parameter) == 1 and parameter[0] != device:
        raise NotImplementedError(
            f"CentralStorageStrategy with its variables on {parameter[0]} and compute on {device}: on the torch "
            "backend the one replica computes where its variables are. Leave parameter_device=None (the compute "
            "device)."
        )
    return TorchEngine(extended.engine_kind, device, 1, 0)


def _multi_worker_engine(extended) -> TorchEngine:
    device = _one_process_device(extended)
    return TorchEngine(extended.engine_kind, device, len(extended.engine_devices), extended.worker_index)


def _tpu_engine(extended):
    raise NotImplementedError(
        "TPUStrategy is not supported on the torch backend (torch_xla is not a Keras backend). Use the JAX or "
        "TensorFlow backend for TPUs; on GPUs and CPUs use MirroredStrategy or MultiWorkerMirroredStrategy."
    )


_ENGINES = {
    EngineKind.LOCAL: _one_replica_engine,
    EngineKind.ONE_DEVICE: _one_replica_engine,
    EngineKind.CENTRAL_STORAGE: _one_replica_engine,
    EngineKind.MULTI_WORKER: _multi_worker_engine,
    EngineKind.TPU: _tpu_engine,
}


def create_engine(extended) -> TorchEngine:
    return engine_builder(_ENGINES, extended.engine_kind, "torch")(extended)


def scope(engine: TorchEngine):
    """Variables created inside are on the engine's device (Keras' torch
    device scope)."""
    import keras

    return keras.device(_keras_device_name(engine.torch_device))


def _keras_device_name(device: torch.device) -> str:
    return "cpu" if device.type == "cpu" else f"cuda:{device.index}"


def owns_variable(engine: TorchEngine, variable) -> bool:
    value = getattr(variable, "_value", None)
    if value is None:
        return True
    device = getattr(value, "device", None)
    if device is None:
        return False
    want = engine.torch_device
    return device.type == want.type and (want.index is None or device.index == want.index)
