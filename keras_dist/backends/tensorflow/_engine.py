"""TensorFlow engine: tf.distribute strategies that keep Keras' input global,
one process-wide MultiWorkerMirroredStrategy per job, and device lists."""

from __future__ import annotations

import contextlib

import itertools
import os

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.distribute import parameter_server_strategy
from tensorflow.python.distribute import ps_values
from tensorflow.python.eager import context as tf_context

from keras_dist import _devices
from keras_dist._engine_kind import EngineKind
from keras_dist.cluster_resolver._validate import check_bindable
from keras_dist._communication import did_not_join_error, exit_unless_joined, join_timeout_seconds
from keras_dist._cross_device_ops import HierarchicalCopyAllReduce, ReductionToOneDevice


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


def _local_task() -> str:
    """"/job:<job>/task:<i>" of this process in its cluster."""
    from tensorflow.python.eager import context as tf_context

    parts = tf_context.context().host_address_space().strip("/").split("/")
    return "/" + "/".join(p for p in parts if not p.startswith("replica:"))


def _task_devices(worker_device: str, device_type=None) -> list:
    """The logical devices of one task ("/job:worker/task:1"): once the
    cluster's server runs, TF lists the devices of every task."""
    job, task = worker_device.strip("/").split("/")[:2]
    return [
        d
        for d in tf.config.list_logical_devices(device_type)
        if f"/{job}/" in d.name and f"/{task}/" in d.name
    ]


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


#: The process's tf MultiWorkerMirroredStrategy: TF can join one cluster
#: per process, so every keras_dist strategy of the job shares it.
_multi_worker = {"engine": None, "cluster": None}


def _tf_communication_options(options):
    implementation = getattr(
        tf.distribute.experimental.CommunicationImplementation,
        options.implementation.value,
    )
    return tf.distribute.experimental.CommunicationOptions(
        bytes_per_pack=options.bytes_per_pack,
        # Not tf's per-collective timeout: each collective launched with one
        # starts an OS thread that sleeps out the timeout (tf's
        # SchedClosureAfter), ~4 a training step, so a long job with
        # timeout_seconds=60 died at ~16k threads. The coordination
        # service's heartbeat bounds a dead or frozen peer instead
        # (`_configure_coordination_service`).
        timeout_seconds=None,
        implementation=implementation,
    )


def initialize_multi_worker(resolver, options) -> None:
    """Joins the job through tf's MultiWorkerMirroredStrategy (once).

    TF's collective ops run between the workers' gRPC servers (the addresses
    in the cluster spec); the chief leads the collectives and broadcasts the
    initial value of every variable.
    """
    if resolver.num_workers <= 1:
        return
    jobs = {
        job: tasks
        for job, tasks in resolver.cluster_spec().as_dict().items()
        if job in ("chief", "worker")
    }
    cluster = (jobs, resolver.task_type, resolver.task_id)
    if _multi_worker["engine"] is not None:
        if _multi_worker["cluster"] != cluster:
            raise RuntimeError(
                "This process already joined another TensorFlow cluster; TF "
                "joins one per process. Create every MultiWorkerMirroredStrategy "
                "of a program from the same cluster resolver."
            )
        return
    if options.implementation.value == "NCCL" and not tf.config.list_logical_devices("GPU"):
        raise ValueError(
            "CommunicationImplementation.NCCL needs GPUs; this worker has none. "
            "Use AUTO or RING on CPU."
        )
    tf_resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs),
        task_type=resolver.task_type,
        task_id=resolver.task_id,
        rpc_layer="grpc",
    )
    own = resolver.cluster_spec().task_address(resolver.task_type, resolver.task_id)
    check_bindable(own, f"This task's address ({resolver.task_type}:{resolver.task_id})")
    timeout = join_timeout_seconds(options)
    _configure_coordination_service(jobs, timeout, options.timeout_seconds)
    try:
        # A non-leader's wait ends with tf's DeadlineExceededError; the
        # leader's does not end, so a watchdog ends it a little later.
        with exit_unless_joined(resolver, timeout, probe_addresses=True, grace=_LEADER_GRACE_SECONDS):
            engine = _GlobalBatchMultiWorkerStrategy(
                tf_resolver, _tf_communication_options(options)
            )
    except (RuntimeError, tf.errors.OpError) as error:
        if isinstance(error, (tf.errors.DeadlineExceededError, tf.errors.UnavailableError)):
            raise did_not_join_error(resolver, timeout, error) from error
        raise RuntimeError(
            f"Worker {resolver.worker_index} of {resolver.num_workers} could "
            f"not join the TensorFlow cluster {jobs}: {error}. Create "
            "MultiWorkerMirroredStrategy before any TensorFlow computation, "
            "and start every worker (keras-dist launch does)."
        ) from error
    _multi_worker["engine"] = engine
    _multi_worker["cluster"] = cluster


