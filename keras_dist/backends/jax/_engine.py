"""JAX engine: a `jax.sharding.Mesh` over a strategy's devices, with the
shardings and batch placement the steps and custom loops use."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import jax
import jax.numpy as jnp
import keras
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, SingleDeviceSharding

from keras_dist import _context
from keras_dist._cross_device_ops import ReductionToOneDevice, _PackedAllReduce
from keras_dist._engine_kind import EngineKind, engine_builder
from keras_dist.backends.jax import _cluster

BATCH_AXIS = "batch"


@dataclasses.dataclass(frozen=True, eq=False)
class JaxEngine:
    """The mesh and Keras distribution behind one keras_dist strategy."""

    devices: tuple  # jax.Device objects, in replica order
    mesh: Mesh
    distribution: Any  # keras.distribution.DataParallel
    #: XLA options for every program compiled for this engine (None: XLA's).
    compiler_options: Any = None
    #: CentralStorageStrategy: where every variable lives (a one-device
    #: `NamedSharding`); None where variables are replicated on the mesh.
    parameter_sharding: Any = None
    #: TPUStrategy: `steps_per_execution` batches run in one compiled
    #: on-device loop (`_step.OnDeviceLoop`).
    steps_on_device: bool = False

    @property
    def num_replicas(self) -> int:
        return len(self.devices)


@dataclasses.dataclass(frozen=True, eq=False)
class ParameterServerEngine(JaxEngine):
    """ParameterServerStrategy: the coordinator's single device, the
    variables created in the scope, and the Ray cluster
    (`_parameter_servers.Cluster`, started by the coordinator)."""

    variables: Any = None  # _parameter_servers.VariableRecord
    cluster: Any = None  # _parameter_servers.Cluster


def _canonical(device) -> str:
    return f"{device.platform}:{device.id}"


def visible_devices() -> tuple[str, ...]:
    return tuple(_canonical(d) for d in jax.local_devices())


def global_devices() -> tuple[str, ...]:
    """All devices of all processes, in JAX's (process-major) order."""
    return tuple(_canonical(d) for d in jax.devices())


#: XLA's CPU client sizes its two thread pools from this variable when it is
#: set (else from the host's cores); see `cpu_client_threads`.
_XLA_CPU_THREADS_ENV = "NPROC"


def cpu_client_threads(count: int) -> int:
    """Threads XLA's CPU client needs to run `count` simulated devices
    without deadlocking.

    XLA sizes its launch and intra-op pools max(cores, devices). A
    multi-device launch holds one launch-pool thread per device while it
    waits for that device's in-flight slot (32 per device), and the
    slots are freed only by computations that also need that pool. So with
    threads == devices (4 devices on 2 cores) a collective can run on two
    devices while its other two halves wait forever behind blocked launches:
    XLA aborts after 40 s ("Termination timeout for all reduce ...").
    `tests/workers/xla_cpu_pool.py` reproduces it under CPU load. Four
    threads a device leave room for one blocked launch and one running
    collective per dispatching thread, twice over.
    """
    try:
        cores = len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        cores = os.cpu_count() or 1
    return max(cores, 4 * count)


def simulate_cpu_devices(count: int) -> None:
    """Splits the host CPU into `count` JAX devices.

    Must run before JAX starts its backend (before any array is created).
    Also gives XLA's CPU client the threads `count` devices need
    (`cpu_client_threads`), unless ``NPROC`` is already set.
    """
    try:
        jax.config.update("jax_num_cpu_devices", int(count))
        if count > 1 and not os.environ.get(_XLA_CPU_THREADS_ENV):
            os.environ[_XLA_CPU_THREADS_ENV] = str(cpu_client_threads(count))
    except RuntimeError as error:
        current = len(jax.devices("cpu"))
        if current == count:
            return
        raise RuntimeError(
            f"JAX already started with {current} CPU device(s); cannot switch "
            f"to {count}. Call keras_dist.simulate_cpu_devices({count}) before "
            "any JAX computation, or set XLA_FLAGS="
            f"--xla_force_host_platform_device_count={count} before starting "
            "Python."
        ) from error


#: XLA's passes that combine independent all-reduces into one (their names
#: on CPU, on GPU, and the generic pass). Disabling them leaves one
#: all-reduce per reduced tensor.
_ALL_REDUCE_COMBINERS = "cpu-all-reduce-combiner,gpu-all-reduce-combiner,all-reduce-combiner"


