"""ParameterServerStrategy on TensorFlow: tf's own strategy, coordinator and
servers, with what Keras 3 breaks fixed.

- The engine is tf's `ParameterServerStrategy` over the cluster's gRPC
  servers (`keras_dist.Server`, one process per ps and worker task); the
  coordinator is tf's `ClusterCoordinator` (it re-queues the functions of a
  worker that fails on the others, and raises on a ps failure).
- Keras 3 writes `assign_add`/`assign_sub` as ``assign(v + x)``: two workers
  reading v before either writes lose one increment (`iterations` counted 47
  of 60 scheduled steps with 2 workers). `assign_delta` applies them as tf's
  own `AssignAddVariableOp` on the ps, which holds the variable's lock.
- A partitioner that splits a variable makes tf's `ShardedVariable`, one
  shard per ps. The Keras variable holds it (layers compute with all its
  rows), but a gradient tape watches one handle per variable, so trainers
  and optimizers see one Keras variable per shard instead
  (`variable_parts`, through the hooks on `Layer.weights` and
  `trainable_variables`), as tf.keras 2 listed the shards; `get_weights` /
  `set_weights` see the variable whole.
- Exactly once: tf's coordinator re-runs the function of a worker that
  died, so a function whose writes had reached the ps ran them twice
  (at-least-once). Every write a scheduled function makes to a ps variable
  goes through a gate keyed by the function's id (`_exactly_once`).
- Input stays as the caller gives it: `fit` schedules on per-worker datasets
  (`create_per_worker_dataset`), and `evaluate`/`predict` run inline on the
  coordinator (as tf.keras 2 did without `pss_evaluation_shards`).
"""

from __future__ import annotations

import contextlib
import re

import numpy as np
import tensorflow as tf
from tensorflow.python.distribute import ps_values
from tensorflow.python.distribute import sharded_variable
from tensorflow.python.distribute.coordinator import values as tf_coordinator_values

from keras_dist import _heartbeat as heartbeat
from keras_dist.backends.tensorflow import _exactly_once
from keras_dist.backends.tensorflow._cluster import default_inter_op_threads


class _KerasParameterServerStrategy(tf.distribute.ParameterServerStrategy):
    """tf's ParameterServerStrategy whose `experimental_distribute_dataset`
    (Keras' evaluate/predict, inline on the coordinator) leaves the dataset
    as it is, as keras_dist's other engines do; variables it splits come
    out readable by NumPy (`variable_creator`, entered with its scope)."""

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset

    @staticmethod
    def variable_creator(next_creator, **kwargs):
        value = next_creator(**kwargs)
        if type(value) is sharded_variable.ShardedVariable:
            value = _KerasShardedVariable(value.variables, kwargs.get("trainable", True), name=value.name)
        return value


class _KerasShardedVariable(sharded_variable.ShardedVariable):
    """tf's ShardedVariable as a Keras variable holds it: `np.asarray` reads
    it whole (Keras reads a variable so to save it), and `keras_parts`, one
    Keras variable per shard, made with it (a variable made later could be
    in a stateless scope, where Keras refuses to make one)."""

    def __init__(self, variables, trainable, name):
        super().__init__(variables, name=name)
        import keras

        base = name.split("/")[-1].split(":")[0]
        self.keras_parts = [
            keras.Variable(shard, trainable=trainable, name=f"{base}_part_{index}")
            for index, shard in enumerate(variables)
        ]

    def __array__(self, dtype=None, copy=None):
        return np.asarray(tf.convert_to_tensor(self).numpy(), dtype=dtype)


def variable_parts(variable):
    """The Keras variables, one per shard, of a Keras variable holding a
    ShardedVariable of this engine's (made with it); None otherwise."""
    return getattr(getattr(variable, "_value", None), "keras_parts", None)


def create_engine(extended):
    """tf's ParameterServerStrategy for keras_dist's `_ParameterServerExtended`."""
    spec = extended.cluster_resolver.cluster_spec()
    jobs = spec.as_dict()
    # The coordinator is the cluster's chief task; a cluster with no chief
    # job (tf's parameter-server tutorial: this process coordinates, its
    # servers are workers and ps) gets none, and tf adds this process to the
    # cluster as the coordinator.
    chief = "chief" in jobs
    resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
        tf.train.ClusterSpec(jobs), task_type="chief" if chief else None, task_id=0 if chief else None, rpc_layer="grpc"
    )
    engine = _KerasParameterServerStrategy(
        resolver, variable_partitioner=extended.variable_partitioner
    )
    # evaluate/predict run inline on the coordinator: no warning per call
    engine.extended._allow_run_without_coordinator = True
    # optimizer updates (tf's extended.update) in a scheduled function: once
    engine.extended._update = _exactly_once.gated_update(engine.extended._update)
    return engine


