"""keras_dist: tf.distribute-style distributed training for Keras 3.

```python
import keras_dist
strategy = keras_dist.MirroredStrategy()       # all local devices
with strategy.scope():
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
    model.compile(optimizer="adam", loss="mse")
model.fit(x, y, batch_size=64, verbose=0)      # 64 = global batch
```
"""

from keras_dist import _hooks, callbacks, cluster_resolver
from keras_dist._communication import (
    CommunicationImplementation,
    CommunicationOptions,
    PeerWorkerError,
)
from keras_dist._cross_device_ops import (
    CrossDeviceOps,
    HierarchicalCopyAllReduce,
    NcclAllReduce,
    ReductionToOneDevice,
)
from keras_dist._input import InputContext, InputOptions
from keras_dist._losses import compute_average_loss, scale_regularization_loss
from keras_dist._reduce import ReduceOp
from keras_dist._simulate import simulate_cpu_devices
from keras_dist._context import ReplicaContext
from keras_dist._strategy import (
    MirroredStrategy,
    MultiWorkerMirroredStrategy,
    OneDeviceStrategy,
    Strategy,
    StrategyExtended,
    experimental_set_strategy,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from keras_dist._values import DistributedValues, Mirrored, PerReplica

__version__ = "0.1.0"

__all__ = [
    "CommunicationImplementation",
    "CommunicationOptions",
    "CrossDeviceOps",
    "HierarchicalCopyAllReduce",
    "MultiWorkerMirroredStrategy",
    "DistributedValues",
    "InputContext",
    "InputOptions",
    "Mirrored",
    "MirroredStrategy",
    "NcclAllReduce",
    "OneDeviceStrategy",
    "PeerWorkerError",
    "PerReplica",
    "ReduceOp",
    "ReductionToOneDevice",
    "ReplicaContext",
    "Strategy",
    "StrategyExtended",
    "callbacks",
    "cluster_resolver",
    "compute_average_loss",
    "experimental_set_strategy",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
    "scale_regularization_loss",
    "simulate_cpu_devices",
]

_hooks.install()
