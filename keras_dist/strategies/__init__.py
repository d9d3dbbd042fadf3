"""The strategies, one module per family (as tf's `distribute/`):

- `_base`: `Strategy`, `StrategyExtended` (with its `engine_kind`), `RunOptions`
- `_mirrored`: `OneDeviceStrategy`, `MirroredStrategy`, `CentralStorageStrategy`
- `_multi_worker`: `MultiWorkerMirroredStrategy`
- `_tpu`: `TPUStrategy`
- `_parameter_server`: `ParameterServerStrategy` (and `DatasetCreator`)
- `_default`: the default strategy, `get_strategy` & co.

Users reach them as `keras_dist.MirroredStrategy` and so on; this package
is the core's home for them (backend-agnostic: no engine import).
"""

from keras_dist.strategies._base import RunOptions, Strategy, StrategyExtended
from keras_dist.strategies._default import (
    experimental_set_strategy,
    get_replica_context,
    get_strategy,
    has_strategy,
    in_cross_replica_context,
)
from keras_dist.strategies._mirrored import CentralStorageStrategy, MirroredStrategy, OneDeviceStrategy
from keras_dist.strategies._multi_worker import MultiWorkerMirroredStrategy
from keras_dist.strategies._parameter_server import ParameterServerStrategy
from keras_dist.strategies._tpu import TPUStrategy

__all__ = [
    "CentralStorageStrategy",
    "MirroredStrategy",
    "MultiWorkerMirroredStrategy",
    "OneDeviceStrategy",
    "ParameterServerStrategy",
    "RunOptions",
    "Strategy",
    "StrategyExtended",
    "TPUStrategy",
    "experimental_set_strategy",
    "get_replica_context",
    "get_strategy",
    "has_strategy",
    "in_cross_replica_context",
]