#: Seconds past the join timeout before the watchdog ends a waiting leader.
_LEADER_GRACE_SECONDS = 5


def _configure_coordination_service(jobs, timeout: float, peer_timeout: float | None = None) -> None:
    """tf's coordination service, as MultiWorkerMirroredStrategy would
    configure it, but with the wait for every task to register bounded by
    `timeout` (tf's own default is an hour: a peer that never starts looks
    like a hang), and, with `peer_timeout` (the user's `timeout_seconds`),
    a task whose heartbeat stops (dead or frozen) declared failed after half
    of it, which aborts the others' collectives (tf's per-collective
    timeout is not used: it leaked a thread per collective)."""
    context = tf_context.context()
    if context.coordination_service is not None:
        return  # configured by the user: theirs to bound
    spec = tf.train.ClusterSpec(jobs)
    context.configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(spec),
        cluster_register_timeout_in_ms=max(1, int(timeout * 1000)),
        heartbeat_timeout_in_ms=0 if peer_timeout is None else max(1000, int(peer_timeout * 500)),
        coordinated_jobs=[
            coordination_config_pb2.CoordinatedJob(name=job, num_tasks=spec.num_tasks(job))
            for job in ("chief", "worker")
            if job in spec.jobs
        ],
    )


def _has_tpu_runtime() -> bool:
    """A TPU this process could use (without asking the network)."""
    return bool(tf.config.list_physical_devices("TPU")) or bool(os.environ.get("TPU_NAME"))


def _tf_tpu_resolver(resolver):
    """tf's TPUClusterResolver for a keras_dist one (this TPU VM's slice)."""
    tpu = getattr(resolver, "tpu", None)
    return tf.distribute.cluster_resolver.TPUClusterResolver(tpu=tpu or "local")


_tpu_system = {"initialized": False}


def initialize_tpu_system(resolver) -> None:
    """tf's `initialize_tpu_system` where a TPU runtime is present (once);
    nothing on a machine without one (the CPU test hook)."""
    if _tpu_system["initialized"] or not _has_tpu_runtime():
        if resolver is not None and resolver.num_workers > 1 and not _has_tpu_runtime():
            raise RuntimeError(
                "A multi-host TPU slice needs real TPUs; this machine has no TPU "
                "runtime. For several CPU processes use "
                "keras_dist.MultiWorkerMirroredStrategy."
            )
        return
    # Not run by keras_dist's tests (no TPU here): tf's documented sequence.
    tf_resolver = _tf_tpu_resolver(resolver)
    tf.config.experimental_connect_to_cluster(tf_resolver)
    tf.tpu.experimental.initialize_tpu_system(tf_resolver)
    _tpu_system["initialized"] = True
    _tpu_system["resolver"] = tf_resolver


class _GlobalBatchTPUStrategy(tf.distribute.TPUStrategy):
    """tf.distribute.TPUStrategy whose Keras input stays global, as
    `_GlobalBatchMirroredStrategy` (used only on a real TPU: untested)."""

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed for want of a peer."""
    peer_errors = (
        tf.errors.DeadlineExceededError,
        tf.errors.UnavailableError,
        tf.errors.AbortedError,
        tf.errors.CancelledError,
    )
    return isinstance(error, peer_errors) and "ollective" in str(error)


def is_multi_process() -> bool:
    return _multi_worker["engine"] is not None


def _tf_device(canonical: str) -> str:
    """tf's full name of this process's device `canonical` ("cpu:1"): under
    its own task's name once it is connected to a cluster (a
    ClusterCoordinator's: "/job:chief/..."), else "/job:localhost/..."."""
    kind, index = canonical.split(":")
    from tensorflow.python.eager import context as tf_context

    return f"{tf_context.context().host_address_space()}/device:{kind.upper()}:{index}"


class _GlobalBatchMirroredStrategy(tf.distribute.MirroredStrategy):
    """tf.distribute.MirroredStrategy whose Keras input stays global.

    Keras hands each dataset to `experimental_distribute_dataset`; here that
    returns the dataset unchanged, so every step receives the whole global
    batch and each replica takes its own contiguous rows (`replica_step`).
    tf.data's own rebatching cannot do that exactly: with an unknown batch
    size (generators, PyDataset) it hands whole batches to replicas.
    """

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset


