"""TensorFlow implementation of the backend adapter protocol."""

from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import distribute_lib

from keras_dist import _devices, _moments, _shard
from keras_dist._cross_device_ops import HierarchicalCopyAllReduce, ReductionToOneDevice
from keras_dist._shard import in_replica_step, scale_factor, unscale_factor  # noqa: F401

name = "tensorflow"


def visible_devices() -> tuple[str, ...]:
    """This worker's devices."""
    engine = _multi_worker["engine"]
    devices = (
        tf.config.list_logical_devices()
        if engine is None
        else _task_devices(engine.extended._worker_device)
    )
    return tuple(_devices.canonical_device(d.name) for d in devices)


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
    """Splits the host CPU into `count` logical TF devices (before TF starts)."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)]
        )
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
        timeout_seconds=options.timeout_seconds,
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
    try:
        engine = _GlobalBatchMultiWorkerStrategy(
            tf_resolver, _tf_communication_options(options)
        )
    except RuntimeError as error:
        raise RuntimeError(
            f"Worker {resolver.worker_index} of {resolver.num_workers} could "
            f"not join the TensorFlow cluster {jobs}: {error}. Create "
            "MultiWorkerMirroredStrategy before any TensorFlow computation, "
            "and start every worker (keras-dist launch does)."
        ) from error
    _multi_worker["engine"] = engine
    _multi_worker["cluster"] = cluster


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
    kind, index = canonical.split(":")
    return f"/job:localhost/replica:0/task:0/device:{kind.upper()}:{index}"


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


def create_engine(strategy):
    if len(strategy._engine_devices()) != len(strategy.extended.worker_devices):
        return _multi_worker["engine"]
    devices = [_tf_device(d) for d in strategy.extended.worker_devices]
    cross_device_ops = _tf_cross_device_ops(strategy._cross_device_ops)
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


def scope(engine):
    return engine.scope()


def owns_variable(engine, variable) -> bool:
    value = getattr(variable, "_value", None)
    if value is None:
        return True
    return getattr(value, "_distribute_strategy", None) is engine


def _host_device():
    # partial: merges with the replica's job/task, so it is this worker's CPU
    return "/device:CPU:0"


def slice_for_replica(data):
    """Inside a replica: this replica's contiguous rows of the global batch.

    Returns ``(local_data, local_rows, global_rows)``. Shards differ in size
    by at most one row, larger ones first (see `keras_dist._split`); slicing
    happens on the host so only each replica's rows reach its device.
    """
    context = tf.distribute.get_replica_context()
    num_replicas = context.num_replicas_in_sync
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    first = next(x for x in tf.nest.flatten(data) if x is not None)
    with tf.device(_host_device()):
        global_rows = tf.shape(first)[0]
        base, extra = global_rows // num_replicas, global_rows % num_replicas
        start = replica * base + tf.minimum(replica, extra)
        size = base + tf.cast(replica < extra, tf.int32)
        local = tf.nest.map_structure(
            lambda x: None if x is None else x[start : start + size], data
        )
    return local, size, global_rows


def replica_step(step_fn, metric_variables, metric_results):
    """Wraps a Keras train/test step to run as one replica of many.

    Each replica takes its rows of the global batch; while the step runs,
    the loss hooks scale this replica's loss by local rows / global rows.
    The replica-local logs are then replaced by global ones: the metric
    variables are all-reduced in one batch (by each variable's aggregation)
    and `metric_results()` is evaluated on those values, so every replica
    returns the metrics of the whole global batch (plain collectives, no
    merge_call).
    """

    def step(data):
        local, local_rows, global_rows = slice_for_replica(data)
        shard = _shard.Shard(
            tf.cast(local_rows, tf.float32), tf.cast(global_rows, tf.float32)
        )
        with _shard.shard_scope(shard):
            logs = step_fn(local)
        return _global_logs(logs, metric_variables(), metric_results)

    return step


def _global_logs(logs, variables, metric_results):
    import keras

    context = tf.distribute.get_replica_context()
    if not isinstance(logs, dict):  # a custom train_step's own structure
        return tf.nest.map_structure(
            lambda v: context.all_reduce(tf.distribute.ReduceOp.MEAN, v), logs
        )
    values = _all_reduce_variables(context, variables)
    with keras.StatelessScope(state_mapping=list(zip(variables, values))):
        results = metric_results()
    return {
        key: results[key]
        if key in results
        else context.all_reduce(tf.distribute.ReduceOp.MEAN, value)
        for key, value in logs.items()
    }


def _all_reduce_variables(context, variables):
    """Each variable's value over all replicas, by its aggregation."""
    local = [tf.convert_to_tensor(v.value) for v in variables]
    ops = {"sum": tf.distribute.ReduceOp.SUM, "mean": tf.distribute.ReduceOp.MEAN}
    reduced = list(local)
    for aggregation, op in ops.items():
        indices = [i for i, v in enumerate(variables) if v.aggregation == aggregation]
        if indices:
            out = context.all_reduce(op, [local[i] for i in indices])
            for i, value in zip(indices, out):
                reduced[i] = value
    first = [i for i, v in enumerate(variables) if v.aggregation == "only_first_replica"]
    if first:
        is_first = tf.equal(tf.cast(context.replica_id_in_sync_group, tf.int32), 0)
        masked = [
            local[i] * tf.cast(is_first, local[i].dtype) for i in first
        ]
        out = context.all_reduce(tf.distribute.ReduceOp.SUM, masked)
        for i, value in zip(first, out):
            reduced[i] = value
    return reduced


def make_step_function(
    engine, step_fn, metric_variables, metric_results, steps_per_execution, run_eagerly
):
    """A Keras ``train_function``/``test_function`` for `engine`.

    Runs up to `steps_per_execution` global batches per call, each through
    one compiled distributed step, and returns the last step's logs. The
    loop is in Python: Keras 3's in-graph loop (a while_loop over optional
    batches) fails under MirroredStrategy (seen with Keras 3.15.1 + TF 2.21:
    "You must feed a value for placeholder tensor 'while/cond/...'").
    """
    replica = replica_step(step_fn, metric_variables, metric_results)

    def one_step(data):
        outputs = engine.run(replica, args=(data,))
        # every replica returns the same global logs: keep replica 0's
        return tf.nest.map_structure(
            lambda value: engine.experimental_local_results(value)[0], outputs
        )

    if not run_eagerly:
        one_step = tf.function(one_step, reduce_retracing=True)

    def function(iterator):
        logs = None
        for _ in range(steps_per_execution):
            try:
                data = next(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                if logs is None:
                    raise StopIteration
                break
            logs = one_step(data)
        return logs

    function.one_step = one_step  # for inspection (tests read its graph)
    return function


def make_predict_function(engine, predict_step, run_eagerly: bool):
    """Predict over a list of global batches; rows come back in input order."""

    def replica_predict(data):
        local, _, _ = slice_for_replica(data)
        return predict_step(local)

    def one_batch(data):
        outputs = engine.run(replica_predict, args=(data,))
        if engine is _multi_worker["engine"]:  # every worker gets all rows
            return tf.nest.map_structure(
                lambda value: engine.gather(value, axis=0), outputs
            )
        return tf.nest.map_structure(
            lambda value: _concat(engine.experimental_local_results(value)),
            outputs,
        )

    if not run_eagerly:
        one_batch = tf.function(one_batch, reduce_retracing=True)

    def predict_function(batches):
        outputs = [one_batch(batch) for batch in batches]
        if len(outputs) == 1:
            return outputs[0]
        return tf.nest.map_structure(lambda *parts: _concat(parts), *outputs)

    return predict_function


def _concat(tensors):
    if tensors[0].shape.rank == 0:
        return tf.stack(tensors)
    return tf.concat(tensors, axis=0)


def global_moments(inputs, axes, mask):
    """BatchNormalization moments over the global batch (see `keras_dist._moments`)."""
    context = tf.distribute.get_replica_context()

    def all_reduce_sum(values):
        return list(context.all_reduce(tf.distribute.ReduceOp.SUM, list(values)))

    return _moments.global_moments(inputs, axes, mask, all_reduce_sum)


def time_all_reduce(engine, shapes_and_dtypes, repeats: int = 5) -> float:
    """Median seconds to all-reduce buffers of these shapes over the engine.

    One `tf.function` sums one buffer per shape across the replicas with
    `ReplicaContext.all_reduce`, the path the training step's gradients
    take (the engine's cross-device ops, its packing). The buffers are put
    on the replicas' devices beforehand, so only the reduction is timed.
    """
    import time

    import numpy as np

    if engine.num_replicas_in_sync == 1 or not shapes_and_dtypes:
        return 0.0
    buffers = engine.experimental_distribute_values_from_function(
        lambda context: [tf.zeros(shape, dtype) for shape, dtype in shapes_and_dtypes]
    )

    def replica(values):
        context = tf.distribute.get_replica_context()
        summed = context.all_reduce(tf.distribute.ReduceOp.SUM, values)
        return tf.add_n([tf.reshape(v, [-1])[0] for v in summed if v.shape.num_elements()])

    @tf.function
    def program(values):
        return engine.run(replica, args=(values,))

    def call():
        engine.experimental_local_results(program(buffers))[0].numpy()

    call()  # trace and warm up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return float(np.median(times))
