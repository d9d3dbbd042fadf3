"""`Strategy` and its concrete kinds (backend-agnostic).

A strategy owns a list of devices (in its `StrategyExtended`); the backend
adapter turns them into the backend's engine (a `jax.sharding.Mesh` with a
Keras distribution, or a `tf.distribute` strategy) lazily, on first use.
Adding a strategy: a subclass here (and, if it needs facts of its own, of
`StrategyExtended`) naming its `EngineKind`; where that kind is new, one
entry in each backend adapter's table of engines.
"""

from __future__ import annotations

import collections.abc
import contextlib
import dataclasses
import logging
import warnings
from typing import Any, Callable, Iterator, Optional, Sequence

from keras_dist import _context, _cross_device_ops, _devices, _foreign
from keras_dist import _heartbeat as heartbeat
from keras_dist._context import ReplicaContext
from keras_dist._engine_kind import EngineKind
from keras_dist._reduce import ReduceOp
from keras_dist.backends import get_adapter
from keras_dist.cluster_resolver._validate import check_cluster_to_join


class StrategyExtended:
    """Extra strategy facts, as in `tf.distribute.StrategyExtended`.

    Besides tf's public properties it holds what the backend adapter reads
    to build and use the strategy's engine (`engine`, `engine_devices`,
    `cross_device_ops`, `communication_options`), and the job's shape
    (`num_workers`, `worker_index`). `engine_kind` is the one fact about the
    strategy an adapter reads to choose the engine.
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

    def broadcast_to(self, tensor, destinations):
        """`tensor`, the same on every replica (a mirrored value)."""
        self._check_destinations("broadcast_to", destinations)
        return self._strategy.run(lambda value: value, args=(tensor,))

    @property
    def experimental_enable_get_next_as_optional(self) -> bool:
        """True: distributed iterators end cleanly on a partial or uneven
        last batch (every replica gets its rows, some none)."""
        return True

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
        _check_axis("gather", axis, self.experimental_local_results(value))
        return get_adapter().gather(self._extended.engine, value, axis)

    def experimental_local_results(self, value) -> tuple:
        """The per-replica components of `value` held by this process."""
        return get_adapter().local_results(self._extended.engine, value)

    def experimental_distribute_dataset(self, dataset, options: Any = None):
        """Iterates `dataset`'s global batches as per-replica values.

        ```python
        strategy = keras_dist.MirroredStrategy()
        dataset = [(x[:64], y[:64]), (x[64:100], y[64:100])]
        for x_part, y_part in strategy.experimental_distribute_dataset(dataset):
            strategy.run(lambda a, b: keras.ops.sum(a), args=(x_part, y_part))
        ```
        """
        from keras_dist._input import (
            DistributedDataset,
            InputReplicationMode,
            OnePass,
            WorkerBatches,
            check_batched,
            check_dataset,
            check_same_rows,
            known_length,
        )
        from keras_dist import _tf_data

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
            raise NotImplementedError(
                "distribute_datasets_from_function with several workers (each "
                "worker building its own replicas' input) is not supported yet. "
                "Pass every worker the same dataset of global batches to "
                "strategy.experimental_distribute_dataset: each worker keeps "
                "its replicas' rows, exactly as one device would see them."
            )
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


def _check_per_replica_arguments(strategy: Any, arguments: Any) -> None:
    """Refuses a `PerReplica` argument whose number of values is not the
    replica count (replicas would get no value, or values would be
    dropped): a PerReplica of values holds this worker's replicas'; one of
    the engine's that says how many it spans (JAX's global arrays), all of
    them."""
    from keras_dist._values import PerReplica

    found: list = []

    def collect(value):  # no generator: autograph converts run's callees, and warns on them
        if isinstance(value, PerReplica):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)
        elif isinstance(value, collections.abc.Mapping):
            for item in value.values():
                collect(item)

    collect(arguments)
    local = strategy.num_replicas_in_sync // max(1, strategy.extended.num_workers)
    for leaf in found:
        spans = getattr(leaf, "num_replicas", None)
        count, num_replicas = (spans, strategy.num_replicas_in_sync) if spans else (len(leaf.values), local)
        if count != num_replicas:
            raise ValueError(
                f"strategy.run got a PerReplica of {count} values on a strategy of "
                f"{num_replicas} replicas (on this worker): it needs one value per replica. Make it with "
                "strategy.experimental_distribute_values_from_function(fn) (fn is called once per "
                "replica) or experimental_distribute_dataset."
            )


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


def _check_axis(method: str, axis: Any, components: tuple) -> None:
    """`axis` must be an integer within the rank of the per-replica values."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"strategy.{method}: axis must be an integer, got {axis!r}.")
    ranks = {len(component.shape) for component in components if hasattr(component, "shape")}
    if not ranks:  # nests and Python numbers: the engine checks them
        return
    rank = min(ranks)
    if not -rank <= axis < rank:
        raise ValueError(
            f"strategy.{method}: axis={axis} is out of range for per-replica values "
            f"of rank {rank} (valid: {-rank}..{rank - 1}); "
            + ("pass axis=None to combine scalars." if method == "reduce" and rank == 0 else "pick an existing axis.")
        )