class _CentralStorageExtended(parameter_server_strategy.ParameterServerStrategyExtended):
    """tf's CentralStorage extended, with what Keras 3 needs of it.

    - Metric accumulators (``synchronization="on_read"``) get one partial
      value per compute device, aggregated when read (tf's SyncOnRead
      variables, as under MirroredStrategy). tf keeps them once and sums
      each replica's *write* in a merge_call, which is right for
      ``assign_add`` but not for Keras 3 metrics that write
      ``assign(var + x)`` (AUC: n * old + sum of the parts).
    - Non-trainable variables with no aggregation (BatchNormalization's
      moving statistics, seed states) take replica 0's write: keras_dist
      makes every replica compute the same value (global moments), and tf
      refuses an un-aggregated write in replica context.
    - A variable made inside a `tf.function` (a layer built lazily by the
      first call in a traced step) is wrapped as tf wraps one made
      eagerly; tf's own creator then fails (`Using a symbolic tf.Tensor as
      a Python bool`: it looks the variable up in graph collections, which
      Keras 3 does not use), under plain tf.distribute too.
    Everything else is tf's: one variable on the parameter device, and
    the optimizer applies the summed gradient there once.
    """

    def _create_var_creator(self, next_creator, **kwargs):
        if tf.executing_eagerly() or self._num_replicas_in_sync <= 1:
            return super()._create_var_creator(next_creator, **kwargs)
        aggregation = kwargs.pop("aggregation", tf.VariableAggregation.NONE)
        super()._create_var_creator(next_creator, aggregation=aggregation, **kwargs)  # tf's checks

        def var_creator(**kwargs):
            kwargs.pop("collections", None)
            return ps_values.AggregatingVariable(self._container_strategy(), next_creator(**kwargs), aggregation)

        return var_creator

    def _create_variable(self, next_creator, **kwargs):
        synchronization = kwargs.get("synchronization")
        if synchronization == tf.VariableSynchronization.ON_READ and "colocate_with" not in kwargs:
            return self._create_per_device_variable(next_creator, **kwargs)
        if (
            kwargs.get("aggregation", tf.VariableAggregation.NONE) == tf.VariableAggregation.NONE
            and not kwargs.get("trainable", True)
        ):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return super()._create_variable(next_creator, **kwargs)

    def _create_per_device_variable(self, next_creator, **kwargs):
        devices = self._compute_devices

        def creator(**kwargs):
            created = []
            for index, device in enumerate(devices):
                with tf.device(device):
                    if index:
                        first = created[0]
                        kwargs["initial_value"] = lambda: tf.identity(first.value())
                        kwargs["name"] = "%s/replica_%d/" % (first.name.split(":")[0], index)
                    with tf_context.device_policy(tf_context.DEVICE_PLACEMENT_SILENT):
                        created.append(next_creator(**kwargs))
            return created

        return distribute_utils.create_mirrored_variable(
            self._container_strategy(),
            creator,
            distribute_utils.VARIABLE_CLASS_MAPPING,
            distribute_utils.VARIABLE_POLICY_MAPPING,
            **kwargs,
        )


class _GlobalBatchCentralStorageStrategy(tf.distribute.experimental.CentralStorageStrategy):
    """tf.distribute's CentralStorageStrategy whose Keras input stays global
    (as `_GlobalBatchMirroredStrategy`): variables live once, on the
    parameter device; each replica takes its rows of the global batch."""

    def __init__(self, compute_devices, parameter_device):
        # tf's constructor hard-codes its extended class; build ours instead.
        distribute_lib.Strategy.__init__(
            self,
            _CentralStorageExtended(
                self, compute_devices=compute_devices, parameter_device=parameter_device
            ),
        )

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset


class _LocalCpusCollectiveExtended(
    collective_all_reduce_strategy.CollectiveAllReduceExtended
):
    """tf's multi-worker extended, with one replica per local logical CPU.

    tf gives a GPU-less worker a single CPU replica; keras_dist simulates
    several CPU devices per worker, so each becomes a replica, as on GPUs.
    """

    def _initialize_local_devices(self, cluster_resolver, worker_device):
        devices, kind = super()._initialize_local_devices(
            cluster_resolver, worker_device
        )
        cpus = _task_devices(worker_device, "CPU")
        if kind == "CPU" and len(cpus) > 1:
            devices = tuple(
                f"{worker_device}/device:CPU:{i}" for i in range(len(cpus))
            )
        return devices, kind

    def _use_merge_call(self):
        # Replica all-reduces launch their collectives directly, as tf does
        # for XLA on GPUs; through merge_call, tensors without a device get
        # no destination in graph mode ("destinations can not be empty").
        return False


class _GlobalBatchMultiWorkerStrategy(tf.distribute.MultiWorkerMirroredStrategy):
    """tf.distribute.MultiWorkerMirroredStrategy whose Keras input stays global.

    Every worker receives the same global batch and each replica (numbered
    across workers) takes its own contiguous rows, as in
    `_GlobalBatchMirroredStrategy`.
    """

    def __init__(self, cluster_resolver, communication_options):
        # tf's constructor hard-codes its extended class; build ours instead.
        distribute_lib.Strategy.__init__(
            self,
            _LocalCpusCollectiveExtended(
                self,
                cluster_resolver=cluster_resolver,
                communication_options=communication_options,
            ),
        )

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset


