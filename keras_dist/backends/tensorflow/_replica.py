"""TensorFlow custom-loop support: `run`, reduce, gather, distributed input.

Per-replica values are tf.distribute's own (registered as
`keras_dist.PerReplica` / `Mirrored`), so they trace cleanly through
`tf.function`. Global batches are split into contiguous shards (sizes differ
by at most one) with `experimental_distribute_values_from_function`.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

from keras_dist import _context
from keras_dist._replica_ops import ReplicaOps
from keras_dist._split import shard_bounds
from keras_dist._values import DistributedValues, Mirrored, PerReplica

DistributedValues.register(tf.distribute.DistributedValues)
PerReplica.register(tf_values.PerReplica)
Mirrored.register(tf_values.Mirrored)

_TF_OPS = {"SUM": tf.distribute.ReduceOp.SUM, "MEAN": tf.distribute.ReduceOp.MEAN}


def iterate_batches(dataset):
    return iter(dataset)


def _tensors(batch):
    return tf.nest.map_structure(
        lambda x: None if x is None else tf.convert_to_tensor(x), batch
    )


def split_global_batch(engine, batch):
    data = _tensors(batch)
    first = next((x for x in tf.nest.flatten(data) if x is not None), None)
    if first is None:  # no arrays (`()`, `{}`, `(None,)`): nothing to split
        return data
    bounds = shard_bounds(int(first.shape[0]), engine.num_replicas_in_sync)

    def value_fn(context):
        start, stop = bounds[context.replica_id_in_sync_group]
        return tf.nest.map_structure(
            lambda x: None if x is None else x[start:stop], data
        )

    return engine.experimental_distribute_values_from_function(value_fn)


def combine_replica_batches(engine, batches):
    batches = [_tensors(b) for b in batches]

    def value_fn(context):
        replica = context.replica_id_in_sync_group
        if replica < len(batches):
            return batches[replica]
        return tf.nest.map_structure(lambda x: x[:0], batches[0])

    return engine.experimental_distribute_values_from_function(value_fn)


class _ReplicaOps(ReplicaOps):
    def __init__(self, context):
        self.context = context

    def all_reduce(self, reduce_op, value):
        return self.context.all_reduce(_TF_OPS[reduce_op.value], value)

    def all_gather(self, value, axis):
        return self.context.all_gather(value, axis)

    def row_mask(self, value):
        return None  # shards are exact: no padding on TensorFlow

    def global_rows(self, local_rows):
        rows = tf.cast(local_rows, tf.float32)
        return self.context.all_reduce(tf.distribute.ReduceOp.SUM, rows)

    def merge_call(self, strategy, merge_fn, args, kwargs):
        def tf_merge_fn(_tf_strategy, *merge_args, **merge_kwargs):
            with _context.cross_replica():
                return merge_fn(strategy, *merge_args, **merge_kwargs)

        return self.context.merge_call(tf_merge_fn, args=args, kwargs=kwargs)

    def devices(self, strategy):
        # tf's MirroredStrategy nests this replica's device list in the tuple
        devices = []
        for item in self.context.devices:
            devices.extend(item if isinstance(item, (list, tuple)) else [item])
        return tuple(devices)


def run(strategy, engine, fn, args, kwargs):
    def replica_fn(*replica_args, **replica_kwargs):
        tf_context = tf.distribute.get_replica_context()
        context = _context.ReplicaContext(
            strategy, tf_context.replica_id_in_sync_group, _ReplicaOps(tf_context)
        )
        with _context.in_replica(context):
            return fn(*replica_args, **replica_kwargs)

    return engine.run(replica_fn, args=args, kwargs=kwargs)


def reduce(engine, reduce_op, value, axis):
    return engine.reduce(_TF_OPS[reduce_op.value], value, axis=axis)


def gather(engine, value, axis):
    return engine.gather(value, axis)


def local_results(engine, value):
    return engine.experimental_local_results(value)


def build_outside_replicas(build_fn):
    """Runs `build_fn` (which creates variables) once, eagerly, in
    cross-replica context, from inside a replica function.

    Keras 3 optimizers build their slots on the first `apply_gradients`;
    under `strategy.run` inside a `tf.function` that creation would happen
    in replica context and fail. Building eagerly lifts the variables out
    of the function, as tf.distribute expects.
    """

    def merge_fn(_strategy):
        with tf.init_scope():
            build_fn()

    tf.distribute.get_replica_context().merge_call(merge_fn)


def assign_delta_in_replica(variable, value, sign):
    """Inside a tf.distribute replica context, the increment goes to tf's
    own `assign_add`/`assign_sub` of the distributed variable, which
    aggregates the increment (Keras' ``assign(v + x)`` would aggregate the
    replicas' new values: a "sum" variable would get every replica's copy
    of v added up). None elsewhere."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    target = getattr(variable, "_value", None)
    if not isinstance(target, tf.distribute.DistributedValues):
        return None
    value = tf.cast(tf.convert_to_tensor(value), target.dtype)
    return target.assign_add(value) if sign > 0 else target.assign_sub(value)


def distribute_values(engine, values):
    """One value per replica -> tf's per-replica value."""
    return engine.experimental_distribute_values_from_function(
        lambda context: tf.nest.map_structure(tf.convert_to_tensor, values[context.replica_id_in_sync_group])
    )
