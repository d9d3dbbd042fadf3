"""TensorFlow engine: the devices, and the tf.distribute strategy each
keras_dist strategy runs on, chosen by its `engine_kind` (`_ENGINES`). The
strategies themselves are `_strategies`; the multi-worker job `_cluster`."""

from __future__ import annotations

import contextlib

import itertools
import os

import tensorflow as tf

from keras_dist import _devices
from keras_dist._engine_kind import EngineKind, engine_builder
from keras_dist._cross_device_ops import HierarchicalCopyAllReduce, ReductionToOneDevice
from keras_dist.backends.tensorflow._cluster import (
    _multi_worker,
    _tpu_system,
    default_inter_op_threads,
    initialize_tpu_system,
)
from keras_dist.backends.tensorflow._strategies import (
    _GlobalBatchCentralStorageStrategy,
    _GlobalBatchMirroredStrategy,
    _GlobalBatchOneDeviceStrategy,
    _GlobalBatchTPUStrategy,
    _local_task,
    _task_devices,
    _tf_device,
)


def visible_devices() -> tuple[str, ...]:
    """This worker's devices."""
    engine = _multi_worker["engine"]
    if engine is not None:
        devices = _task_devices(engine.extended._worker_device)
    else:
        devices = tf.config.list_logical_devices()
        if any(d.name.startswith("/job:") for d in devices):
            # connected to a cluster (a ClusterCoordinator's): TF lists every
            # task's devices; this process's are those of its own task
            devices = _task_devices(_local_task())
    return tuple(_devices.canonical_device(d.name) for d in devices)


def simulate_cpu_devices(count: int) -> None:
    """Splits the host CPU into `count` logical TF devices (before TF starts).

    TF sizes its inter-op thread pool by the cores, not the devices: with 4
    logical devices on 2 cores, a `tf.function` that makes an iterator over
    a distributed dataset (a multi-device iterator) waited forever for a
    thread (plain tf.distribute too; 3 threads suffice there, 2 hang).
    Unless the user set it, the pool gets at least 2 threads more than
    devices (more would spin idle on few cores)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
        if tf.config.threading.get_inter_op_parallelism_threads() == 0:  # TF's default: one per core
            tf.config.threading.set_inter_op_parallelism_threads(max(os.cpu_count() or 1, count + 2))
    except RuntimeError as error:
        current = len(tf.config.list_logical_devices("CPU"))
        if current == count:
            return
        raise RuntimeError(
            f"TensorFlow already started with {current} logical CPU "
            f"device(s); cannot switch to {count}. Call "
            f"keras_dist.simulate_cpu_devices({count}) before any TensorFlow "
            "computation."
        ) from error


def global_devices() -> tuple[str, ...]:
    engine = _multi_worker["engine"]
    if engine is None:
        return visible_devices()
    workers = engine.extended._num_workers
    local = [_devices.canonical_device(d) for d in engine.extended.worker_devices]
    return tuple(f"worker{w}/{d}" for w in range(workers) for d in local)


_engines_created = itertools.count(1)
#: Collective-key range reserved for each tf.distribute strategy we create.
_COLLECTIVE_KEYS_PER_ENGINE = 100_000


def check_cross_device_ops(ops, devices) -> None:
    """Raises where tf.distribute would fail or be silently wrong."""
    if ops is None:
        return
    if isinstance(ops, HierarchicalCopyAllReduce) and len(devices) > 1 and len(devices) % 2:
        raise ValueError(
            f"HierarchicalCopyAllReduce needs an even number of devices on "
            f"TensorFlow; this strategy has {len(devices)}. TensorFlow's "
            "algorithm sums two equal halves of the devices, and with an odd "
            "count it leaves one replica's values out of the sum (silently "
            "wrong gradients). Use an even number of devices, "
            "keras_dist.ReductionToOneDevice(), or cross_device_ops=None."
        )
    if isinstance(ops, ReductionToOneDevice) and ops.reduce_to_device is not None:
        _devices.resolve_devices([ops.reduce_to_device], visible_devices())


def _tf_cross_device_ops(ops):
    """The tf.distribute object for a keras_dist cross-device ops choice."""
    if ops is None:
        return None
    if isinstance(ops, ReductionToOneDevice):
        device = ops.reduce_to_device
        return tf.distribute.ReductionToOneDevice(
            reduce_to_device=None if device is None else _tf_device(device),
            accumulation_fn=ops.accumulation_fn,
        )
    # NcclAllReduce, HierarchicalCopyAllReduce: tf.distribute's class of that name
    return getattr(tf.distribute, type(ops).__name__)(num_packs=ops.num_packs)


def create_engine(extended):
    """The tf.distribute strategy for a keras_dist `StrategyExtended`, by its
    `engine_kind`."""
    return engine_builder(_ENGINES, extended.engine_kind, "tensorflow")(extended)


def _parameter_server_engine(extended):
    from keras_dist.backends.tensorflow import _parameter_servers

    return _parameter_servers.create_engine(extended)


def _multi_worker_engine(extended):
    """The process's MultiWorkerMirroredStrategy (made when the job joined
    its cluster); one worker's job is a local one."""
    if len(extended.engine_devices) != len(extended.worker_devices):
        return _multi_worker["engine"]
    return _mirrored_engine(extended)


