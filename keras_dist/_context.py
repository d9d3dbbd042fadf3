"""Strategy stack and replica context (backend-agnostic).

The strategy stack is process-wide (replica threads of a TensorFlow
MirroredStrategy must see it); the replica context is per thread. Only the
functions below change either; `keras_dist.strategies` builds the public API
on them.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, ContextManager, Iterator, Optional

from keras_dist._reduce import ReduceOp
from keras_dist._replica_ops import LocalReplicaOps, ReplicaOps

_stack: list = []
#: The scope entered by `experimental_set_strategy`, with what closes it.
_persistent: list[tuple[Any, contextlib.ExitStack]] = []
_local = threading.local()


class ReplicaContext:
    """Where a computation runs: replica `replica_id_in_sync_group` of a group.

    Outside any strategy, `keras_dist.get_replica_context()` returns the
    default context: replica 0 of 1. Inside `strategy.run`, it offers the
    collectives of the replica group:

    ```python
    strategy = keras_dist.MirroredStrategy()

    def step(x):
        context = keras_dist.get_replica_context()
        return context.all_reduce("SUM", keras.ops.sum(x))  # every replica's rows

    for batch in strategy.experimental_distribute_dataset([x[:64]]):
        total = strategy.run(step, args=(batch,))  # the same on every replica
    ```
    """

    def __init__(self, strategy: Any, replica_id_in_sync_group: Any, ops: Optional[ReplicaOps] = None):
        self._strategy = strategy
        self._replica_id = replica_id_in_sync_group
        self._ops = ops or LocalReplicaOps()

    def all_reduce(self, reduce_op, value, options=None):
        """Sum or mean of `value` (a tensor or nest of them) over replicas.

        `options`: a `CommunicationOptions` for this call. TensorFlow applies
        them per call (tf's own `all_reduce`); on JAX the step's collectives
        are compiled together, so they may only repeat the strategy's
        (defaults count as no request), else `NotImplementedError`.
        """
        from keras_dist._communication import call_options

        op = ReduceOp.from_value(reduce_op)
        options = call_options(self._strategy, options, "ReplicaContext.all_reduce", self._ops.applies_call_options)
        return self._ops.all_reduce(op, value, options)

    def all_gather(self, value, axis: int):
        """Concatenation of every replica's `value` along `axis`."""
        return self._ops.all_gather(value, axis)

    def row_mask(self, value):
        """Which rows of this replica's batch-shaped `value` are real.

        None when all are (TensorFlow, even shards); on JAX uneven shards are
        padded to equal length and this marks the padding False. (A
        keras_dist addition; `compute_average_loss` uses it.)
        """
        return self._ops.row_mask(value)

    def _loop_carry(self, value):
        """`value` as the start of a loop over this replica's data (see
        `ReplicaOps.loop_carry`; used by the RNN hook)."""
        return self._ops.loop_carry(value)

    def _sync_on_read(self) -> ContextManager[None]:
        """Reads of sync-on-read variables (metrics') inside give the value
        over all replicas (see `ReplicaOps.sync_on_read`; used by the
        `Metric.result` hook)."""
        return self._ops.sync_on_read()

    def global_rows(self, local_rows):
        """The number of real rows in the global batch, given this
        replica's `local_rows` (a keras_dist addition)."""
        return self._ops.global_rows(local_rows)

    def merge_call(self, merge_fn, args=(), kwargs=None):
        """Runs `merge_fn(strategy, *args, **kwargs)` once, in cross-replica
        context, with every replica's `args` gathered into per-replica
        values; returns its result to each replica (tf.distribute's
        `merge_call`: the place for `strategy.extended.update` and
        `strategy.reduce` from inside `run`).

        ```python
        def replica_fn(x):
            def merge_fn(strategy, value):
                return strategy.reduce("SUM", value, axis=None)
            return keras_dist.get_replica_context().merge_call(merge_fn, args=(x,))
        ```
        """
        return self._ops.merge_call(self._strategy, merge_fn, tuple(args), dict(kwargs or {}))

    @property
    def devices(self) -> tuple:
        """The devices this replica runs on (tf.distribute's
        `ReplicaContext.devices`). On JAX, where one program serves every
        replica, this raises: use `replica_id_in_sync_group` and
        `strategy.extended.worker_devices`."""
        return self._ops.devices(self._strategy)

    @property
    def strategy(self):
        return self._strategy

    @property
    def replica_id_in_sync_group(self):
        return self._replica_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._strategy.num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ReplicaContext(replica_id_in_sync_group={self._replica_id!r}, "
            f"num_replicas_in_sync={self.num_replicas_in_sync})"
        )


# -- the strategy stack ------------------------------------------------------


#: The attribute of a Keras model that holds the strategy it was created
#: under (set by the model-creation hook; read by the callbacks and steps).
_MODEL_STRATEGY_ATTR = "_keras_dist_strategy"


def model_strategy(model):
    """The keras_dist strategy a model was created under, or None."""
    return model.__dict__.get(_MODEL_STRATEGY_ATTR)


def remember_strategy(model, strategy) -> None:
    """Marks `model` as created under `strategy` (see `model_strategy`)."""
    object.__setattr__(model, _MODEL_STRATEGY_ATTR, strategy)


def current_strategy():
    """The innermost strategy whose scope is entered, or None."""
    return _stack[-1] if _stack else None


def open_scopes() -> list:
    """The strategies whose scopes are entered, outermost first."""
    return list(_stack)


def push(strategy) -> None:
    top = current_strategy()
    if top is not None and top is not strategy:
        raise ValueError(
            f"Cannot enter the scope of {strategy!r} inside the scope of "
            f"{top!r}: a model lives under exactly one strategy. Exit the "
            "first scope before entering another, or use the same strategy."
        )
    _stack.append(strategy)


def pop(strategy) -> None:
    if not _stack or _stack[-1] is not strategy:
        raise RuntimeError("keras_dist strategy scopes were exited out of order.")
    _stack.pop()


def set_persistent(strategy, closer: contextlib.ExitStack) -> None:
    """Records the scope `experimental_set_strategy` entered (and its closer)."""
    _persistent.append((strategy, closer))


def clear_persistent() -> None:
    """Exits the scope entered by `experimental_set_strategy`, if any."""
    while _persistent:
        _, closer = _persistent.pop()
        closer.close()


def reset() -> None:
    """Leaves every scope (for test isolation after a failed test)."""
    clear_persistent()
    _stack.clear()


@contextlib.contextmanager
def outside_strategies() -> Iterator[None]:
    """No strategy scope is entered while inside (process-wide).

    For keras_dist's own code that must build plain Keras objects while a
    scope is open (the one-replica reference of `ScalingReport`, built in
    a fresh thread during `fit`).
    """
    saved = list(_stack)
    _stack.clear()
    try:
        yield
    finally:
        _stack[:] = saved


# -- the replica context -------------------------------------------------------


def replica_context() -> Optional[ReplicaContext]:
    """The replica context set by `Strategy.run` on this thread, or None."""
    return getattr(_local, "replica_context", None)


def cross_replica() -> ContextManager[None]:
    """Cross-replica context while inside (`ReplicaContext.merge_call`)."""
    return in_replica(None)


@contextlib.contextmanager
def in_replica(context: Optional[ReplicaContext]) -> Iterator[None]:
    previous = getattr(_local, "replica_context", None)
    _local.replica_context = context
    try:
        yield
    finally:
        _local.replica_context = previous


@contextlib.contextmanager
def writing_own_path() -> Iterator[None]:
    """`Model.save`/`save_weights` write at the path given, on a non-chief
    worker too (the `_hooks._files` hook asks `writing_own_path_now()`): for
    keras_dist's own writes to a worker's private directory (the preemption
    handler's checkpoints), never a path the job shares."""
    previous = getattr(_local, "own_path", False)
    _local.own_path = True
    try:
        yield
    finally:
        _local.own_path = previous


def writing_own_path_now() -> bool:
    return getattr(_local, "own_path", False)
