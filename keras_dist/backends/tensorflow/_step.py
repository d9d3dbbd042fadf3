"""TensorFlow: the steps behind `fit`, `evaluate` and `predict`.

Every step receives the whole global batch; each replica takes its own
contiguous rows (`slice_for_replica`) and runs Keras' own step on them,
with the loss hooks scaling its loss by its share of the global batch and
BatchNormalization taking global moments. Logs are read from metric
variables all-reduced across replicas, so they are the global batch's.
"""

from __future__ import annotations

import functools

import numpy as np
import tensorflow as tf

from keras_dist import _heartbeat as heartbeat
from keras_dist import _metric_state, _moments, _shard
from keras_dist._engine_kind import EngineKind
from keras_dist._split import replica_shard
from keras_dist.backends.tensorflow import _cluster, _replica


def _host_device():
    # partial: merges with the replica's job/task, so it is this worker's CPU
    return "/device:CPU:0"


def slice_for_replica(data):
    """Inside a replica: this replica's contiguous rows of the global batch.

    Returns a `_shard.Shard` and the local data. Shards differ in size
    by at most one row, larger ones first (see `keras_dist._split`); slicing
    happens on the host so only each replica's rows reach its device.
    """
    context = tf.distribute.get_replica_context()
    num_replicas = context.num_replicas_in_sync
    replica = tf.cast(context.replica_id_in_sync_group, tf.int32)
    first = next(x for x in tf.nest.flatten(data) if x is not None)
    with tf.device(_host_device()):
        global_rows = tf.shape(first)[0]
        start, size = replica_shard(global_rows, num_replicas, replica)
        local = tf.nest.map_structure(
            lambda x: None if x is None else x[start : start + size], data
        )
    return _shard.Shard(size, global_rows, start, replicas=num_replicas), local


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
        shard, local = slice_for_replica(data)
        with _shard.shard_scope(shard):
            logs = step_fn(local)
        return _global_logs(logs, metric_variables(), metric_results)

    return step


def _all_reduce(op, values):
    """The replicas' `op` of `values`, in replica context: `values` itself
    for one replica (tf's one-device MirroredStrategy finds no destination
    for a tensor made in a traced step: "destinations can not be empty")."""
    context = tf.distribute.get_replica_context()
    if context.num_replicas_in_sync == 1:
        return values
    return _replica.all_reduce_in_replica(context, op, values)


def _global_logs(logs, variables, metric_results):
    context = tf.distribute.get_replica_context()

    def combined():  # a sync-on-read metric variable holds this replica's part
        return _metric_state.combine_by_aggregation(
            variables,
            [tf.convert_to_tensor(v.value) for v in variables],
            lambda parts: _all_reduce(tf.distribute.ReduceOp.SUM, parts),
            tf.equal(tf.cast(context.replica_id_in_sync_group, tf.int32), 0),
            context.num_replicas_in_sync,
        )

    return _metric_state.global_logs(
        logs, variables, combined, metric_results, lambda v: _all_reduce(tf.distribute.ReduceOp.MEAN, v)
    )


class BatchSizeFreeFunction:
    """`tf.function(fn)` traced once for every global batch size (once per
    structure of the batch).

    Every replica slices its rows by the batch's dynamic size
    (`slice_for_replica`), so nothing inside depends on the static one; the
    first call traces with the batch dimension unknown, and a last, partial
    batch then reuses that trace (plain `reduce_retracing` traced the step a
    second time for it: one more replica graph per replica, 0.3-0.8 s of
    CPU per fit, evaluate and predict on 4 replicas). A batch that is not
    a structure of dense tensors of rank 1 or more is traced as tf traces it.
    """

    def __init__(self, fn):
        #: The `tf.function` itself.
        self.function = tf.function(fn, reduce_retracing=True)
        self._structures = []

    def __call__(self, data):
        structure = tf.nest.map_structure(lambda x: None, data)
        if structure not in self._structures:  # on_batch methods add a None sample weight
            self._structures.append(structure)
            specs = _batch_size_free_specs(data)
            if specs is not None:
                self.function.get_concrete_function(specs)
        return self.function(data)

    def get_concrete_function(self, *args, **kwargs):
        return self.function.get_concrete_function(*args, **kwargs)


def _batch_size_free_specs(data):
    """`data`'s TensorSpecs with an unknown first dimension (None stays
    None), or None if a leaf is not a dense tensor or NumPy array (the
    on-batch methods pass those) of rank 1 or more."""
    leaves = [x for x in tf.nest.flatten(data) if x is not None]
    if not leaves or not all(isinstance(x, (tf.Tensor, np.ndarray)) and len(x.shape) for x in leaves):
        return None
    try:  # a NumPy array of Python objects (strings) has no tf dtype
        return tf.nest.map_structure(
            lambda x: None if x is None else tf.TensorSpec([None, *x.shape[1:]], tf.as_dtype(x.dtype)), data
        )
    except TypeError:
        return None