def check_cross_device_ops(ops, devices) -> None:
    """Raises if XLA cannot do what `ops` asks (see `compiler_options_for`)."""
    if ops is None:
        return
    name = type(ops).__name__
    if isinstance(ops, _PackedAllReduce) and ops.num_packs > 1:
        raise ValueError(
            f"{name}(num_packs={ops.num_packs}) cannot be honoured on JAX: XLA "
            "packs a step's all-reduces itself and offers two settings, "
            "num_packs=1 (all combined into one all-reduce, the default) and "
            "num_packs=0 (one all-reduce per tensor). Use one of those; "
            "other pack counts are a TensorFlow-engine setting."
        )
    if isinstance(ops, ReductionToOneDevice) and (
        ops.reduce_to_device is not None or ops.accumulation_fn is not None
    ):
        raise ValueError(
            "ReductionToOneDevice(reduce_to_device=..., accumulation_fn=...) "
            "are TensorFlow-engine settings: on JAX, XLA's all-reduce leaves "
            "the sum on every device, with no device or summing function to "
            "choose. Use keras_dist.ReductionToOneDevice() on JAX."
        )


def compiler_options_for(ops):
    """XLA compile options that carry out a cross-device ops choice.

    None and ``num_packs=1``: XLA's default, which combines the all-reduces
    of a step (the gradients' among them) into one. ``num_packs=0`` and
    `ReductionToOneDevice`: the combiner passes are disabled, so every
    reduced tensor keeps its own all-reduce.
    """
    if ops is None or (isinstance(ops, _PackedAllReduce) and ops.num_packs == 1):
        return None
    return {"xla_disable_hlo_passes": _ALL_REDUCE_COMBINERS}


def create_engine(extended) -> JaxEngine:
    """The engine for a strategy's `StrategyExtended`, by its `engine_kind`
    (its engine devices, its cross-device ops)."""
    return engine_builder(_ENGINES, extended.engine_kind, "jax")(extended)


def _data_parallel_engine(extended, parameter_device=None, steps_on_device=False) -> JaxEngine:
    """Keras' DataParallel over the engine devices (every worker's, for a
    multi-worker job): variables replicated, or once on `parameter_device`."""
    by_name = {_canonical(d): d for d in jax.devices()}
    devices = tuple(by_name[d] for d in extended.engine_devices)
    device_mesh = keras.distribution.DeviceMesh(
        shape=(len(devices),),
        axis_names=[BATCH_AXIS],
        devices=[_canonical(d) for d in devices],
    )
    distribution = keras.distribution.DataParallel(
        device_mesh=device_mesh, auto_shard_dataset=False
    )
    mesh = device_mesh.backend_mesh
    parameter_sharding = None
    if parameter_device is not None:
        parameter = by_name[parameter_device]
        parameter_sharding = NamedSharding(Mesh(np.array([parameter]), (PARAMETER_AXIS,)), PartitionSpec())
        distribution = _CentralStorageDistribution(parameter_sharding, device_mesh=device_mesh, auto_shard_dataset=False)
    return JaxEngine(
        devices=devices,
        mesh=mesh,
        distribution=distribution,
        compiler_options=compiler_options_for(extended.cross_device_ops),
        parameter_sharding=parameter_sharding,
        steps_on_device=steps_on_device,
    )


class _CentralStorageDistribution(keras.distribution.DataParallel):
    """Keras' data parallelism over the compute devices, with every variable
    created on the parameter device (one copy) instead of replicated."""

    def __init__(self, parameter_sharding, **kwargs):
        super().__init__(**kwargs)
        self._parameter_sharding = parameter_sharding

    def get_variable_layout(self, variable):
        if getattr(variable, "_layout", None) is not None:
            return variable._layout
        return self._parameter_sharding


class _RecordingDistribution(keras.distribution.DataParallel):
    """Keras' data parallelism over one device that records the variables
    created in its scope (ParameterServerStrategy: they go to the ps)."""

    def __init__(self, record, **kwargs):
        super().__init__(**kwargs)
        self._record = record

    def get_variable_layout(self, variable):
        layout = super().get_variable_layout(variable)
        self._record.add(variable, layout)
        return layout