# tf names the strategy class in its messages ("Using %s eagerly has
# significant overhead ..."): the user's strategy's name, not these
# private classes' (their __qualname__, in tracebacks, stays).
for _engine_class, _public_name in (
    (_GlobalBatchTPUStrategy, "TPUStrategy"),
    (_GlobalBatchMirroredStrategy, "MirroredStrategy"),
    (_GlobalBatchCentralStorageStrategy, "CentralStorageStrategy"),
    (_GlobalBatchMultiWorkerStrategy, "MultiWorkerMirroredStrategy"),
):
    _engine_class.__name__ = _public_name
del _engine_class, _public_name

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
    return _ENGINES[extended.engine_kind](extended)


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


def _central_storage_engine(extended):
    return _GlobalBatchCentralStorageStrategy(
        compute_devices=[_tf_device(d) for d in extended.worker_devices],
        parameter_device=_tf_device(extended.parameter_devices[0]),
    )


def _mirrored_engine(extended):
    devices = [_tf_device(d) for d in extended.worker_devices]
    cross_device_ops = _tf_cross_device_ops(extended.cross_device_ops)
    # OneDeviceStrategy runs on a one-device MirroredStrategy: the same
    # placement, but Keras' fit through tf.distribute.OneDeviceStrategy's
    # input pipeline costs about 2x the step time of plain Keras.
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




def multi_worker_engine():
    """The process's tf MultiWorkerMirroredStrategy, or None."""
    return _multi_worker["engine"]


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


def values_from_chief(values):
    """The chief's values of host `values`, on every worker: replica 0 (on
    the chief) contributes each value, the others zeros, summed by the
    engine's own all-reduce (exact: x + 0 = x). Unchanged outside a job."""
    values = list(values)
    engine = _multi_worker["engine"]
    if engine is None or not values:
        return values
    tensors = [tf.convert_to_tensor(v) for v in values]

    def replica(*parts):
        context = tf.distribute.get_replica_context()
        first = tf.equal(tf.cast(context.replica_id_in_sync_group, tf.int32), 0)
        masked = [tf.where(first, part, tf.zeros_like(part)) for part in parts]
        return context.all_reduce(tf.distribute.ReduceOp.SUM, masked)

    summed = engine.run(replica, args=tuple(tensors))
    return [engine.experimental_local_results(value)[0].numpy() for value in summed]


#: engine -> its tf.function gathering every worker's values (traced once
#: per signature).
_gather_functions: dict = {}


def _gather_function(engine, count: int):
    # one per number of values: tf's retracing cannot relax a varargs
    # signature to another length (IndexError in its function cache)
    function = _gather_functions.get((id(engine), count))
    if function is not None:
        return function
    workers = engine.extended._num_workers
    local = len(engine.extended.worker_devices)

    def replica(*parts):
        # Replica r of the group is local replica r % local of worker
        # r // local (tf numbers them so); the first local replica of each
        # worker puts its values in the worker's row of zeros, and the sum
        # over all replicas stacks the workers' rows (exact: x + 0 = x).
        context = tf.distribute.get_replica_context()
        replica_id = tf.cast(context.replica_id_in_sync_group, tf.int32)
        first = tf.equal(replica_id % local, 0)
        rows = []
        for part in parts:
            row = tf.scatter_nd([[replica_id // local]], part[tf.newaxis], tf.concat([[workers], tf.shape(part)], 0))
            rows.append(tf.where(first, row, tf.zeros_like(row)))
        # one all-reduce each: tf packs a list into one tensor of one dtype
        return [context.all_reduce(tf.distribute.ReduceOp.SUM, row) for row in rows]

    @tf.function(reduce_retracing=True)
    def gather(*tensors):
        return engine.run(replica, args=tensors)

    _gather_functions[(id(engine), count)] = gather
    return gather


def values_from_every_worker(values):
    """Every worker's host `values`, stacked in worker order along a new
    first axis, on every worker: one all-reduce of the engine's (tf's
    collective ops) over zeros holding each worker's values in its row.
    Outside a job, each value with a first axis of length 1."""
    values = [np.asarray(v) for v in values]
    engine = _multi_worker["engine"]
    if engine is None or not values:
        return [v[None] for v in values]
    stacked = _gather_function(engine, len(values))(*[tf.convert_to_tensor(v) for v in values])
    return [engine.experimental_local_results(value)[0].numpy() for value in stacked]
