"""`keras_dist.experimental`: tf.distribute.experimental's spellings.

tf moved several strategies out of `tf.distribute.experimental` over the
years and accepts both places; so does keras_dist. Each name here is the
same object as the top-level one; names only tf.distribute.experimental
has (`ValueContext`) live here alone.

```python
import keras_dist
assert keras_dist.experimental.CentralStorageStrategy is keras_dist.CentralStorageStrategy
```
"""

from __future__ import annotations

from typing import Any

#: Names served here, each the top-level `keras_dist` name of the same spelling.
_NAMES = (
    "CentralStorageStrategy",
    "CommunicationImplementation",
    "CommunicationOptions",
    "MultiWorkerMirroredStrategy",
    "ParameterServerStrategy",
    "TPUStrategy",
)

#: tf's deprecated aliases -> the top-level name they are (the same object, as in tf).
_ALIASES = {
    "CollectiveCommunication": "CommunicationImplementation",
}

#: Names only tf.distribute.experimental has -> the module that defines them.
_OWN = {
    "CollectiveHints": "keras_dist._communication",
    "DatasetCreator": "keras_dist.strategies._parameter_server",
    "PreemptionCheckpointHandler": "keras_dist._preemption",
    "TerminationConfig": "keras_dist._preemption",
    "ValueContext": "keras_dist._input",
}

#: Submodules (tf.distribute.experimental.partitioners).
_SUBMODULES = ("partitioners",)

__all__ = sorted([*_NAMES, *_ALIASES, *_OWN, *_SUBMODULES])


def __getattr__(name: str) -> Any:
    import importlib

    import keras_dist

    if name in _SUBMODULES:
        value = importlib.import_module(f"keras_dist.experimental.{name}")
    elif name in _NAMES or name in _ALIASES:
        value = getattr(keras_dist, _ALIASES.get(name, name))
    elif name in _OWN:
        keras_dist._install_hooks()
        value = getattr(importlib.import_module(_OWN[name]), name)
    else:
        raise AttributeError(f"module 'keras_dist.experimental' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *__all__})