def is_engine_variable(value) -> bool:
    """A tf variable placed by a ParameterServerStrategy (on a ps task)."""
    if isinstance(value, (ps_values.CachingVariable, ps_values.AggregatingVariable, sharded_variable.ShardedVariable)):
        return True
    return isinstance(value, tf.Variable) and "/job:ps/" in (value.device or "")


def assign_delta(variable, value, sign):
    """tf's atomic assign_add/assign_sub for a variable on a ps (in a
    scheduled function: once, in a gate); None (Keras' own method runs)
    for any other, and for an optimizer's own variable in its
    `SnapshotScope` (the scope keeps the write)."""
    target = getattr(variable, "_value", None)
    if target is None or not is_engine_variable(target):
        return None
    snapshot_scope = _exactly_once.current_snapshot_scope()
    if snapshot_scope is not None and snapshot_scope.holds(variable):
        return None
    kind = "assign_add" if sign > 0 else "assign_sub"
    if _exactly_once.in_closure():
        return _exactly_once.assign(target, value, kind)
    value = tf.cast(tf.convert_to_tensor(value), target.dtype)
    return getattr(target, kind)(value)


def assign_on_ps(variable, value):
    """`variable.assign(value)` of a ps variable in a scheduled function:
    once, in a gate. None elsewhere (Keras' own assign runs), and in any
    stateless scope (it keeps the write)."""
    from keras.src.backend.common.stateless_scope import in_stateless_scope

    target = getattr(variable, "_value", None)
    if not _exactly_once.in_closure() or in_stateless_scope() or target is None:
        return None
    if not is_engine_variable(target) or isinstance(target, sharded_variable.ShardedVariable):
        return None
    return _exactly_once.assign(target, value, "assign")


def apply_optimizer(optimizer, build, apply):
    """Keras' `optimizer.apply` (`apply()`), in a scheduled function with
    its own variables read once and its writes gated; elsewhere as is
    (`apply()` builds the optimizer itself there)."""
    if not _exactly_once.in_closure():
        return apply()
    import keras

    own = [optimizer._iterations, getattr(optimizer, "_learning_rate", None)]
    own = [v for v in own if isinstance(v, keras.Variable) and is_engine_variable(v._value)]
    if build is not None:  # first apply (tf's tutorial never builds its RMSprop)
        build = _built_on_ps(build)
    return _exactly_once.apply_optimizer(own, build, apply)


def _built_on_ps(build):
    """`build` run outside the scheduled function being traced (eagerly, on
    the coordinator, in the strategy's cross-replica context), so the optimizer's slots
    are made on the ps as the model's variables were (traced inside the
    function they landed on the coordinator, and the first update failed:
    "Cannot place the graph ... /job:chief/... vs /job:ps/...")."""
    def merge_fn(_strategy):
        with tf.init_scope():
            build()

    return lambda: tf.distribute.get_replica_context().merge_call(merge_fn)


def create_coordinator(strategy):
    engine = strategy.extended.engine
    _check_in_process_worker_threads(strategy.extended.cluster_resolver.cluster_spec().as_dict())
    coordinator = tf.distribute.experimental.coordinator.ClusterCoordinator(engine)
    if not hasattr(coordinator, "_keras_dist_gates"):  # tf: one per strategy
        coordinator._keras_dist_gates = _exactly_once.ClosureGates()
    return coordinator


def _engine_argument(value):
    from keras_dist.coordinator import PerWorkerValues

    if isinstance(value, PerWorkerValues):
        return tf_coordinator_values.PerWorkerValues(tuple(value._values))
    return value


_PS_ERROR = re.compile(r"remote target /job:ps/replica:0/task:(\d+)")


@contextlib.contextmanager
def _explain_ps_failure():
    """tf's error for a lost parameter server, as one clear error: the
    variables on it are gone, so the job cannot go on (tf raises it too;
    a lost worker is re-scheduled instead and never reaches here)."""
    try:
        yield
    except (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError) as error:
        found = _PS_ERROR.search(str(error))
        if found is None:
            raise
        from keras_dist._communication import PeerWorkerError

        raise PeerWorkerError(
            f"Parameter server ps:{found.group(1)} failed (unreachable): the "
            "variables it held are lost, so training cannot continue. Restart "
            "the whole job (coordinator, ps and worker tasks) and restore from a "
            "checkpoint (keras.callbacks.BackupAndRestore or ModelCheckpoint). "
            f"Engine error: {type(error).__name__}: {str(error).strip().splitlines()[0]}"
        ) from error


