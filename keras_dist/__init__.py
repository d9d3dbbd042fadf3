"""keras_dist: tf.distribute-style distributed training for Keras 3.

```python
import keras_dist
strategy = keras_dist.MirroredStrategy()       # all local devices
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=64, verbose=0)      # 64 = global batch
```

Names load on first use: `import keras_dist` imports neither Keras nor a
backend (so the `keras-dist` command runs on a JAX-only or a
TensorFlow-only install whatever `KERAS_BACKEND` says); the first public
name used imports Keras and installs keras_dist's hooks.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from keras_dist import _error_file
from keras_dist import _foreign  # noqa: F401 - standard library only; lends cluster_resolver its tf-object check

_error_file.install()  # only under `keras-dist launch` or torchrun (KERAS_DIST_ERROR_FILE, TORCHELASTIC_ERROR_FILE)

__version__ = "0.1.0"

#: Public name -> the module that defines it.
_EXPORTS = {
    "CommunicationImplementation": "keras_dist._communication",
    "CommunicationOptions": "keras_dist._communication",
    "PeerWorkerError": "keras_dist._communication",
    "CrossDeviceOps": "keras_dist._cross_device_ops",
    "HierarchicalCopyAllReduce": "keras_dist._cross_device_ops",
    "NcclAllReduce": "keras_dist._cross_device_ops",
    "ReductionToOneDevice": "keras_dist._cross_device_ops",
    "DistributedDataset": "keras_dist._input",
    "DistributedIterator": "keras_dist._input",
    "InputContext": "keras_dist._input",
    "InputOptions": "keras_dist._input",
    "InputReplicationMode": "keras_dist._input",
    "RunOptions": "keras_dist.strategies._base",
    "compute_average_loss": "keras_dist._losses",
    "scale_regularization_loss": "keras_dist._losses",
    "ReduceOp": "keras_dist._reduce",
    "simulate_cpu_devices": "keras_dist._simulate",
    "ReplicaContext": "keras_dist._context",
    "CentralStorageStrategy": "keras_dist.strategies._mirrored",
    "MirroredStrategy": "keras_dist.strategies._mirrored",
    "MultiWorkerMirroredStrategy": "keras_dist.strategies._multi_worker",
    "OneDeviceStrategy": "keras_dist.strategies._mirrored",
    "ParameterServerStrategy": "keras_dist.strategies._parameter_server",
    "Server": "keras_dist._server",
    "Strategy": "keras_dist.strategies._base",
    "StrategyExtended": "keras_dist.strategies._base",
    "TPUStrategy": "keras_dist.strategies._tpu",
    "experimental_set_strategy": "keras_dist.strategies._default",
    "get_replica_context": "keras_dist.strategies._default",
    "get_strategy": "keras_dist.strategies._default",
    "has_strategy": "keras_dist.strategies._default",
    "in_cross_replica_context": "keras_dist.strategies._default",
    "DistributedValues": "keras_dist._values",
    "Mirrored": "keras_dist._values",
    "PerReplica": "keras_dist._values",
}
_SUBPACKAGES = ("callbacks", "cluster_resolver", "coordinator", "experimental", "tpu")

__all__ = sorted([*_EXPORTS, *_SUBPACKAGES])

if TYPE_CHECKING:  # pragma: no cover - for type checkers and IDEs
    from keras_dist import callbacks, cluster_resolver, coordinator, experimental, tpu  # noqa: F401
    from keras_dist.strategies._parameter_server import ParameterServerStrategy  # noqa: F401
    from keras_dist._server import Server  # noqa: F401
    from keras_dist._communication import CommunicationImplementation, CommunicationOptions, PeerWorkerError  # noqa: F401
    from keras_dist._context import ReplicaContext  # noqa: F401
    from keras_dist._cross_device_ops import (  # noqa: F401
        CrossDeviceOps,
        HierarchicalCopyAllReduce,
        NcclAllReduce,
        ReductionToOneDevice,
    )
    from keras_dist._input import (  # noqa: F401
        DistributedDataset,
        DistributedIterator,
        InputContext,
        InputOptions,
        InputReplicationMode,
    )
    from keras_dist._losses import compute_average_loss, scale_regularization_loss  # noqa: F401
    from keras_dist._reduce import ReduceOp  # noqa: F401
    from keras_dist._simulate import simulate_cpu_devices  # noqa: F401
    from keras_dist.strategies._base import RunOptions, Strategy, StrategyExtended  # noqa: F401
    from keras_dist.strategies._default import (  # noqa: F401
        experimental_set_strategy,
        get_replica_context,
        get_strategy,
        has_strategy,
        in_cross_replica_context,
    )
    from keras_dist.strategies._mirrored import (  # noqa: F401
        CentralStorageStrategy,
        MirroredStrategy,
        OneDeviceStrategy,
    )
    from keras_dist.strategies._multi_worker import MultiWorkerMirroredStrategy  # noqa: F401
    from keras_dist.strategies._tpu import TPUStrategy  # noqa: F401
    from keras_dist._values import DistributedValues, Mirrored, PerReplica  # noqa: F401


def _install_hooks() -> None:
    from keras_dist import _hooks

    _hooks.install()


def __getattr__(name: str) -> Any:
    if name in _SUBPACKAGES:
        if name in ("callbacks", "coordinator"):
            _install_hooks()
        return importlib.import_module(f"keras_dist.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'keras_dist' has no attribute {name!r}")
    _install_hooks()
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later lookups skip this function
    return value


def __dir__() -> list:
    return sorted({*globals(), *__all__})