def _create_parameter_server_engine(extended) -> "ParameterServerEngine":
    from keras_dist.backends.jax import _parameter_servers

    _parameter_servers.check_local_cluster(extended.cluster_resolver)
    device = jax.devices("cpu")[0]
    device_mesh = keras.distribution.DeviceMesh(shape=(1,), axis_names=[BATCH_AXIS], devices=[_canonical(device)])
    record = _parameter_servers.VariableRecord()
    distribution = _RecordingDistribution(record, device_mesh=device_mesh, auto_shard_dataset=False)
    engine = ParameterServerEngine(
        devices=(device,),
        mesh=device_mesh.backend_mesh,
        distribution=distribution,
        variables=record,
        cluster=_parameter_servers.Cluster(extended.container_strategy),
    )
    return engine


#: EngineKind -> the function that builds its engine from the StrategyExtended.
_ENGINES = {
    EngineKind.LOCAL: _data_parallel_engine,
    EngineKind.ONE_DEVICE: _data_parallel_engine,  # a one-device mesh
    EngineKind.MULTI_WORKER: _data_parallel_engine,  # every worker's devices in one mesh
    EngineKind.CENTRAL_STORAGE: lambda extended: _data_parallel_engine(
        extended, parameter_device=extended.parameter_devices[0]
    ),
    EngineKind.TPU: lambda extended: _data_parallel_engine(extended, steps_on_device=True),
    EngineKind.PARAMETER_SERVER: _create_parameter_server_engine,
}


def scope(engine: JaxEngine):
    """Variables created inside are replicated on the engine's mesh."""
    return engine.distribution.scope()


#: The axis of CentralStorageStrategy's one-device parameter mesh.
PARAMETER_AXIS = "parameters"


def place_variable_value(value, layout):
    """`value` with exactly `layout`'s sharding. Keras keeps an array whose
    sharding is only equivalent (a one-device mesh on the default device:
    the array's own `SingleDeviceSharding`); a step returning the state then
    gives the mesh's `NamedSharding`, and `jax.jit` compiles a second time
    for it. `device_put` to an equivalent sharding moves no data.
    CentralStorageStrategy's values on the parameter device are left as
    Keras placed them: uncommitted, so that a user's `jax.jit` step over
    the state takes them to the compute devices (committed, it refuses
    them beside the batch: "incompatible devices"). In a multi-process job
    nothing is moved: there the values are global arrays placed by Keras on
    the mesh, and an equivalent sharding in another device order would make
    `device_put` a collective program; neither is a buffer Keras already
    gave away (donated to a step: deleted) touched."""
    if _cluster.is_multi_process():
        return value
    sharding = getattr(layout, "backend_layout", layout)
    if (
        isinstance(sharding, NamedSharding)
        and sharding.mesh.axis_names == (PARAMETER_AXIS,)
    ):
        return _uncommitted_on(sharding, value)
    if _context.current_strategy() is None:  # outside every scope: as plain Keras placed it
        return value
    if (
        isinstance(value, jax.Array)
        and not isinstance(value, jax.core.Tracer)
        and not value.is_deleted()
        and isinstance(sharding, jax.sharding.Sharding)
        and value.sharding != sharding
        and value.sharding.is_equivalent_to(sharding, value.ndim)
    ):
        return jax.device_put(value, sharding)
    return value


def _uncommitted_on(parameter_sharding, value):
    """`value` uncommitted, as Keras placed the initial values, where the
    parameter device is JAX's default device: an `assign` of a step's
    result (committed) otherwise pinned it, and the next `jax.jit` over the
    state and a batch refused it ("incompatible devices"). JAX offers no
    uncommitted copy of an array but through the host: one copy per assign
    (the fit step writes back once per epoch)."""
    if (
        isinstance(value, jax.Array)
        and not isinstance(value, jax.core.Tracer)
        and value.committed
        and not value.is_deleted()
        and parameter_sharding.device_set == jnp.zeros(()).sharding.device_set
    ):
        return jax.device_put(np.asarray(value))
    return value


def owns_variable(engine: JaxEngine, variable) -> bool:
    if isinstance(engine, ParameterServerEngine):
        return variable in engine.variables
    value = getattr(variable, "_value", None)
    if value is None:  # state lives in the running step; nothing to check
        return True
    sharding = getattr(value, "sharding", None)
    if sharding is None:
        return False
    if engine.parameter_sharding is not None:
        return sharding.device_set == engine.parameter_sharding.device_set
    return sharding.device_set == set(engine.devices) and (
        sharding.is_fully_replicated
    )


