"""The default strategy (no strategy: plain Keras, one replica) and the
module-level `get_strategy` & co."""

from __future__ import annotations

import contextlib
from typing import Iterator, Optional

from keras_dist import _context
from keras_dist._context import ReplicaContext
from keras_dist._reduce import ReduceOp
from keras_dist.backends import get_adapter
from keras_dist.strategies._arguments import _input_options, _natively
from keras_dist.strategies._base import Strategy, StrategyExtended, _check_run_options


class _DefaultStrategy(Strategy):
    """The pass-through strategy in effect outside any scope."""

    def __init__(self):
        super().__init__(_DefaultExtended(self, ("default",)))

    @contextlib.contextmanager
    def scope(self) -> Iterator["Strategy"]:
        yield self

    def run(self, fn, args=(), kwargs=None, options=None):
        _check_run_options(options)
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op, value, axis=None):
        reduce_op = ReduceOp.from_value(reduce_op)
        if axis is None:
            return value
        import keras

        if reduce_op is ReduceOp.SUM:
            return keras.ops.sum(value, axis=axis)
        return keras.ops.mean(value, axis=axis)

    def gather(self, value, axis):
        return value

    def experimental_local_results(self, value):
        return (value,)

    def experimental_distribute_dataset(self, dataset, options=None):
        # The batches as the backend takes them (numpy on JAX, tensors on
        # TensorFlow), so one loop serves every strategy.
        from keras_dist._input import DistributedDataset, OnePass, check_dataset, known_length

        options = _input_options("experimental_distribute_dataset", options)
        check_dataset(dataset)
        adapter = get_adapter()
        native = _natively(adapter, None, dataset, 0, "global_batches", options)
        if native is not None:
            return native
        batches = lambda: adapter.iterate_batches(dataset)  # noqa: E731
        # fit/evaluate/predict of a model made outside any scope take its
        # batches, as many as the source says (unknown, Keras' TensorFlow
        # trainer counts one more optimizer step per epoch)
        return DistributedDataset(
            OnePass(batches, dataset) if OnePass.needed(dataset) else batches,
            lambda b: b,
            buffer_size=options.experimental_per_replica_buffer_size,
        )._made_by(None, count=lambda: known_length(dataset))

    def distribute_datasets_from_function(self, dataset_fn, options=None):
        from keras_dist._input import InputContext

        return self.experimental_distribute_dataset(dataset_fn(InputContext()), options)

    def __repr__(self) -> str:
        return "DefaultStrategy()"


class _DefaultExtended(StrategyExtended):
    def variable_created_in_scope(self, variable) -> bool:
        return True


_DEFAULT_STRATEGY = _DefaultStrategy()


_DEFAULT_REPLICA_CONTEXT = ReplicaContext(_DEFAULT_STRATEGY, 0)


def get_strategy() -> Strategy:
    """The strategy whose scope is entered, else the default strategy.

    >>> keras_dist.get_strategy().num_replicas_in_sync
    1
    """
    return _context.current_strategy() or _DEFAULT_STRATEGY


def has_strategy() -> bool:
    """True inside the scope of a (non-default) strategy.

    ```python
    keras_dist.has_strategy()  # False
    with keras_dist.MirroredStrategy().scope():
        assert keras_dist.has_strategy()
    ```
    """
    return _context.current_strategy() is not None


def get_replica_context() -> Optional[ReplicaContext]:
    """The current replica context.

    The default context (replica 0 of 1) outside any scope; ``None`` in
    cross-replica context (inside a scope, outside `run`).

    ```python
    keras_dist.get_replica_context().replica_id_in_sync_group  # 0
    strategy = keras_dist.MirroredStrategy()
    with strategy.scope():
        assert keras_dist.get_replica_context() is None  # cross-replica context
        ids = strategy.run(lambda: keras_dist.get_replica_context().replica_id_in_sync_group)
    ```
    """
    context = _context.replica_context()
    if context is not None:
        return context
    if _context.current_strategy() is None:
        return _DEFAULT_REPLICA_CONTEXT
    return None


def in_cross_replica_context() -> bool:
    """True inside a strategy's scope but outside replica computation.

    ```python
    strategy = keras_dist.MirroredStrategy()
    with strategy.scope():
        assert keras_dist.in_cross_replica_context()
        inside = strategy.run(lambda: keras_dist.in_cross_replica_context())
    keras_dist.in_cross_replica_context()  # False
    ```
    """
    return (
        _context.current_strategy() is not None
        and _context.replica_context() is None
    )


def experimental_set_strategy(strategy: Optional[Strategy]) -> None:
    """Enters `strategy`'s scope until called again (``None`` leaves it).

    ```python
    strategy = keras_dist.MirroredStrategy()
    keras_dist.experimental_set_strategy(strategy)
    assert keras_dist.get_strategy() is strategy
    keras_dist.experimental_set_strategy(None)
    ```
    """
    _context.clear_persistent()
    if strategy is None or isinstance(strategy, _DefaultStrategy):
        return
    closer = contextlib.ExitStack()
    closer.enter_context(strategy.scope())
    _context.set_persistent(strategy, closer)
