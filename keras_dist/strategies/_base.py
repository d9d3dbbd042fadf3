"""`Strategy`, `StrategyExtended` and `RunOptions`: what every strategy is (backend-agnostic).

A strategy owns a list of devices (in its `StrategyExtended`); the backend
adapter turns them into the backend's engine (a `jax.sharding.Mesh` with a
Keras distribution, or a `tf.distribute` strategy) lazily, on first use,
chosen by the extended's `engine_kind`. Adding a strategy: a module in this
package with a `Strategy` subclass (and, if it needs facts of its own, a
`StrategyExtended` subclass) naming its `EngineKind`; where that kind is new,
one entry in each backend adapter's table of engines.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

import keras

from keras_dist import _context, _devices
from keras_dist import _heartbeat as heartbeat
from keras_dist._engine_kind import EngineKind
from keras_dist._reduce import ReduceOp
from keras_dist.backends import get_adapter
from keras_dist.strategies._arguments import (
    _check_axis,
    _check_gather_shapes,
    _check_host_input_options,
    _check_per_replica_arguments,
    _input_options,
    _natively,
    _steps_of_replica_batches,
    _trains_as,
)


def _refuse_keras_distribution(strategy) -> None:
    """Keras' own distribution (`keras.distribution.set_distribution`) and a
    keras_dist strategy would each distribute the same model: gradients
    reduced twice, variables laid out twice. One clear error, before
    anything is placed. (Inside a keras_dist scope the active distribution
    is keras_dist's own, on JAX.)"""
    if _context.current_strategy() is not None:
        return
    active = getattr(keras.distribution, "distribution", lambda: None)()
    if active is None:
        return
    raise ValueError(
        f"keras.distribution's {type(active).__name__} is active (keras.distribution.set_distribution) and "
        f"{type(strategy).__name__} would distribute the same model again: use one. Keep the keras_dist "
        "strategy and call keras.distribution.set_distribution(None) first, or train under Keras' "
        "distribution without a keras_dist strategy."
    )


class StrategyExtended:
    """Extra strategy facts, as in `tf.distribute.StrategyExtended`.

    Besides tf's public properties it holds what the backend adapter reads
    to build and use the strategy's engine (`engine`, `engine_devices`,
    `cross_device_ops`, `communication_options`), and the job's shape
    (`num_workers`, `worker_index`). `engine_kind` is the one fact about the
    strategy an adapter reads to choose the engine.

    ```python
    extended = keras_dist.MirroredStrategy().extended
    extended.num_workers, extended.worker_index  # (1, 0)
    extended.should_checkpoint  # True
    ```
    """

    #: The kind of engine this strategy needs (each subclass names its own).
    engine_kind: EngineKind = EngineKind.LOCAL

    def __init__(
        self,
        strategy: "Strategy",
        devices: Sequence[str],
        cross_device_ops: Any = None,
        engine_devices: Optional[Sequence[str]] = None,
    ):
        self._strategy = strategy
        self._devices = tuple(devices)
        self._cross_device_ops = cross_device_ops
        self._engine_devices = tuple(engine_devices or devices)
        self._engine = None

    @property
    def worker_devices(self) -> tuple[str, ...]:
        """This worker's devices that run replicas, in replica order."""
        return self._devices

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """Devices that hold a copy of each variable."""
        return self._devices

    @property
    def cluster_resolver(self) -> Any:
        """The cluster resolver the strategy was made from, or None."""
        return None

    @property
    def should_checkpoint(self) -> bool:
        """Whether this process should write checkpoints (the chief)."""
        return True

    @property
    def should_save_summary(self) -> bool:
        """Whether this process should write summaries (the chief)."""
        return True

    def variable_created_in_scope(self, variable) -> bool:
        """True when `variable` is placed by this strategy."""
        return get_adapter().owns_variable(self.engine, variable)

    # -- tf.distribute.StrategyExtended's cross-replica methods --------------
    def reduce_to(self, reduce_op, value, destinations, options: Any = None):
        """Combines per-replica `value` across replicas for `destinations`
        (a device of this strategy, a variable or a distributed value). The
        result is available on every replica's device, which includes any
        destination (tf places it on the destinations only)."""
        from keras_dist._communication import call_options

        self._check_destinations("reduce_to", destinations)
        call_options(self._strategy, options, "strategy.extended.reduce_to")
        return self._strategy.reduce(reduce_op, value, axis=None)

    def batch_reduce_to(self, reduce_op, value_destination_pairs, options: Any = None):
        """`reduce_to` of every (value, destinations) pair, in order."""
        return [self.reduce_to(reduce_op, value, destinations, options) for value, destinations in value_destination_pairs]

    def update(self, var, fn: Callable, args: tuple = (), kwargs: Optional[dict] = None, group: bool = True):
        """Runs `fn(var, *args, **kwargs)` to update `var` in cross-replica
        context (inside `merge_call`, or outside `run`); with `group=False`
        the result comes back as per-replica components.

        ```python
        strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
        with strategy.scope():
            v = keras.Variable(1.0)
        strategy.extended.update(v, lambda var, x: var.assign_add(x), args=(2.0,))
        ```
        """
        if not isinstance(group, bool):
            raise TypeError(f"strategy.extended.update: group must be True or False, got {group!r}.")
        if _context.replica_context() is not None:
            raise RuntimeError(
                "strategy.extended.update is called in cross-replica context; "
                "inside strategy.run, call it from "
                "keras_dist.get_replica_context().merge_call(merge_fn)."
            )
        with self._strategy.scope():
            result = fn(var, *tuple(args), **dict(kwargs or {}))
        return result if group else self._strategy.experimental_local_results(result)

    def value_container(self, value):
        """The container of `value`: a Keras variable is its own container
        on both backends (there are no per-device component variables to
        map back), and any other value is returned as it is."""
        return value

    def colocate_vars_with(self, colocate_with_variable):
        """Variables created inside are placed with `colocate_with_variable`.

        Every keras_dist strategy places a variable by kind alone (a copy on
        each replica's device, or all on the parameter device), so any two
        of its variables are already colocated: this checks the variable
        belongs to the strategy and changes nothing else.
        """
        if not self.variable_created_in_scope(colocate_with_variable):
            raise ValueError(
                f"colocate_vars_with({colocate_with_variable!r}): the variable was not "
                f"created under {self._strategy!r}; pass one of its variables."
            )
        return contextlib.nullcontext()

    def call_for_each_replica(self, fn, args=(), kwargs=None):
        """tf.compat.v1's `extended.call_for_each_replica` (TF2's strategies
        keep it): `fn` on every replica, as `strategy.run(fn, args, kwargs)`."""
        return self._strategy.run(fn, args=args, kwargs=kwargs)

    def broadcast_to(self, tensor, destinations):
        """`tensor`, the same on every replica (a mirrored value)."""
        self._check_destinations("broadcast_to", destinations)
        return self._strategy.run(lambda value: value, args=(tensor,))

    @property
    def experimental_enable_get_next_as_optional(self) -> bool:
        """True: distributed iterators end cleanly on a partial or uneven
        last batch (every replica gets its rows, some none)."""
        return True

    @experimental_enable_get_next_as_optional.setter
    def experimental_enable_get_next_as_optional(self, value: bool) -> None:
        # tf-keras's tests set it True for partial batches: what keras_dist
        # always does. False (tf: assume every batch is full) would be ignored.
        if value is not True:
            raise ValueError(
                f"experimental_enable_get_next_as_optional={value!r}: keras_dist's distributed iterators always end "
                "cleanly on a partial or uneven last batch (True, the only setting). For full batches only, batch "
                "the dataset with drop_remainder=True."
            )

    @property
    def experimental_require_static_shapes(self) -> bool:
        """Whether the strategy needs static shapes (TPUStrategy, as in tf)."""
        return self.engine_kind is EngineKind.TPU

    def _check_destinations(self, method: str, destinations) -> None:
        if isinstance(destinations, str):
            try:
                device = _devices.canonical_device(destinations)
            except ValueError:
                device = destinations
            if device not in set(self._engine_devices) | set(self._devices):
                raise ValueError(
                    f"strategy.extended.{method}: destination {destinations!r} is not a "
                    f"device of {self._strategy!r} (its devices: {list(self._devices)})."
                )
            return
        if destinations is None:
            raise ValueError(f"strategy.extended.{method}: destinations is required (a device, variable or value).")

    # -- what the backend adapter reads -------------------------------------
    @property
    def engine(self) -> Any:
        """The backend's engine for this strategy, created on first use
        (JAX: a mesh and Keras distribution; TF: a tf.distribute strategy)."""
        if self._engine is None:
            self._engine = get_adapter().create_engine(self)
        return self._engine

    @property
    def engine_if_made(self) -> Any:
        """The engine if it was created, else None (creates nothing)."""
        return self._engine

    @property
    def container_strategy(self) -> "Strategy":
        """The strategy this belongs to (tf: `_container_strategy()`)."""
        return self._strategy

    @property
    def engine_devices(self) -> tuple[str, ...]:
        """Every device the engine spans: all workers' for multi-worker."""
        return self._engine_devices

    @property
    def cross_device_ops(self) -> Any:
        """The `keras_dist.CrossDeviceOps` asked for, or None (the engine's)."""
        return self._cross_device_ops

    @property
    def communication_options(self) -> Any:
        """Cross-worker `CommunicationOptions`; None for one worker."""
        return None

    @property
    def num_workers(self) -> int:
        """The number of worker processes in the job."""
        return 1

    @property
    def worker_index(self) -> int:
        """This process's index among the workers (the chief is 0)."""
        return 0


class Strategy:
    """Base class: a way to run a Keras model on several devices.

    Create models, optimizers and metrics under `scope()`; `fit`,
    `evaluate` and `predict` then run distributed, inside the scope or not.

    ```python
    strategy = keras_dist.MirroredStrategy()
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    model.fit(x, y, batch_size=64, verbose=0)   # 64 = the global batch
    ```
    """

    def __init__(self, extended: StrategyExtended):
        self._extended = extended

    # -- public API ---------------------------------------------------------
    @property
    def extended(self) -> StrategyExtended:
        return self._extended

    @property
    def num_replicas_in_sync(self) -> int:
        """Number of replicas that each global batch is split across."""
        return len(self._extended.engine_devices)

    @contextlib.contextmanager
    def scope(self) -> Iterator["Strategy"]:
        """Variables created here are placed by this strategy.

        Entering a different strategy's scope inside this one is an error.
        """
        _refuse_keras_distribution(self)
        engine = self._extended.engine
        _context.push(self)
        try:
            with get_adapter().scope(engine):
                yield self
        finally:
            _context.pop(self)

    # -- custom training loops ----------------------------------------------
    def run(self, fn: Callable, args: tuple = (), kwargs: Optional[dict] = None, options: Any = None):
        """Runs `fn` on every replica; returns per-replica or mirrored results.

        Arguments that are per-replica values (from a distributed dataset)
        give each replica its own component; other arguments go to every
        replica as they are. A result equal on all replicas comes back as an
        ordinary value; others come back as `PerReplica`.

        ```python
        strategy = keras_dist.MirroredStrategy()
        dataset = [(x[:64], y[:64])]
        for batch in strategy.experimental_distribute_dataset(dataset):
            per_replica_rows = strategy.run(lambda x, y: keras.ops.sum(y), args=batch)
            total = strategy.reduce("SUM", per_replica_rows, axis=None)
        ```

        On JAX `fn` is compiled once per function object and argument
        shapes; Keras variables it reads are read afresh at every call, and
        variables it writes (`assign`, `assign_add`, a metric's
        `update_state`) follow tf.distribute's replica-context rules (see
        guides/porting_from_tf_distribute.md). `options` is a
        `keras_dist.RunOptions`; a field keras_dist cannot honour raises.
        """
        if not callable(fn):
            raise TypeError(f"strategy.run needs a callable, got {fn!r}.")
        if _context.replica_context() is not None:
            raise RuntimeError(
                "strategy.run requires cross-replica context, but it was called "
                "inside another strategy.run (replica context), as in tf. Call the "
                "function directly there (it already runs on every replica), or "
                "leave the replica function with get_replica_context().merge_call(fn)."
            )
        _check_run_options(options)
        if not isinstance(args, (tuple, list)):
            raise TypeError(
                "strategy.run(fn, args=...) takes a tuple of arguments, got "
                f"{type(args).__name__}; for one argument write args=(value,)."
            )
        if kwargs is not None and not isinstance(kwargs, collections.abc.Mapping):
            raise TypeError(
                "strategy.run(fn, kwargs=...) takes a dict of keyword arguments, got "
                f"{type(kwargs).__name__}; positional arguments go in args=(...)."
            )
        _check_per_replica_arguments(self, (args, dict(kwargs or {})))
        heartbeat.beat()
        with self.scope():
            return get_adapter().run(self, self._extended.engine, fn, tuple(args), dict(kwargs or {}))

    def reduce(self, reduce_op, value, axis: Optional[int] = None):
        """Combines a per-replica `value` across replicas (cross-replica).

        With `axis`, each replica's value is first reduced along `axis`; MEAN
        then divides by the total number of elements along it.
        """
        reduce_op = ReduceOp.from_value(reduce_op)
        if axis is not None:
            _check_axis("reduce", axis, self.experimental_local_results(value))
        return get_adapter().reduce(self._extended.engine, reduce_op, value, axis)

    def gather(self, value, axis: int):
        """Concatenates the per-replica components of `value` along `axis`."""
        components = self.experimental_local_results(value)
        _check_axis("gather", axis, components)
        _check_gather_shapes(self, value, axis, components)
        return get_adapter().gather(self._extended.engine, value, axis)

    def experimental_local_results(self, value) -> tuple:
        """The per-replica components of `value` held by this process."""
        return get_adapter().local_results(self._extended.engine, value)

    def experimental_place_state(self, state):
        """`state` (the variables' values, as a JAX custom loop carries them
        from step to step) placed as `run` returns values equal on every
        replica, so that a `jax.jit` over `run` fed its own returned state
        compiles once. Only `CentralStorageStrategy` on JAX moves anything
        (its variables live on the parameter device; the state `run`
        returns, on the compute devices). Elsewhere, the values as they are.

        ```python
        strategy = keras_dist.CentralStorageStrategy()
        with strategy.scope():
            model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1)])
        state = strategy.experimental_place_state([v.value for v in model.trainable_variables])
        len(state)  # 2
        ```
        """
        return get_adapter().place_state(self._extended.engine, state)

    def experimental_distribute_dataset(self, dataset, options: Any = None):
        """Iterates `dataset`'s global batches as per-replica values.

        ```python
        strategy = keras_dist.MirroredStrategy()
        dataset = [(x[:64], y[:64]), (x[64:100], y[64:100])]
        for x_part, y_part in strategy.experimental_distribute_dataset(dataset):
            strategy.run(lambda a, b: keras.ops.sum(a), args=(x_part, y_part))
        ```
        """
        from keras_dist import _tf_data
        from keras_dist._input import (
            DistributedDataset,
            InputReplicationMode,
            OnePass,
            check_batched,
            check_dataset,
            check_same_rows,
            known_length,
        )
        from keras_dist._worker_batches import WorkerBatches

        options = _input_options("experimental_distribute_dataset", options)
        if options.experimental_replication_mode is not InputReplicationMode.PER_WORKER:
            raise ValueError(
                "InputReplicationMode.PER_REPLICA is only supported by "
                "strategy.distribute_datasets_from_function (as in tf): "
                "experimental_distribute_dataset splits one dataset of global batches."
            )
        check_dataset(dataset)
        check_batched(dataset, self.num_replicas_in_sync, what="experimental_distribute_dataset")
        engine = self._extended.engine
        adapter = get_adapter()
        extended = self._extended
        if _tf_data.reads_per_worker(dataset, extended.num_workers):
            # AutoShardPolicy FILE, OFF or HINT: each worker reads its own
            # stream; a step's global batch is every worker's rows
            _check_host_input_options("experimental_distribute_dataset", options)
            stream, empty, max_rows = _tf_data.worker_stream(
                dataset, extended.num_workers, extended.worker_index, self.num_replicas_in_sync
            )
            return DistributedDataset(
                lambda: WorkerBatches(adapter.iterate_batches(stream), empty, max_rows),
                lambda batch: adapter.split_global_batch(engine, batch),
                self._element_spec,
                options.experimental_per_replica_buffer_size,
            )._made_by(self, fit_source=dataset)
        native = _natively(adapter, engine, dataset, self._first_local_replica(), "global_batches", options)
        if native is not None:
            return _trains_as(native, self, lambda: dataset)
        _check_host_input_options("experimental_distribute_dataset", options)
        batches = lambda: adapter.iterate_batches(dataset)  # noqa: E731
        return DistributedDataset(
            OnePass(batches, dataset) if OnePass.needed(dataset) else batches,
            lambda batch: adapter.split_global_batch(engine, check_same_rows(batch)),
            self._element_spec,
            options.experimental_per_replica_buffer_size,
        )._made_by(self, count=lambda: known_length(dataset))

    def distribute_datasets_from_function(self, dataset_fn: Callable, options: Any = None):
        """Calls `dataset_fn(InputContext)`; its batches are per-replica.

        The dataset must be batched with the per-replica batch size,
        `context.get_per_replica_batch_size(global_batch_size)`.
        """
        from keras_dist._input import DistributedDatasetsFromFunction, InputContext, InputReplicationMode

        options = _input_options("distribute_datasets_from_function", options)
        if self._extended.num_workers > 1:
            return self._datasets_from_function_per_worker(dataset_fn, options)
        num = self.num_replicas_in_sync
        per_replica = options.experimental_replication_mode is InputReplicationMode.PER_REPLICA
        if per_replica:
            datasets = [dataset_fn(InputContext(num, replica, num)) for replica in range(num)]
        else:
            datasets = dataset_fn(InputContext(1, 0, num))
        engine = self._extended.engine
        adapter = get_adapter()
        native = _natively(
            adapter, engine, datasets, self._first_local_replica(), "per_replica_pipelines" if per_replica else "per_replica_batches", options
        )
        make_in_python = lambda: DistributedDatasetsFromFunction(  # noqa: E731
            lambda: adapter.iterate_batches(datasets),
            num,
            lambda batches: adapter.combine_replica_batches(engine, batches),
            self._element_spec,
            options.experimental_per_replica_buffer_size,
            [(lambda d=d: adapter.iterate_batches(d)) for d in datasets] if per_replica else None,
        )._made_by(self, count=lambda: _steps_of_replica_batches(datasets, num, per_replica))
        if native is not None:
            return _trains_as(native, self, make_in_python)
        _check_host_input_options("distribute_datasets_from_function", options)
        return make_in_python()

    def _datasets_from_function_per_worker(self, dataset_fn: Callable, options: Any):
        """`distribute_datasets_from_function` with several workers: each
        calls `dataset_fn` with its `InputContext` (`num_input_pipelines`
        workers, its `input_pipeline_id`) and reads its own pipeline of
        per-replica batches, one batch per local replica a step. A step's
        global batch is every worker's rows of that step (as with a
        per-worker tf.data stream in `experimental_distribute_dataset`),
        the job's data ending when no worker has a batch left; the engine's
        own distributed dataset where it has one (TensorFlow: tf's). For
        custom loops: `fit` refuses it (its input of global batches has
        other spellings)."""
        from keras_dist import _tf_data
        from keras_dist._input import DistributedDataset, InputContext, InputReplicationMode
        from keras_dist._worker_batches import WorkerBatches

        extended = self._extended
        if options.experimental_replication_mode is InputReplicationMode.PER_REPLICA:
            raise NotImplementedError(
                "distribute_datasets_from_function with InputReplicationMode.PER_REPLICA "
                "and several workers is not supported; use PER_WORKER (the default): "
                "dataset_fn is called once on each worker."
            )
        num = self.num_replicas_in_sync
        dataset = dataset_fn(InputContext(extended.num_workers, extended.worker_index, num))
        if _tf_data.auto_shard_policy(dataset) is None:
            raise NotImplementedError(
                "distribute_datasets_from_function with several workers takes a "
                f"tf.data.Dataset from dataset_fn (got {type(dataset).__name__}): "
                "a worker whose data has ended sends the others an empty batch of "
                "its element_spec. Return tf.data.Dataset.from_tensor_slices(...) "
                "batched to context.get_per_replica_batch_size(global_batch_size)."
            )
        stream, empty = _tf_data.replica_batches_stream(dataset, num // extended.num_workers)
        engine, adapter = extended.engine, get_adapter()

        def refused_by_fit():
            raise NotImplementedError(
                "fit/evaluate/predict do not take distribute_datasets_from_function's "
                "dataset in a job of several workers (custom loops over it do). Give "
                "them a tf.data dataset of global batches instead, the same on every "
                "worker, or with AutoShardPolicy.FILE/OFF each worker's own stream "
                "(guides/multi_worker.md)."
            )

        native = _natively(adapter, engine, dataset, self._first_local_replica(), "per_replica_batches", options)
        if native is not None:
            return _trains_as(native, self, refused_by_fit)
        _check_host_input_options("distribute_datasets_from_function", options)
        distributed = DistributedDataset(
            lambda: WorkerBatches(adapter.iterate_batches(stream), empty),
            lambda batch: adapter.split_global_batch(engine, batch),
            self._element_spec,
            options.experimental_per_replica_buffer_size,
        )
        return _trains_as(distributed, self, refused_by_fit)

    def _first_local_replica(self) -> int:
        """The replica index of this worker's first device."""
        return self._extended.worker_index * len(self._extended.worker_devices)

    def _element_spec(self, element):
        """A distributed element's structure: one `keras.KerasTensor` per
        array, shaped like one replica's component (batch dimension None)."""
        import keras

        def spec(value):
            component = self.experimental_local_results(value)[0]
            shape = tuple(getattr(component, "shape", ()))
            if shape:
                shape = (None,) + shape[1:]
            return keras.KerasTensor(shape, dtype=keras.backend.standardize_dtype(component.dtype))

        return keras.tree.map_structure(spec, element)

    def experimental_distribute_datasets_from_function(self, dataset_fn: Callable, options: Any = None):
        """Deprecated alias of `distribute_datasets_from_function` (as in tf)."""
        warnings.warn(
            "experimental_distribute_datasets_from_function is deprecated; use "
            "strategy.distribute_datasets_from_function.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.distribute_datasets_from_function(dataset_fn, options)

    def experimental_distribute_values_from_function(self, value_fn: Callable):
        """A per-replica value whose component on each replica is
        `value_fn(keras_dist.experimental.ValueContext)` for that replica.

        ```python
        strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
        values = strategy.experimental_distribute_values_from_function(
            lambda context: np.float32(context.replica_id_in_sync_group))
        total = strategy.reduce("SUM", strategy.run(lambda v: v * 2, args=(values,)), axis=None)
        ```
        """
        from keras_dist._input import ValueContext

        if not callable(value_fn):
            raise TypeError(f"experimental_distribute_values_from_function needs a callable, got {value_fn!r}.")
        if self._extended.num_workers > 1:
            raise NotImplementedError(
                "experimental_distribute_values_from_function with several "
                "workers is not supported yet; build the values with "
                "strategy.experimental_distribute_dataset from a global batch "
                "every worker holds."
            )
        num = self.num_replicas_in_sync
        values = [value_fn(ValueContext(replica, num)) for replica in range(num)]
        return get_adapter().distribute_values(self._extended.engine, values)

    def __repr__(self) -> str:
        devices = ", ".join(self._extended.worker_devices)
        return f"{type(self).__name__}(devices=[{devices}])"


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """Options of `Strategy.run` (tf.distribute.RunOptions' fields).

    All three are about TPUs in tf. `experimental_enable_dynamic_batch_size`
    is honoured either way (keras_dist compiles a program per input shape,
    so any batch size runs); the other two, which ask for TPU-specific
    compilation, raise unless left at their defaults.

    >>> keras_dist.RunOptions().experimental_enable_dynamic_batch_size
    True
    """

    experimental_enable_dynamic_batch_size: bool = True
    experimental_bucketizing_dynamic_shape: bool = False
    experimental_xla_options: Any = None


def _check_run_options(options: Any) -> None:
    if options is None:
        return
    if not isinstance(options, RunOptions):
        raise TypeError(f"strategy.run(options=...) takes a keras_dist.RunOptions, got {options!r}.")
    if options.experimental_bucketizing_dynamic_shape:
        raise NotImplementedError(
            "RunOptions(experimental_bucketizing_dynamic_shape=True) pads "
            "shapes into buckets for TPU compilation, which keras_dist does "
            "not do; leave it False (keras_dist compiles a program per shape)."
        )
    if options.experimental_xla_options is not None:
        raise NotImplementedError(
            "RunOptions(experimental_xla_options=...) is not carried out by "
            "keras_dist; leave it None (on JAX, XLA options come from the "
            "strategy's engine)."
        )