def _tpu_engine(extended):
    """tf's TPUStrategy on one worker's TPU cores; on CPU cores (the
    simulated TPU of the tests) or several workers, MULTI_WORKER's engine."""
    if len(extended.engine_devices) == len(extended.worker_devices) and any(
        d.startswith("tpu:") for d in extended.worker_devices
    ):
        initialize_tpu_system(extended.cluster_resolver)
        return _GlobalBatchTPUStrategy(_tpu_system["resolver"])
    return _multi_worker_engine(extended)


def check_inter_op_threads(devices) -> None:
    """Replicas on k CPU devices of this process need an inter-op pool of at
    least k + 1 threads: a tf.function that makes an iterator over a
    distributed dataset and runs a nested step function blocks a thread
    per replica until every replica's collective has arrived, and with
    fewer threads it waits for ever (plain tf.distribute too: 2 replicas
    hung with 2 threads, ran with 3; 3 hung with 3, ran with 4). On a
    2-core machine TF's default pool has 2. One clear error, before any
    variable exists, instead of a hang that depends on the program."""
    cpus = [d for d in devices if "CPU" in d.upper()]
    if len(cpus) < 2:
        return
    threads = tf.config.threading.get_inter_op_parallelism_threads() or default_inter_op_threads()
    if threads >= len(cpus) + 1:
        return
    raise ValueError(
        f"{len(cpus)} replicas on this process's CPU devices need TensorFlow's inter-op thread pool to have "
        f"at least {len(cpus) + 1} threads (replicas + 1); it has {threads}. With fewer, a step whose replicas "
        "wait on one another (an iterator made inside a tf.function, a nested step function) hangs for ever "
        "(plain tf.distribute too). Make the CPU devices with keras_dist.simulate_cpu_devices(n), which sizes "
        "the pool, or call tf.config.threading.set_inter_op_parallelism_threads("
        f"{len(cpus) + 1}) (or set TF_NUM_INTEROP_THREADS={len(cpus) + 1}) before TensorFlow starts."
    )


def _central_storage_engine(extended):
    check_inter_op_threads(extended.worker_devices)
    return _GlobalBatchCentralStorageStrategy(
        compute_devices=[_tf_device(d) for d in extended.worker_devices],
        parameter_device=_tf_device(extended.parameter_devices[0]),
    )


def _one_device_engine(extended):
    """tf's OneDeviceStrategy (plain variables, which `tf.GradientTape`
    reads in cross-replica context), its Keras input global as every
    engine's: tf's own input pipeline for it doubled fit's step time."""
    (device,) = extended.worker_devices
    return _GlobalBatchOneDeviceStrategy(_tf_device(device))


def _mirrored_engine(extended):
    check_inter_op_threads(extended.worker_devices)
    devices = [_tf_device(d) for d in extended.worker_devices]
    cross_device_ops = _tf_cross_device_ops(extended.cross_device_ops)
    # Every MirroredStrategy numbers its collective groups from the same
    # start, so two strategies over different device sets in one process
    # collide ("joining a group with size 4, but that group has size 2").
    # Give each engine its own key range (read once, in the constructor).
    engine_class = _GlobalBatchMirroredStrategy
    previous = engine_class._collective_key_base
    engine_class._collective_key_base = (
        next(_engines_created) * _COLLECTIVE_KEYS_PER_ENGINE
    )
    try:
        return engine_class(devices, cross_device_ops=cross_device_ops)
    finally:
        engine_class._collective_key_base = previous


#: EngineKind -> the function that builds its engine from the StrategyExtended.
_ENGINES = {
    EngineKind.LOCAL: _mirrored_engine,
    EngineKind.ONE_DEVICE: _one_device_engine,
    EngineKind.CENTRAL_STORAGE: _central_storage_engine,
    EngineKind.MULTI_WORKER: _multi_worker_engine,
    EngineKind.TPU: _tpu_engine,
    EngineKind.PARAMETER_SERVER: _parameter_server_engine,
}


def owns_variable(engine, variable) -> bool:
    value = getattr(variable, "_value", None)
    if value is None:
        return True
    if isinstance(engine, tf.distribute.ParameterServerStrategy):
        from keras_dist.backends.tensorflow import _parameter_servers

        return _parameter_servers.is_engine_variable(value)
    return getattr(value, "_distribute_strategy", None) is engine


def scope(engine):
    """Variables created inside are tf.distribute's, placed by `engine`
    (and passed through its `variable_creator`, where it has one)."""
    creator = getattr(engine, "variable_creator", None)
    if creator is None:
        return engine.scope()
    return _scope_with_creator(engine, creator)


@contextlib.contextmanager
def _scope_with_creator(engine, creator):
    with engine.scope(), tf.variable_creator_scope(creator):
        yield


