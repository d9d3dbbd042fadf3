"""`ReplicaOps`: the collectives a `ReplicaContext` offers inside `run`.

Each backend implements them for its replica computation
(`backends/jax/_replica.py`, `backends/tensorflow/_replica.py`);
`LocalReplicaOps` serves the default context, a group of one replica.
"""

from __future__ import annotations

import abc
import contextlib
from typing import Any, ContextManager


class ReplicaOps(abc.ABC):
    """Collectives of one replica group (see `keras_dist.ReplicaContext`)."""

    #: True where the engine takes `CommunicationOptions` per `all_reduce`
    #: call; else a call's options may only repeat the strategy's.
    applies_call_options: bool = False

    @abc.abstractmethod
    def all_reduce(self, reduce_op: Any, value: Any, options: Any = None) -> Any:
        """Sum or mean (a `ReduceOp`) of `value`, a nest of tensors, over
        replicas; `options`: a checked `CommunicationOptions` or None."""

    @abc.abstractmethod
    def all_gather(self, value: Any, axis: int) -> Any:
        """Every replica's `value` concatenated along `axis`."""

    @abc.abstractmethod
    def row_mask(self, value: Any) -> Any:
        """Booleans marking the real rows of this replica's `value`, or None
        when every row is real (JAX pads uneven shards)."""

    @abc.abstractmethod
    def global_rows(self, local_rows: Any) -> Any:
        """The real row count of the global batch, from this replica's."""

    @abc.abstractmethod
    def merge_call(self, strategy: Any, merge_fn: Any, args: tuple, kwargs: dict) -> Any:
        """`merge_fn(strategy, *args, **kwargs)` once, in cross-replica
        context, with the replicas' `args` as per-replica values; its result
        given back to every replica (a per-replica result: each its own)."""

    @abc.abstractmethod
    def devices(self, strategy: Any) -> tuple:
        """The devices this replica runs on."""

    def loop_carry(self, value: Any) -> Any:
        """`value` (a nest) made fit to start a loop whose carry takes in
        this replica's data, such as an RNN's initial state. Where the engine
        types values by whether they vary across replicas (JAX's
        `shard_map`), a value equal on every replica is marked varying, as
        the loop's output carry is; elsewhere nothing needs doing."""
        return value

    def sync_on_read(self) -> ContextManager[None]:
        """A context in which reading a sync-on-read variable (every Keras
        metric's) gives its value over all replicas, by its aggregation,
        not this replica's own: tf's `variable_sync_on_read_context`, which
        tf-keras entered for `Metric.result()`. A group of one replica needs
        nothing."""
        return contextlib.nullcontext()


class LocalReplicaOps(ReplicaOps):
    """The collectives of a group of one replica: identities."""

    def all_reduce(self, reduce_op, value, options=None):
        return value

    def all_gather(self, value, axis):
        return value

    def row_mask(self, value):
        return None

    def global_rows(self, local_rows):
        return local_rows

    def merge_call(self, strategy, merge_fn, args, kwargs):
        return merge_fn(strategy, *args, **kwargs)

    def devices(self, strategy):
        from keras_dist.backends import get_adapter

        return tuple(get_adapter().visible_devices()[:1])