def replicated_sharding(engine: JaxEngine):
    if engine.num_replicas == 1:
        # JAX gives one-device arrays a SingleDeviceSharding; using the same
        # kind here keeps jit from recompiling when state changes hands.
        return SingleDeviceSharding(engine.devices[0])
    return NamedSharding(engine.mesh, PartitionSpec())


def batch_sharding(engine: JaxEngine, ndim: int):
    if engine.num_replicas == 1:
        return SingleDeviceSharding(engine.devices[0])
    spec = PartitionSpec(BATCH_AXIS, *([None] * (ndim - 1)))
    return NamedSharding(engine.mesh, spec)


def constrain_batch(engine: JaxEngine, data):
    """Inside a jitted step: split every array's leading axis over replicas.

    Works for any batch size; XLA pads uneven shards and masks reductions.
    """
    if engine.num_replicas == 1:
        return data

    def constrain(x):
        if x is None or not hasattr(x, "ndim") or x.ndim == 0:
            return x
        return jax.lax.with_sharding_constraint(
            x, batch_sharding(engine, x.ndim)
        )

    return jax.tree_util.tree_map(constrain, data)


def place_host_data(engine: JaxEngine, data):
    """Puts host (numpy) leaves of a global batch on the mesh, split by rows.

    Leaves that are already JAX arrays are left where they are.
    """

    def place(x):
        if x is None or isinstance(x, jax.Array):
            return x
        x = np.asarray(x)
        if x.ndim == 0:
            return x
        return place_global_batch(engine, x, batch_sharding(engine, x.ndim))

    return jax.tree_util.tree_map(place, data)


def splits_evenly_on_entry(engine: JaxEngine, data) -> bool:
    """Whether a jitted step can take `data` as is, split by rows on entry.

    True for host (numpy) batches whose rows divide evenly over the
    replicas of a single-process engine; jit then transfers them in C++
    (as it does for plain Keras). Everything else is placed beforehand
    with `place_host_data`.
    """
    if _cluster.is_multi_process():
        return False
    leaves = jax.tree_util.tree_leaves(data)
    if any(type(leaf) is not np.ndarray or leaf.ndim == 0 for leaf in leaves):
        return False
    return divides_evenly(engine, data)


def _row_counts(data) -> list[int]:
    return [x.shape[0] for x in jax.tree_util.tree_leaves(data) if np.ndim(x) >= 1]


def divides_evenly(engine: JaxEngine, data) -> bool:
    """Whether a batch has arrays, and their rows divide over the replicas."""
    rows = _row_counts(data)
    return bool(rows) and not _is_uneven(engine, data)


def _is_uneven(engine: JaxEngine, data) -> bool:
    return any(rows % engine.num_replicas for rows in _row_counts(data))


def gather_uneven_outputs(engine: JaxEngine, data, outputs):
    """Inside a jitted step: replicate outputs of an uneven batch.

    An uneven batch leaves XLA's padded sharding on the outputs, which JAX
    cannot express as a `NamedSharding`; replicating them avoids that.
    """
    if engine.num_replicas == 1 or not (
        _is_uneven(engine, data) or _cluster.is_multi_process()
    ):  # multi-process: replicate so every worker can read the result
        return outputs
    return jax.tree_util.tree_map(
        lambda y: jax.lax.with_sharding_constraint(y, replicated_sharding(engine)),
        outputs,
    )


def place_global_batch(engine: JaxEngine, array, sharding):
    """Puts one host array on the mesh; uneven batches go replicated."""
    if (
        isinstance(sharding, NamedSharding)
        and sharding.mesh == engine.mesh
        and np.ndim(array) >= 1
        and array.shape[0] % engine.num_replicas != 0
        and any(axis is not None for axis in sharding.spec)
    ):
        sharding = replicated_sharding(engine)
    if _cluster.is_multi_process():  # every worker holds the same global batch
        return jax.make_array_from_callback(array.shape, sharding, lambda index: array[index])
    return jax.device_put(array, sharding)




def trains_per_replica(engine: JaxEngine) -> bool:
    """Whether `engine` runs `fit`'s training step per replica, with one
    packed gradient all-reduce (`_replica_step`), for the models that can:
    multi-process CPU jobs with XLA's default packing."""
    return (
        engine.num_replicas > 1
        and engine.compiler_options is None
        and _cluster.is_multi_process()
        and all(d.platform == "cpu" for d in engine.devices)
    )
