"""`BackendAdapter`: every method a Keras backend must provide to keras_dist,
declared as one typed Protocol per concern.

Required concerns (`REQUIRED_CONCERNS`): `Devices`, `MultiProcessJobs`,
`Input`, `CustomLoops`, `TrainingSteps`, `Measurement`. Optional
capabilities (`OPTIONAL_CONCERNS`: `NativeInput`, `ParameterServers` (a
group: all or none), `ParameterServerVariables`, `Servers`,
`BackendObjects`) are None on an adapter whose backend lacks them, never a
stub. `BackendAdapter` is the required concerns together.

The core (strategies, scopes, distributed values, input, losses, hooks) asks
the backend for nothing outside this class. Each backend subclasses it once
(`backends/jax/_adapter.py`, `backends/tensorflow/_adapter.py`,
`backends/torch/_adapter.py`); the
abstract methods make an incomplete adapter fail when it is instantiated,
and `check_conforms` (run by `get_adapter` at load time, and by the
conformance test) also compares every signature with the one declared here.

An *engine* is the backend object behind one strategy (JAX: a
`jax.sharding.Mesh` and a Keras distribution; TensorFlow: a `tf.distribute`
strategy; PyTorch: this process's replica in a `torch.distributed` group). The adapter creates it from the strategy's `StrategyExtended`
and receives it back in every call that needs it.

Adding a backend: subclass this, give every method (a backend's adapter
usually names its module functions: ``run = staticmethod(_replica.run)``),
register the module in `backends/__init__.py`.
"""

from __future__ import annotations

import abc
import inspect
import typing
from typing import Any, Callable, ContextManager, Optional, Sequence


# -- the required concerns ------------------------------------------------------


class Devices(typing.Protocol):
    """Devices and placement: which devices there are, the engine over them, where variables go."""


    @abc.abstractmethod
    def visible_devices(self) -> tuple[str, ...]:
        """Canonical names ("cpu:0", "gpu:1") of this process's devices."""

    @abc.abstractmethod
    def global_devices(self) -> tuple[str, ...]:
        """Every device of the job (all workers'), in replica order."""

    @abc.abstractmethod
    def simulate_cpu_devices(self, count: int) -> None:
        """Splits the host CPU into `count` devices (before first use)."""

    @abc.abstractmethod
    def check_cross_device_ops(self, ops: Any, devices: Sequence[str]) -> None:
        """Raises if this backend cannot carry out the `CrossDeviceOps` `ops`."""

    @abc.abstractmethod
    def create_engine(self, extended: Any) -> Any:
        """Builds the engine for a strategy from its `StrategyExtended`
        (`engine_devices`, `worker_devices`, `cross_device_ops`)."""

    @abc.abstractmethod
    def scope(self, engine: Any) -> ContextManager:
        """Makes variables created inside it placed by `engine`."""

    @abc.abstractmethod
    def owns_variable(self, engine: Any, variable: Any) -> bool:
        """True if the Keras `variable` is placed by `engine`."""


class MultiProcessJobs(typing.Protocol):
    """Jobs of several processes: joining one, and values agreed across its workers."""


    @abc.abstractmethod
    def initialize_multi_worker(self, resolver: Any, options: Any) -> None:
        """Joins the job described by `resolver` (once per process)."""

    @abc.abstractmethod
    def initialize_tpu_system(self, resolver: Any) -> None:
        """Readies the TPU system `resolver` describes (joins a multi-host
        slice); nothing where the backend needs nothing (idempotent)."""

    @abc.abstractmethod
    def is_multi_process(self) -> bool:
        """True once this process has joined a job of several workers."""

    @abc.abstractmethod
    def is_peer_failure(self, error: BaseException) -> bool:
        """Whether `error` is a collective that failed for want of a peer."""

    @abc.abstractmethod
    def values_from_chief(self, values: list) -> list:
        """The chief's values of these host (or process-local) values, on
        every worker: a collective, so every worker calls it at the same
        point. Unchanged outside a multi-process job."""

    def place_variable_value(self, value: Any, layout: Any) -> Any:
        """A variable's new value (created or assigned, as Keras placed it
        for the variable's `layout`) placed exactly as the layout says; a
        layout no strategy made is left as Keras placed it, outside a
        strategy's scope too. Optional: the default returns `value`. (JAX: Keras
        keeps an array whose placement is only equivalent, such as one on
        device 0 for a one-device mesh there, and a jitted step given it
        compiles again once it gets the layout's own placement back.)"""
        return value

    @abc.abstractmethod
    def values_from_every_worker(self, values: list) -> list:
        """Every worker's values of these host values (numbers, NumPy
        arrays of one shape and dtype on every worker; 32-bit dtypes travel
        exactly on every backend), stacked in worker order along a new
        first axis, on every worker: an all-gather over the job, so every
        worker calls it at the same point. Outside a multi-process job,
        each value with a first axis of length 1."""


