"""A TensorFlow multi-worker job: joining it (one process-wide
MultiWorkerMirroredStrategy, tf's coordination service), the TPU system, and
the collectives over workers (`values_from_chief`, `values_from_every_worker`).
As `backends/jax/_cluster.py` is for JAX."""

from __future__ import annotations

import os

import numpy as np
import tensorflow as tf
from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
from tensorflow.python.distribute import multi_worker_util
from tensorflow.python.eager import context as tf_context

from keras_dist.cluster_resolver._validate import check_bindable, check_worker_addresses_known
from keras_dist._communication import did_not_join_error, exit_unless_joined, join_timeout_seconds
from keras_dist.backends.tensorflow._strategies import _GlobalBatchMultiWorkerStrategy


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
    check_worker_addresses_known(resolver, "tensorflow")
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


def multi_worker_engine():
    """The process's tf MultiWorkerMirroredStrategy, or None."""
    return _multi_worker["engine"]


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


def default_inter_op_threads() -> int:
    """TensorFlow's inter-op pool size where none was set: TF_NUM_INTEROP_THREADS,
    else one thread per schedulable CPU."""
    threads = os.environ.get("TF_NUM_INTEROP_THREADS", "")
    if threads.strip().isdigit() and int(threads) > 0:
        return int(threads)
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
