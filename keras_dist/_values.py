"""Distributed values: one logical value with a component per replica."""

from __future__ import annotations

import abc
from typing import Any, Sequence


class DistributedValues(abc.ABC):
    """Base class of values that hold one component per replica.

    ``.values`` is the tuple of components, in replica order. Backends keep
    their own representation (a `tf.distribute` value on TensorFlow, one
    sharded `jax.Array` on JAX); both are instances of these classes.

    ```python
    value = keras_dist.PerReplica([1.0, 2.0])
    isinstance(value, keras_dist.DistributedValues)  # True
    value.values  # (1.0, 2.0)
    ```
    """

    @property
    @abc.abstractmethod
    def values(self) -> tuple:
        """The per-replica components, in replica order."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({list(self.values)!r})"


class PerReplica(DistributedValues):
    """A value that may differ on each replica (inputs, per-replica losses).

    >>> PerReplica([1.0, 2.0]).values
    (1.0, 2.0)
    """

    def __init__(self, values: Sequence[Any]):
        self._values = tuple(values)

    @property
    def values(self) -> tuple:
        return self._values


class Mirrored(DistributedValues):
    """A value that is the same on every replica (e.g. model weights).

    ```python
    weights = keras_dist.Mirrored([0.5, 0.5])
    weights.values  # (0.5, 0.5)
    ```
    """

    def __init__(self, values: Sequence[Any]):
        self._values = tuple(values)

    @property
    def values(self) -> tuple:
        return self._values


def differs_across_replicas_message(name: str, aggregation: str, tf_variable_class: str) -> str:
    """The error for a variable with no aggregation written inside
    `strategy.run` with values that differ across replicas (both backends;
    `tf_variable_class` names the class tf's own message names)."""
    return (
        f"Variable {name!r} is updated inside strategy.run with a "
        "value that differs across replicas, but its aggregation is "
        f"{aggregation!r}, so there is no one value to give it (tf.distribute: "
        "'You must specify an aggregation method to update a "
        f"{tf_variable_class} in Replica Context'). Create it with "
        "aggregation='sum', 'mean' or 'only_first_replica' (e.g. "
        "keras.Variable(0.0, aggregation='sum')), or update it outside "
        "strategy.run from the reduced value."
    )


def uneven_gather_message(axis: int, shapes: list) -> str | None:
    """The error for gathering per-replica values whose shapes differ other
    than along `axis` (tf.distribute requires them equal there), or None
    when they may be concatenated. `shapes`: (who, shape, dtype) a replica."""
    ranks = {len(shape) for _, shape, _ in shapes}
    if len(ranks) == 1:
        rank = ranks.pop()
        axis = axis % rank if rank else 0
        if len({(tuple(shape[:axis]) + tuple(shape[axis + 1 :]), _dtype_name(dtype)) for _, shape, dtype in shapes}) == 1:
            return None
    listing = ", ".join(f"{who}: {tuple(shape)} {_dtype_name(dtype)}" for who, shape, dtype in shapes)
    return (
        f"Cannot gather along axis {axis}: the replicas' values must have the same dtype and rank and the same "
        f"size on every other axis, as tf.distribute requires ({listing}). Gather along the axis where they "
        "differ, or pad them to one shape inside strategy.run."
    )


def _dtype_name(dtype) -> str:
    """'float32' for NumPy's, TensorFlow's, JAX's and torch's float32."""
    return getattr(dtype, "name", None) or str(dtype).replace("torch.", "")
