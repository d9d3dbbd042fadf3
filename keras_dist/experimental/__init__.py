"""`keras_dist.experimental`: tf.distribute.experimental's spellings.

tf moved several strategies out of `tf.distribute.experimental` over the
years and accepts both places; so does keras_dist. Each name here is the
same object as the top-level one.

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
    "TPUStrategy",
)

__all__ = list(_NAMES)


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'keras_dist.experimental' has no attribute {name!r}")
    import keras_dist

    value = getattr(keras_dist, name)
    globals()[name] = value
    return value


def __dir__() -> list:
    return sorted({*globals(), *__all__})
