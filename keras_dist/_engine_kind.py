"""`EngineKind`: the one fact about a strategy that a backend adapter reads.

Each `StrategyExtended` names the kind of engine it needs; each adapter
keeps one table from kind to the function that builds that engine
(`create_engine`), and never looks at strategy classes. Adding a strategy
is one module in the core plus, where its engine is new, one entry in each
adapter's table.

```python
from keras_dist._engine_kind import EngineKind

strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
assert strategy.extended.engine_kind is EngineKind.LOCAL
```
"""

from __future__ import annotations

import enum


class EngineKind(str, enum.Enum):
    """What a strategy needs from the backend's engine."""

    #: Replicas on this process's devices, each holding every variable
    #: (MirroredStrategy, the default strategy).
    LOCAL = "local"
    #: One replica on one device, its variables the backend's plain ones
    #: (OneDeviceStrategy: on TensorFlow, `tf.GradientTape` reads them in
    #: cross-replica context, as under tf's OneDeviceStrategy).
    ONE_DEVICE = "one_device"
    #: Replicas on this process's devices, every variable once on
    #: `extended.parameter_devices[0]` (CentralStorageStrategy).
    CENTRAL_STORAGE = "central_storage"
    #: Replicas on every device of every worker process, synchronous
    #: (MultiWorkerMirroredStrategy; one worker is LOCAL's engine).
    MULTI_WORKER = "multi_worker"
    #: MULTI_WORKER's replicas, with `steps_per_execution` batches run in one
    #: on-device loop where the backend can (TPUStrategy).
    TPU = "tpu"
    #: Asynchronous workers, variables on parameter servers
    #: (ParameterServerStrategy; an optional capability of an adapter).
    PARAMETER_SERVER = "parameter_server"


def engine_builder(table: dict, kind, backend: str):
    """`table[kind]`: the adapter's function that builds an engine of `kind`,
    or one error naming the table to extend (a strategy whose kind this
    backend's adapter has no entry for)."""
    try:
        return table[kind]
    except (KeyError, TypeError):
        raise NotImplementedError(
            f"The {backend} backend has no engine of kind {kind!r}: a strategy of a new kind needs "
            f"one entry in `_ENGINES` of keras_dist/backends/{backend}/_engine.py (see "
            "keras_dist/ARCHITECTURE.md, 'Adding a strategy')."
        ) from None