class Input(typing.Protocol):
    """Input: batches as the backend takes them, split over the replicas."""


    @abc.abstractmethod
    def iterate_batches(self, dataset: Any) -> Any:
        """An iterator over `dataset`'s batches, as this backend takes them."""

    @abc.abstractmethod
    def split_global_batch(self, engine: Any, batch: Any) -> Any:
        """One global batch -> per-replica values (contiguous shards)."""

    @abc.abstractmethod
    def combine_replica_batches(self, engine: Any, batches: list) -> Any:
        """One batch per replica (fewer at the end) -> per-replica values."""


class CustomLoops(typing.Protocol):
    """Custom loops: replica and cross-replica computation (`strategy.run`, `reduce`, `gather`)."""


    @abc.abstractmethod
    def distribute_values(self, engine: Any, values: list) -> Any:
        """One value (a nest of arrays) per replica -> a per-replica value."""

    @abc.abstractmethod
    def run(self, strategy: Any, engine: Any, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Runs `fn` once per replica under a `keras_dist.ReplicaContext`."""

    @abc.abstractmethod
    def reduce(self, engine: Any, reduce_op: Any, value: Any, axis: Optional[int]) -> Any:
        """Combines a per-replica `value` across replicas (cross-replica)."""

    @abc.abstractmethod
    def gather(self, engine: Any, value: Any, axis: int) -> Any:
        """Concatenates the per-replica components of `value` along `axis`."""

    @abc.abstractmethod
    def local_results(self, engine: Any, value: Any) -> tuple:
        """The per-replica components of `value` held by this process."""

    @abc.abstractmethod
    def place_state(self, engine: Any, state: Any) -> Any:
        """`state` (a nest of the variables' values, as a custom loop carries
        them from step to step) placed as `run` returns a value equal on
        every replica, so a compiled step fed its own returned state takes
        its first input in the same placement. Where the variables' values
        already are (an engine that places no carried state), `state`."""


class TrainingSteps(typing.Protocol):
    """Keras training steps (called by the hooks): the distributed step functions and what runs inside them."""


    @abc.abstractmethod
    def make_trainer_function(self, model: Any, strategy: Any, kind: str) -> Optional[Callable]:
        """The distributed ``train``/``test``/``predict`` function Keras
        calls for `model`, or None to let Keras build its own (nothing to
        distribute, or a mode the backend leaves to Keras)."""

    @abc.abstractmethod
    def build_outside_replicas(self, build_fn: Callable[[], None]) -> None:
        """Runs `build_fn` (which creates variables) outside the replica
        computation of `run`, from inside it."""

    @abc.abstractmethod
    def assign_delta_in_replica(self, variable: Any, value: Any, sign: int) -> Any:
        """Inside `run`: `variable.assign_add(value)` (sign 1) or
        `assign_sub` (-1) with tf.distribute's aggregation of the increment
        across replicas; returns the new value. A variable on a parameter
        server: the engine's atomic increment (in a scheduled function,
        applied once). None elsewhere (Keras' own method then runs)."""

    @abc.abstractmethod
    def sum_gradients_over_replicas(self, values: list) -> list:
        """Inside a per-replica step: `values` unchanged, with their
        gradients summed across replicas in the backward pass."""

    @abc.abstractmethod
    def sum_gradients_for_apply(self, grads: list) -> Optional[list]:
        """Inside a replica of several: `grads` (None entries kept) summed
        over the replicas, where they are still this replica's own and the
        engine's optimizer would sum them only after clipping them
        (TensorFlow: Keras 3's `apply` clips, then all-reduces); None where
        they already are the global batch's (JAX: autodiff under the
        replicas' map sums them) or there is nothing to sum."""

    @abc.abstractmethod
    def global_moments(self, inputs: Any, axes: Sequence[int], mask: Any) -> tuple:
        """Inside a per-replica step: BatchNormalization mean and variance
        over the global batch."""


class Measurement(typing.Protocol):
    """Measurement (`keras-dist bench`, `ScalingReport`)."""


    @abc.abstractmethod
    def time_all_reduce(self, engine: Any, shapes_and_dtypes: list, repeats: int = 5) -> float:
        """Median seconds to all-reduce buffers of these shapes (a
        collective: every worker calls it)."""


# -- optional capabilities: each None on an adapter whose backend lacks it ----


class NativeInput(typing.Protocol):
    """The engine's own distributed dataset (TensorFlow: tf.data)."""

    def distribute_dataset_natively(self, engine: Any, dataset: Any, first_replica: int, kind: str, options: Any) -> Any:
        """The engine's own distributed dataset where it has one
        (TensorFlow, tf.data: iterable inside `tf.function`), carrying out
        the `keras_dist.InputOptions` `options` for the replicas from
        `first_replica` on; None where the backend has none. `kind`:
        "global_batches" (`dataset`'s batches cut into keras_dist's
        contiguous shards), "per_replica_batches" (one element per replica
        in turn) or "per_replica_pipelines" (`dataset` is a list, one
        dataset per replica: `InputReplicationMode.PER_REPLICA`).
        `engine` None: the default strategy (one replica, no splitting).
        Adapter without it: batches are split on the host (JAX)."""


class ParameterServers(typing.Protocol):
    """The coordinator's side of `ParameterServerStrategy` and
    `ClusterCoordinator`, called from the user's (the chief's) process: a
    capability group (`CAPABILITY_GROUPS`), all or none. The coordinator is
    the engine's own (TensorFlow: tf's ClusterCoordinator over tf's
    ParameterServerStrategy; JAX: Ray actors); `create_engine` builds the ps
    side. Adapter without them: `ParameterServerStrategy(...)` raises
    NotImplementedError naming the backend and `unsupported["parameter_servers"]`."""

    def create_coordinator(self, strategy: Any) -> Any:
        """The engine's coordinator for the `ParameterServerStrategy`
        `strategy` (one per strategy; the core caches it)."""

    def schedule(self, coordinator: Any, fn: Callable, args: tuple, kwargs: dict) -> Any:
        """Queues `fn(*args, **kwargs)` to run once on some worker; returns
        the engine's remote value at once. Per-worker arguments (from
        `create_per_worker_dataset`) resolve to the chosen worker's."""

    def fetch(self, coordinator: Any, remote_value: Any) -> Any:
        """Blocks until the engine's `remote_value` is ready; its result as
        host values (NumPy), or the error its function raised."""

    def join(self, coordinator: Any) -> None:
        """Blocks until every scheduled function has run; raises the first
        error one raised (a worker lost is rescheduled, not an error)."""

    def done(self, coordinator: Any) -> bool:
        """Whether every scheduled function has run (raises as `join`)."""

    def create_per_worker_dataset(self, coordinator: Any, dataset_fn: Callable) -> Any:
        """A dataset on each worker, made there by `dataset_fn()` (no
        argument: the core has bound the `InputContext` already);
        `iter()` of the result is the per-worker iterator `schedule` takes."""


class ParameterServerVariables(typing.Protocol):
    """Variables where the engine needs a hand with their writes: on
    parameter servers, applied once when a scheduled function runs again;
    split over the ps tasks; an optimizer's updates inside `run`. Each
    optional alone."""

    def assign_on_ps(self, variable: Any, value: Any) -> Any:
        """`variable.assign(value)` of a variable on a parameter server,
        written by a function the coordinator scheduled: applied once even
        when the function runs again after its worker died; returns the new
        value. None elsewhere (Keras' own `assign` then runs), and
        always where the adapter lacks it."""

    def apply_optimizer(self, optimizer: Any, build: Optional[Callable[[], None]], apply: Callable[[], Any]) -> Any:
        """Runs `apply()` (Keras' `optimizer.apply`). Where the engine's
        optimizer updates need it (TensorFlow, in a scheduled function:
        applied once even when the function runs again; JAX, inside `run`:
        written once as tf's cross-replica update, not aggregated over the
        replicas), around it; otherwise just `apply()`. `build`: builds the still unbuilt optimizer
        as Keras' `apply` would (None when built), for an engine that must
        build it before `apply()` runs. Adapter without it: `apply()`."""

    def variable_parts(self, variable: Any) -> Optional[list]:
        """The Keras variables trainers and optimizers see for `variable`
        where the engine stores it split over the ps tasks (TensorFlow: tf's
        `ShardedVariable` under a `variable_partitioner`): one per shard,
        the same objects on every call; None for a variable stored whole.
        Layers compute with `variable` (all its rows); gradients and
        updates go to the parts. Adapter without it: every variable whole."""


class Servers(typing.Protocol):
    """A task's server process for a cluster (`keras_dist.Server`)."""

    def create_server(
        self, cluster: dict, job_name: str, task_index: int, protocol: Optional[str], config: Any, start: bool
    ) -> Any:
        """A server for one task of a parameter-server cluster (`cluster`:
        job -> addresses), as `tf.distribute.Server`: the result has
        `start()`, `join()` (blocks for ever) and `target`. Adapter without
        it: `keras_dist.Server` raises NotImplementedError with the
        adapter's `unsupported["create_server"]` hint (JAX: the workers are
        Ray actors the strategy starts)."""


class BackendObjects(typing.Protocol):
    """The backend library's own objects in ported code (tf.distribute's)."""

    def from_backend_object(self, value: Any, kind: str) -> Any:
        """keras_dist's own object of `kind` (a key of `keras_dist._foreign.KINDS`:
        "reduce_op", "cross_device_ops", ...) for `value`, an object of the
        backend's library that `keras_dist._foreign.accept` found (TensorFlow:
        tf.distribute's `ReduceOp`, `tf.train.ClusterSpec`, ...); None where
        there is none, or where the adapter lacks it (the core then raises,
        naming the keras_dist spelling)."""


#: The concerns every adapter implements, in the order of this module.
REQUIRED_CONCERNS = (Devices, MultiProcessJobs, Input, CustomLoops, TrainingSteps, Measurement)
#: The optional capabilities, by concern.
OPTIONAL_CONCERNS = (NativeInput, ParameterServers, ParameterServerVariables, Servers, BackendObjects)


class OptionalCapabilities(NativeInput, ParameterServers, ParameterServerVariables, Servers, BackendObjects, typing.Protocol):
    """Every optional capability (each None on an adapter whose backend
    lacks it; see `optional_methods`)."""


class BackendAdapter(Devices, MultiProcessJobs, Input, CustomLoops, TrainingSteps, Measurement, abc.ABC):
    """What keras_dist needs from a backend: every required concern's
    methods (abstract: an adapter missing one fails when it is made) and
    the optional capabilities, None until the adapter gives them."""

    #: The Keras backend name ("jax", "tensorflow").
    name: str = ""

    # -- optional capabilities (declared by `OPTIONAL_CONCERNS`) ------------
    # An adapter whose backend lacks one leaves it None (a capability, not a
    # stub); the core then does without it, or raises one clear error naming
    # the backend and the `unsupported` hint below.
    distribute_dataset_natively: Optional[Callable[..., Any]] = None
    # `ParameterServers`: all of `CAPABILITY_GROUPS["parameter_servers"]` or none
    create_coordinator: Optional[Callable[..., Any]] = None
    schedule: Optional[Callable[..., Any]] = None
    fetch: Optional[Callable[..., Any]] = None
    join: Optional[Callable[..., Any]] = None
    done: Optional[Callable[..., Any]] = None
    create_per_worker_dataset: Optional[Callable[..., Any]] = None
    assign_on_ps: Optional[Callable[..., Any]] = None
    apply_optimizer: Optional[Callable[..., Any]] = None
    variable_parts: Optional[Callable[..., Any]] = None
    create_server: Optional[Callable[..., Any]] = None
    from_backend_object: Optional[Callable[..., Any]] = None

    #: capability (or group) name -> what to do instead on this backend
    #: (used in the core's "not supported" error), for those left None.
    unsupported: dict = {}

    def check_parameter_servers_supported(self) -> None:
        """Raises, naming the fix, when this backend cannot run a
        `ParameterServerStrategy` here (a missing optional package), so the
        error comes when the strategy is made, not at its first use.
        Optional: the default accepts."""


def concern_methods(concern: type) -> dict[str, inspect.Signature]:
    """The methods one concern Protocol declares, with their signatures, in
    the order it declares them."""
    return {
        name: inspect.signature(value)
        for name, value in vars(concern).items()
        if not name.startswith("_") and inspect.isfunction(value)
    }


#: Optional capabilities that come together: an adapter gives every method
#: of a group or none of them (the group is its concern's methods).
CAPABILITY_GROUPS = {
    "parameter_servers": tuple(concern_methods(ParameterServers)),
}


def concern_of(name: str) -> type:
    """The concern Protocol that declares the adapter method `name`."""
    for concern in REQUIRED_CONCERNS + OPTIONAL_CONCERNS:
        if name in vars(concern):
            return concern
    raise KeyError(f"no concern declares {name!r}")


def optional_methods() -> dict[str, inspect.Signature]:
    """Every optional capability, with its declared signature."""
    return dict(sorted((k, v) for concern in OPTIONAL_CONCERNS for k, v in concern_methods(concern).items()))


def required_methods() -> dict[str, inspect.Signature]:
    """Every method a backend must provide, with its declared signature."""
    return {
        name: inspect.signature(getattr(BackendAdapter, name))
        for name in sorted(BackendAdapter.__abstractmethods__)
    }


def check_conforms(adapter: BackendAdapter) -> None:
    """Raises TypeError unless `adapter` implements every method of
    `BackendAdapter` with the declared parameters (names and kinds, as
    called on the adapter: a plain function given as a staticmethod
    conforms like a method)."""
    if not isinstance(adapter, BackendAdapter):
        raise TypeError(f"{adapter!r} is not a keras_dist BackendAdapter.")
    problems = []
    declarations = {**required_methods(), **optional_methods()}
    for name, declared in declarations.items():
        method = getattr(adapter, name)
        if method is None and name in optional_methods():
            continue
        concern = concern_of(name).__name__
        if method is None:
            problems.append(f"{name} ({concern}) is None (only optional capabilities may be)")
            continue
        implemented = inspect.signature(method)
        want = [(p.name, p.kind) for p in declared.parameters.values()][1:]  # less `self`
        got = [(p.name, p.kind) for p in implemented.parameters.values()]
        if want != got:
            problems.append(f"{name}{implemented} (declared by {concern}: {name}{declared})")
    for group, names in CAPABILITY_GROUPS.items():
        given = [name for name in names if getattr(adapter, name) is not None]
        if given and len(given) != len(names):
            missing = [name for name in names if name not in given]
            problems.append(f"the {group} capability gives {', '.join(given)} but not {', '.join(missing)} (all or none)")
    if not adapter.name:
        problems.append("no `name`")
    if problems:
        raise TypeError(
            f"The {type(adapter).__name__} backend adapter does not conform to "
            "keras_dist.backends.BackendAdapter: " + "; ".join(problems)
        )