def schedule(coordinator, fn, args, kwargs):
    """tf's `schedule` of `fn` traced with its writes gated, its id first."""
    heartbeat.beat()
    gates = coordinator._keras_dist_gates
    function = gates.closure_function(fn)
    args = (gates.next_id(), *(_engine_argument(a) for a in args))
    kwargs = {k: _engine_argument(v) for k, v in kwargs.items()}
    with _explain_ps_failure():
        return coordinator.schedule(function, args=args, kwargs=kwargs)


def fetch(coordinator, remote_value):
    heartbeat.beat()
    with _explain_ps_failure():
        return remote_value.fetch()


def join(coordinator):
    heartbeat.beat()
    with _explain_ps_failure():
        coordinator.join()
    # nothing in flight: no function can run again, its keys can go
    coordinator._keras_dist_gates.forget()


def done(coordinator):
    with _explain_ps_failure():
        return coordinator.done()


def create_per_worker_dataset(coordinator, dataset_fn):
    return coordinator.create_per_worker_dataset(dataset_fn)


def make_step_function(model, engine):
    """fit's step for the coordinator to schedule: a tf.function taking the
    per-worker iterator, running `steps_per_execution` of Keras'
    `train_step` on the worker (tf.keras 2's loop), returning the last
    step's logs."""
    steps = int(model.steps_per_execution)

    def one_step(iterator):
        outputs = engine.run(model.train_step, args=(next(iterator),))
        return tf.nest.map_structure(lambda v: engine.experimental_local_results(v)[0], outputs)

    def step(iterator):
        outputs = one_step(iterator)
        for _ in tf.range(steps - 1):
            outputs = one_step(iterator)
        return outputs

    # tf's coordinator schedules tf.functions only: traced even with run_eagerly
    return tf.function(step)


#: The worker servers started in this process: address -> their config's
#: inter-op threads (0: TensorFlow's default).
_IN_PROCESS_WORKERS: dict = {}


def _check_in_process_worker_threads(cluster):
    """tf's worker servers in the coordinator's own process (the tf tutorial's
    `create_in_process_cluster`) each need an inter-op pool of at least
    workers + 1 threads: with fewer, their scheduled functions wait on one
    another for ever and `join` never returns (plain tf.distribute too;
    measured here: 2 workers need 3, 3 need 4). One clear error instead,
    before anything is scheduled."""
    workers = [address for address in cluster.get("worker", ()) if address in _IN_PROCESS_WORKERS]
    if not workers:
        return
    needed = len(workers) + 1
    short = {}
    for address in workers:
        threads = _IN_PROCESS_WORKERS[address] or default_inter_op_threads()
        if threads < needed:
            short[address] = threads
    if short:
        raise ValueError(
            f"{len(workers)} worker servers of this cluster run in this process, and "
            f"{len(short)} of them have {sorted(set(short.values()))} inter-op threads: TensorFlow's "
            f"in-process workers need at least {needed} (workers + 1), or the functions they run wait "
            "on one another for ever (plain tf.distribute hangs the same way). Give each worker's "
            "keras_dist.Server a config with `config.inter_op_parallelism_threads = "
            f"{needed}` (config = tf.compat.v1.ConfigProto(), as the tf tutorial's "
            "create_in_process_cluster does), or run the tasks as processes "
            "(keras-dist launch --workers N --ps M)."
        )


class EngineServer:
    """tf.distribute.Server, as `keras_dist.Server`'s engine."""

    def __init__(self, cluster, job_name, task_index, protocol, config, start):
        self._server = tf.distribute.Server(
            tf.train.ClusterSpec(cluster),
            job_name=job_name,
            task_index=task_index,
            protocol=protocol or "grpc",
            config=config,
            start=start,
        )
        if job_name == "worker":
            _IN_PROCESS_WORKERS[tf.train.ClusterSpec(cluster).task_address(job_name, task_index)] = (
                getattr(config, "inter_op_parallelism_threads", 0)
            )

    @property
    def target(self) -> str:
        return self._server.target

    def start(self) -> None:
        self._server.start()

    def join(self) -> None:
        self._server.join()


def create_server(cluster, job_name, task_index, protocol, config, start):
    return EngineServer(cluster, job_name, task_index, protocol, config, start)