def _natively(adapter, engine, dataset, first_replica: int, kind: str, options) -> Any:
    """The engine's own distributed dataset (the adapter's optional
    `distribute_dataset_natively`), or None: keras_dist splits on the host."""
    if adapter.distribute_dataset_natively is None:
        return None
    return adapter.distribute_dataset_natively(engine, dataset, first_replica, kind, options)


def _trains_as(native: Any, strategy: "Strategy", make_source: Callable[[], Any]) -> Any:
    """`native` (the engine's own distributed dataset) marked, as
    `DistributedDataset._made_by` marks keras_dist's, with a function
    giving what `fit`/`evaluate`/`predict` under `strategy` take in its
    place: its undistributed source, or keras_dist's own distributed
    dataset of the same batches, made only then (the native one may be
    made while a `tf.function` traces) (`keras_dist._hooks._distributed_input`).
    Handed to Keras as it is, the engine's would be read as global batches
    of one replica's rows (TensorFlow: 0.28 off one device on 4 replicas)."""
    native._keras_dist_trains_as = (strategy, make_source)
    return native


def _steps_of_replica_batches(datasets: Any, num_replicas: int, per_replica: bool) -> Optional[int]:
    """How many steps `distribute_datasets_from_function`'s input gives,
    where its datasets say (else None): one per `num_replicas` batches of
    one pipeline, or the longest of the replicas' pipelines."""
    from keras_dist._input import known_length

    if per_replica:
        lengths = [known_length(d) for d in datasets]
        return None if None in lengths else max(lengths, default=0)
    length = known_length(datasets)
    return None if length is None else -(-length // num_replicas)


def _input_options(method: str, options: Any):
    """`options` as a `keras_dist.InputOptions` (the defaults for None)."""
    from keras_dist._input import InputOptions

    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        raise TypeError(f"strategy.{method}(options=...) takes a keras_dist.InputOptions, got {options!r}.")
    return options


def _check_host_input_options(method: str, options) -> None:
    """Where keras_dist splits batches on the host (JAX; non-tf.data input
    on TensorFlow) every element goes to the devices: it cannot keep one
    off them or run the pipeline on them."""
    if options.experimental_place_dataset_on_device:
        raise NotImplementedError(
            f"strategy.{method}: InputOptions(experimental_place_dataset_on_device=True) "
            "needs an input pipeline that runs on the device (tf.data on "
            "TensorFlow); here the pipeline runs on the host. Leave it False."
        )
    if not options.fetch_to_device:
        raise NotImplementedError(
            f"strategy.{method}: InputOptions(experimental_fetch_to_device=False) "
            "cannot be carried out here: keras_dist splits each batch on the host "
            "and places the shards on the replicas' devices, where the replicas "
            "run on them (tf.data input on TensorFlow can keep them off the "
            "devices). Leave it None or True."
        )


class OneDeviceStrategy(Strategy):
    """Places variables and computation on one device.

    ```python
    strategy = keras_dist.OneDeviceStrategy("cpu:0")
    ```
    """

    def __init__(self, device: str):
        if not isinstance(device, str):
            raise TypeError(
                "OneDeviceStrategy takes one device name such as 'cpu:0' or "
                f"'/gpu:0'; got {device!r}."
            )
        visible = get_adapter().visible_devices()
        super().__init__(StrategyExtended(self, _devices.resolve_devices([device], visible)))


class MirroredStrategy(Strategy):
    """Synchronous data parallelism over local devices.

    Every variable is mirrored on each device; each global batch is split
    across the replicas (also when it does not divide evenly) and gradients
    are summed over all of them, so training matches one device on the same
    global batch.

    Args:
        devices: device names (``"cpu:0"``, ``"/gpu:1"``...). ``None`` uses
            all local accelerators, or all local CPU devices if there are
            none.
        cross_device_ops: how values are summed across replicas: a
            `keras_dist.NcclAllReduce`, `HierarchicalCopyAllReduce` or
            `ReductionToOneDevice`; ``None`` lets the backend's engine choose.
            Checked here, for this backend and these devices.

    ```python
    strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
    strategy.num_replicas_in_sync  # 2
    keras_dist.MirroredStrategy(
        cross_device_ops=keras_dist.HierarchicalCopyAllReduce(num_packs=0)
    )
    ```
    """

    def __init__(
        self,
        devices: Optional[Sequence[str]] = None,
        cross_device_ops: Optional[_cross_device_ops.CrossDeviceOps] = None,
    ):
        adapter = get_adapter()
        resolved = _devices.resolve_devices(devices, adapter.visible_devices())
        cross_device_ops = _cross_device_ops.validate(cross_device_ops, resolved)
        adapter.check_cross_device_ops(cross_device_ops, resolved)
        super().__init__(StrategyExtended(self, resolved, cross_device_ops))
        if devices is None and len(resolved) == 1:
            _note_one_replica(resolved[0])


class _CentralStorageExtended(StrategyExtended):
    def __init__(self, strategy, compute_devices, parameter_device):
        super().__init__(strategy, compute_devices)
        self._parameter_device = parameter_device

    engine_kind = EngineKind.CENTRAL_STORAGE

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        return (self._parameter_device,)


class CentralStorageStrategy(Strategy):
    """Variables live once, on a parameter device; compute is replicated.

    As `tf.distribute.experimental.CentralStorageStrategy`: every variable
    (weights, optimizer slots, metrics) exists once, on `parameter_device`;
    each step reads the weights onto the compute devices, splits the global
    batch across them, sums the gradients, and the optimizer applies them
    once, on the parameter device. Training matches one device on the same
    global batch, as with `MirroredStrategy`.

    Args:
        compute_devices: devices that run the replicas (``None``: all local
            accelerators, or all local CPU devices where there are none).
        parameter_device: where the variables live (``None``: the CPU when
            there are several compute devices, else the one compute device).

    ```python
    strategy = keras_dist.experimental.CentralStorageStrategy(["cpu:0", "cpu:1"])
    strategy.extended.parameter_devices   # ('cpu:0',)
    ```
    """

    def __init__(
        self,
        compute_devices: Optional[Sequence[str]] = None,
        parameter_device: Optional[str] = None,
    ):
        visible = get_adapter().visible_devices()
        compute = _devices.resolve_devices(compute_devices, visible)
        if parameter_device is None:
            if len(compute) == 1:
                parameter = compute[0]
            else:
                parameter = next((d for d in visible if d.startswith("cpu:")), compute[0])
        elif isinstance(parameter_device, str):
            parameter = _devices.resolve_devices([parameter_device], visible)[0]
        else:
            raise TypeError(
                "CentralStorageStrategy(parameter_device=...) takes one device "
                f"name such as 'cpu:0'; got {parameter_device!r}."
            )
        super().__init__(_CentralStorageExtended(self, compute, parameter))

    def __repr__(self) -> str:
        devices = ", ".join(self._extended.worker_devices)
        return (
            f"CentralStorageStrategy(compute_devices=[{devices}], "
            f"parameter_device={self._extended.parameter_devices[0]})"
        )


_logger = logging.getLogger("keras_dist")
_noted_one_replica = False


def _note_one_replica(device: str) -> None:
    """Says once per process that `MirroredStrategy()` found one device (a
    warning: Python shows those on stderr with no logging set up)."""
    global _noted_one_replica
    if _noted_one_replica:
        return
    _noted_one_replica = True
    _logger.warning(
        "MirroredStrategy() found one device (%s), so it runs one replica. "
        "To try several replicas on this host's CPU, call "
        "keras_dist.simulate_cpu_devices(n) before the backend starts (right "
        "after the imports, before any computation).",
        device,
    )


class _MultiWorkerExtended(StrategyExtended):
    engine_kind = EngineKind.MULTI_WORKER

    def __init__(self, strategy, devices, global_devices, resolver, options):
        super().__init__(strategy, devices, engine_devices=global_devices)
        self._resolver = resolver
        self._options = options

    @property
    def should_checkpoint(self) -> bool:
        return self._resolver.is_chief

    @property
    def should_save_summary(self) -> bool:
        return self._resolver.is_chief

    @property
    def task_type(self):
        return self._resolver.task_type

    @property
    def task_id(self):
        return self._resolver.task_id

    @property
    def communication_options(self):
        return self._options

    @property
    def cluster_resolver(self):
        return self._resolver

    @property
    def num_workers(self) -> int:
        return self._resolver.num_workers

    @property
    def worker_index(self) -> int:
        return self._resolver.worker_index


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous data parallelism over all devices of several workers.

    Every worker runs the same program; the cluster comes from
    `cluster_resolver` (default: the `TF_CONFIG` environment variable, as
    set by `keras-dist launch`). `num_replicas_in_sync` counts the replicas
    of all workers, and `batch_size` is the global batch: every worker
    passes the same full arrays and keras_dist gives each its share.
    Create it first thing in the program, before any computation.

    ```python
    strategy = keras_dist.MultiWorkerMirroredStrategy()   # one worker here
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=64, verbose=0)
    ```
    """

    def __init__(self, cluster_resolver: Any = None, communication_options: Any = None):
        from keras_dist._communication import CommunicationOptions
        from keras_dist.cluster_resolver import TFConfigClusterResolver

        # TensorFlow: tf's own resolver and options are taken too (ported code)
        resolver = _foreign.accept(cluster_resolver, "cluster_resolver") or TFConfigClusterResolver()
        options = _foreign.accept(communication_options, "communication_options") or CommunicationOptions()
        if not isinstance(options, CommunicationOptions):
            raise TypeError(
                "communication_options must be a keras_dist.CommunicationOptions, "
                f"got {options!r}."
            )
        if not (callable(getattr(resolver, "cluster_spec", None)) and hasattr(resolver, "task_type")):
            raise TypeError(
                "MultiWorkerMirroredStrategy(cluster_resolver=...) takes a cluster resolver, got "
                f"{type(resolver).__name__}. For a cluster written as a dict use "
                "keras_dist.cluster_resolver.SimpleClusterResolver(cluster_dict, task_type='worker', "
                "task_id=i); leave it None to read TF_CONFIG."
            )
        if resolver.task_type not in (None, "chief", "worker"):
            raise ValueError(
                f"MultiWorkerMirroredStrategy runs on chief and worker tasks; "
                f"this task is {resolver.task_type!r}."
            )
        check_cluster_to_join(resolver)  # before joining: no hang, no engine dump
        self._cluster_resolver = resolver
        adapter = get_adapter()
        heartbeat.mark_join("joining")
        adapter.initialize_multi_worker(resolver, options)
        heartbeat.mark_join("joined")
        heartbeat.beat()  # joined the job
        super().__init__(
            _MultiWorkerExtended(
                self, adapter.visible_devices(), adapter.global_devices(), resolver, options
            )
        )

    @property
    def cluster_resolver(self):
        return self._cluster_resolver


TPU_ON_CPU_ENV = _devices.TPU_ON_CPU_ENV


class _TPUExtended(_MultiWorkerExtended):
    engine_kind = EngineKind.TPU


class TPUStrategy(Strategy):
    """Synchronous data parallelism over TPU cores (`tf.distribute.TPUStrategy`).

    Every variable is replicated on each TPU core and the global batch is
    split across them, as in `MirroredStrategy`. `steps_per_execution` in
    `compile` is the lever that matters on TPU: with it, `fit` and
    `evaluate` run that many batches in one compiled on-device loop.

    Where no TPU is visible it raises, naming `MirroredStrategy`; the test
    hook ``KERAS_DIST_TPU_ON_CPU=1`` makes it run over the CPU devices.
    Tested over simulated CPU devices only; not yet on real TPUs.

    ```python
    resolver = keras_dist.cluster_resolver.TPUClusterResolver()
    keras_dist.tpu.experimental.initialize_tpu_system(resolver)
    try:
        strategy = keras_dist.TPUStrategy(resolver)
    except RuntimeError:  # no TPU on this machine
        strategy = keras_dist.MirroredStrategy()
    ```
    """

    def __init__(self, tpu_cluster_resolver: Any = None, experimental_device_assignment: Any = None):
        from keras_dist._communication import CommunicationOptions

        if experimental_device_assignment is not None:
            raise NotImplementedError(
                "TPUStrategy(experimental_device_assignment=...) is not supported: "
                "keras_dist places one replica on every TPU core of the job. Pass "
                "experimental_device_assignment=None (for model parallelism on JAX, "
                "use keras.distribution.ModelParallel)."
            )
        if tpu_cluster_resolver is None:
            from keras_dist.cluster_resolver import TPUClusterResolver

            tpu_cluster_resolver = TPUClusterResolver()
        resolver = _foreign.accept(tpu_cluster_resolver, "cluster_resolver")
        adapter = get_adapter()
        adapter.initialize_tpu_system(resolver)  # before the devices are listed
        local = _tpu_cores(adapter.visible_devices())
        if resolver.num_workers > 1:
            global_devices = _tpu_cores(adapter.global_devices())
        else:
            global_devices = local
        self._cluster_resolver = resolver
        super().__init__(
            _TPUExtended(self, local, global_devices, resolver, CommunicationOptions())
        )

    @property
    def cluster_resolver(self):
        return self._cluster_resolver


def _tpu_cores(devices: Sequence[str]) -> tuple[str, ...]:
    """The TPU cores among `devices`; the CPU devices under the test hook;
    else the error that says what was looked for and what to use."""
    import os

    tpus = tuple(d for d in devices if d.startswith("tpu:"))
    if tpus:
        _logger.warning(
            "keras_dist's TPUStrategy found %d TPU core(s). It has been tested "
            "over CPU devices only, not yet on real TPUs: compare a few steps "
            "with MirroredStrategy and report what you see.",
            len(tpus),
        )
        return tpus
    if os.environ.get(TPU_ON_CPU_ENV) == "1":
        return tuple(d for d in devices if d.startswith("cpu:"))
    raise RuntimeError(
        "TPUStrategy found no TPU: the backend lists "
        f"{', '.join(devices) or 'no devices'} and no 'tpu:N' device. On a "
        "Cloud TPU VM, install the backend's TPU build (jax[tpu], or "
        "tensorflow with TPU support). Without a TPU, use "
        "keras_dist.MirroredStrategy() (GPUs or CPU). To exercise the TPU "
        f"code path on CPU devices (tests), set {TPU_ON_CPU_ENV}=1."
    )


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
        from keras_dist._input import DistributedDataset, OnePass, check_dataset

        options = _input_options("experimental_distribute_dataset", options)
        check_dataset(dataset)
        adapter = get_adapter()
        native = _natively(adapter, None, dataset, 0, "global_batches", options)
        if native is not None:
            return native
        batches = lambda: adapter.iterate_batches(dataset)  # noqa: E731
        return DistributedDataset(
            OnePass(batches, dataset) if OnePass.needed(dataset) else batches,
            lambda b: b,
            buffer_size=options.experimental_per_replica_buffer_size,
        )

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
    """True inside the scope of a (non-default) strategy."""
    return _context.current_strategy() is not None


def get_replica_context() -> Optional[ReplicaContext]:
    """The current replica context.

    The default context (replica 0 of 1) outside any scope; ``None`` in
    cross-replica context (inside a scope, outside `run`).
    """
    context = _context.replica_context()
    if context is not None:
        return context
    if _context.current_strategy() is None:
        return _DEFAULT_REPLICA_CONTEXT
    return None


def in_cross_replica_context() -> bool:
    """True inside a strategy's scope but outside replica computation."""
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