class StepFunction:
    """A Keras ``train_function``/``test_function`` for a tf.distribute engine.

    Each call runs up to `steps_per_execution` global batches, each through
    `one_step` (one compiled distributed step), and returns the last step's
    logs. The loop is in Python: Keras 3's in-graph loop (a while_loop over
    optional batches) fails under MirroredStrategy (seen with Keras 3.15.1 +
    TF 2.21: "You must feed a value for placeholder tensor
    'while/cond/...'").
    """

    def __init__(
        self, engine, step_fn, metric_variables, metric_results, steps_per_execution, run_eagerly, jit_compile=False
    ):
        replica = _xla_if(jit_compile and not run_eagerly, replica_step(step_fn, metric_variables, metric_results))
        #: Each replica's step (a `tf.function(jit_compile=True)` where the model asks for XLA).
        self.replica = replica

        def one_step(data):
            outputs = engine.run(replica, args=(data,))
            # every replica returns the same global logs: keep replica 0's
            return tf.nest.map_structure(
                lambda value: engine.experimental_local_results(value)[0], outputs
            )

        #: One distributed step on one global batch (a `tf.function` unless eager).
        self.one_step = one_step if run_eagerly else BatchSizeFreeFunction(one_step)
        self.steps_per_execution = steps_per_execution

    def __call__(self, iterator):
        heartbeat.beat()
        logs = None
        for _ in range(self.steps_per_execution):
            try:
                data = next(iterator)
            except (StopIteration, tf.errors.OutOfRangeError):
                if logs is None:
                    raise StopIteration
                break
            logs = self.one_step(data)
        return logs


def _xla_if(jit_compile: bool, replica_fn):
    """`replica_fn` compiled by XLA where the model asks for it
    (`compile(jit_compile=True)`), as Keras compiles its own step: each
    replica's function, run by the engine."""
    if not jit_compile:
        return replica_fn
    return tf.function(replica_fn, jit_compile=True, reduce_retracing=True)


def make_predict_function(engine, predict_step, run_eagerly: bool, jit_compile: bool = False):
    """Predict over a list of global batches; rows come back in input order."""

    @functools.partial(_xla_if, jit_compile and not run_eagerly)
    def replica_predict(data):
        shard, local = slice_for_replica(data)
        with _shard.shard_scope(shard):
            return predict_step(local)

    def one_batch(data):
        outputs = engine.run(replica_predict, args=(data,))
        if engine is _cluster.multi_worker_engine():  # every worker gets all rows
            return tf.nest.map_structure(
                lambda value: engine.gather(value, axis=0), outputs
            )
        return tf.nest.map_structure(
            lambda value: _concat(engine.experimental_local_results(value)),
            outputs,
        )

    if not run_eagerly:
        one_batch = BatchSizeFreeFunction(one_batch)

    def predict_function(batches):
        outputs = [one_batch(batch) for batch in batches]
        if len(outputs) == 1:
            return outputs[0]
        return tf.nest.map_structure(lambda *parts: _concat(parts), *outputs)

    predict_function.one_batch = one_batch
    return predict_function


def _concat(tensors):
    if tensors[0].shape.rank == 0:
        return tf.stack(tensors)
    return tf.concat(tensors, axis=0)


def global_moments(inputs, axes, mask):
    """BatchNormalization moments over the global batch (see `keras_dist._moments`)."""
    def all_reduce_sum(values):
        return list(_all_reduce(tf.distribute.ReduceOp.SUM, list(values)))

    return _moments.global_moments(inputs, axes, mask, all_reduce_sum)




def sum_gradients_over_replicas(values):
    """Identity on `values`; in the backward pass their gradients are summed
    across replicas (one all-reduce, in replica context)."""

    @tf.custom_gradient
    def identity(*tensors):
        def backward(*gradients):
            return _all_reduce(tf.distribute.ReduceOp.SUM, list(gradients))

        return list(tensors), backward

    return list(identity(*values))


def _check_xla(model, strategy):
    """`compile(jit_compile=True)` is honoured under OneDeviceStrategy (its
    step compiled by XLA, as Keras compiles its own). tf's XLA cannot run
    a step over tf's MirroredStrategy's variables on CPU devices (plain
    tf.distribute with Keras fails mid-step), and the optimizer's
    merge_call cannot sit in a nested XLA function: one clear error before
    anything runs, not the flag dropped."""
    kind = strategy.extended.engine_kind
    if model.jit_compile is not True or model.run_eagerly or kind is EngineKind.ONE_DEVICE:
        return
    if kind is EngineKind.TPU and any(d.startswith("tpu:") for d in strategy.extended.worker_devices):
        return  # tf's TPUStrategy compiles every step with XLA
    raise ValueError(
        f"compile(jit_compile=True) under {type(strategy).__name__} on TensorFlow: keras_dist compiles a "
        "step with XLA under OneDeviceStrategy only (over tf's MirroredStrategy on CPU devices XLA cannot read "
        "the variables: plain tf.distribute with Keras fails mid-step, 'Trying to access resource ... located "
        "in device CPU:1 from device CPU:0'; and the optimizer's merge_call cannot run inside an XLA function). "
        "Compile with jit_compile=False (Keras' default under a tf.distribute strategy), or use "
        "OneDeviceStrategy."
    )


def make_trainer_function(model, strategy, kind: str):
    """Keras' ``{kind}_function`` for `model` under `strategy` (one replica
    too: Keras' own step over data of unknown size counts one step more
    per epoch, and on a device other than the host's a number that depends
    on timing; keras_dist's reads each batch before its step starts).

    Under a ParameterServerStrategy, "train" is the step the coordinator
    schedules, ``step(per_worker_iterator) -> logs``; evaluate and predict
    take Keras' own, run inline on the coordinator (None)."""
    if strategy.extended.engine_kind is EngineKind.PARAMETER_SERVER:
        if kind != "train":
            return None
        from keras_dist.backends.tensorflow import _parameter_servers

        return _parameter_servers.make_step_function(model, strategy.extended.engine)
    _check_xla(model, strategy)
    engine = strategy.extended.engine
    if kind == "predict":
        return make_predict_function(engine, model.predict_step, model.run_eagerly, model.jit_compile is True)
    return StepFunction(
        engine,
        getattr(model, f"{kind}_step"),
        lambda: model.metrics_variables,
        model.get_metrics_result,
        model.steps_per_execution,
        model.run_eagerly,
        model.jit_compile is True,
    )
