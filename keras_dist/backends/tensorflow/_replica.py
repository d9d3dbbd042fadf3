"""TensorFlow custom-loop support: `run`, reduce, gather, distributed input.

Per-replica values are tf.distribute's own (registered as
`keras_dist.PerReplica` / `Mirrored`), so they trace cleanly through
`tf.function`. Global batches are split into contiguous shards (sizes differ
by at most one) with `experimental_distribute_values_from_function`.
"""

from __future__ import annotations

import contextlib
import threading
import weakref

import tensorflow as tf
from tensorflow.python.distribute import values as tf_values

from keras_dist import _context
from keras_dist._reduce import ReduceOp, check_summable
from keras_dist._replica_ops import ReplicaOps
from keras_dist._split import shard_bounds
from keras_dist._input import DistributedDataset, DistributedIterator
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


#: How deep this thread (a replica's) is in `_ReplicaOps.sync_on_read`.
_sync_on_read_depth = threading.local()


class _ReplicaOps(ReplicaOps):
    def __init__(self, context):
        self.context = context

    applies_call_options = True  # tf's all_reduce takes them per call

    def all_reduce(self, reduce_op, value, options=None):
        if options is not None:
            options = tf.distribute.experimental.CommunicationOptions(
                bytes_per_pack=options.bytes_per_pack,
                timeout_seconds=options.timeout_seconds,
                implementation=getattr(tf.distribute.experimental.CommunicationImplementation, options.implementation.value),
            )
        return self.context.all_reduce(_TF_OPS[reduce_op.value], value, options=options)

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

    @contextlib.contextmanager
    def sync_on_read(self):
        # tf's context is not re-entrant (its exit ends an outer one, say a
        # metric's result() that reads another's): entered once per thread.
        depth = getattr(_sync_on_read_depth, "value", 0)
        _sync_on_read_depth.value = depth + 1
        try:
            with tf.__internal__.distribute.variable_sync_on_read_context() if depth == 0 else contextlib.nullcontext():
                yield
        finally:
            _sync_on_read_depth.value = depth

    def devices(self, strategy):
        # tf's MirroredStrategy nests this replica's device list in the tuple
        devices = []
        for item in self.context.devices:
            devices.extend(item if isinstance(item, (list, tuple)) else [item])
        return tuple(devices)


def run(strategy, engine, fn, args, kwargs):
    if isinstance(fn, tf.types.experimental.PolymorphicFunction) and hasattr(fn, "_clone"):
        lifted = _lifted(strategy, engine, fn)
        if isinstance(engine, tf.distribute.OneDeviceStrategy):
            # as tf's OneDeviceStrategy calls a tf.function: on its device, so
            # that an XLA-compiled one is compiled there, where its variables are
            with tf.device(engine.extended.worker_devices[0]):
                return lifted(*args, **kwargs)
        return lifted(*args, **kwargs)
    return _run_python(strategy, engine, fn, args, kwargs)


def _run_python(strategy, engine, fn, args, kwargs):
    def replica_fn(*replica_args, **replica_kwargs):
        tf_context = tf.distribute.get_replica_context()
        context = _context.ReplicaContext(
            strategy, tf_context.replica_id_in_sync_group, _ReplicaOps(tf_context)
        )
        with _context.in_replica(context):
            return fn(*replica_args, **replica_kwargs)

    return engine.run(replica_fn, args=args, kwargs=kwargs)


#: engine -> {tf.function passed to run -> its lifted clone}
_lifted_functions: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _lifted(strategy, engine, fn):
    """A `tf.function` given to `run` becomes, as in tf.distribute's own
    `run`, a clone of itself (same arguments: jit_compile, signature) whose
    body runs its Python function on every replica. Run as given, each
    replica would trace it as a function of its own, and a synchronisation
    point inside (an all-reduce, `apply_gradients`) fails there: "merge_call
    called while defining a new graph". One clone per (strategy, function)."""
    clones = _lifted_functions.setdefault(engine, weakref.WeakKeyDictionary())
    clone = clones.get(fn)
    if clone is None:
        python_function = fn.python_function

        def each_replica(*args, **kwargs):
            return _run_python(strategy, engine, python_function, args, kwargs)

        clone = clones[fn] = fn._clone(python_function=each_replica)
    return clone


def reduce(engine, reduce_op, value, axis):
    if reduce_op is ReduceOp.SUM and isinstance(value, tf_values.Mirrored):
        # one copy per replica (tf asserts instead): their sum, as JAX gives it
        total = tf.convert_to_tensor(value) if axis is None else tf.reduce_sum(value, axis=axis)
        return total * tf.cast(engine.num_replicas_in_sync, total.dtype)
    try:
        return engine.reduce(_TF_OPS[reduce_op.value], value, axis=axis)
    except ValueError as error:
        # tf refuses to SUM a value it never distributed in one worker (its
        # error names no fix); with several workers it sums run's result of
        # a worker's one replica, which is not a DistributedValues there
        if "cannot be reduced with the given reduce op" not in str(error):
            raise
        check_summable(reduce_op, engine.num_replicas_in_sync)
        raise


def gather(engine, value, axis):
    if axis < 0:  # tf's gather takes a non-negative axis ("Requires start <= limit" in its graph)
        first = engine.experimental_local_results(value)[0]
        axis += len(first.shape)
    return engine.gather(value, axis)


def local_results(engine, value):
    return engine.experimental_local_results(value)


def place_state(engine, state):
    """A TensorFlow step reads the variables themselves: no state to place."""
    return state


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


def sum_gradients_for_apply(grads):
    """In a replica context of several replicas (`strategy.run`, fit's
    replica steps, and the replicas Keras' LossScaleOptimizer calls its
    inner optimizer from): `grads` summed over the replicas, one
    all-reduce, None entries kept. None elsewhere (one replica, cross-replica
    context, a parameter-server worker's scheduled function)."""
    if not tf.distribute.has_strategy() or tf.distribute.in_cross_replica_context():
        return None
    if isinstance(tf.distribute.get_strategy(), tf.distribute.experimental.ParameterServerStrategy):
        return None
    context = tf.distribute.get_replica_context()
    present = [g for g in grads if g is not None]
    if context is None or context.num_replicas_in_sync <= 1 or not present:
        return None
    summed = iter(all_reduce_in_replica(context, tf.distribute.ReduceOp.SUM, present))
    return [None if g is None else next(summed) for g in grads]


def all_reduce_in_replica(context, op, values):
    """`context.all_reduce(op, values)`, differentiable as tf's is (the
    gradient of an all-sum or all-mean is the same all-reduce of the
    upstream gradients), without tf's walk of the other replicas' graphs.

    tf wraps its replica all-reduce in `tf.custom_gradient`, which, in a
    traced function, walks back from the result through every op it
    depends on, looking for variables. Under CentralStorageStrategy the
    result is built from every replica's inputs, so the walk goes through
    the other replicas' whole graphs, once per all-reduce (MirroredStrategy's
    collectives have no such edges): quadratic in a model's depth, with an
    all-reduce per BatchNormalization layer (MobileNetV2 under
    CentralStorageStrategy(2): 420 walks, 100 of the first step's 108
    CPU-s). Here the inputs go in behind `tf.stop_gradient`, where every
    walk ends, and this function's own gradient puts back the one tf's
    all-reduce has. Eager values and IndexedSlices go to tf as they are
    (tf builds no gradient for them)."""
    flat = tf.nest.flatten(values)
    if tf.executing_eagerly() or any(isinstance(v, tf.IndexedSlices) for v in flat):
        return context.all_reduce(op, values)
    return tf.nest.pack_sequence_as(values, _traced_all_reduce(context, op, flat))


def _traced_all_reduce(context, op, tensors):
    @tf.custom_gradient
    def all_reduce(*inputs):
        reduced = context.all_reduce(op, [tf.stop_gradient(x) for x in inputs])

        def backward(*upstream):
            upstream = [tf.zeros_like(r) if u is None else u for u, r in zip(upstream, reduced)]
            return _traced_all_reduce(context, op, upstream)

        return reduced, backward

    return list(all_reduce(*tensors))


def assign_delta_in_replica(variable, value, sign):
    """Inside a tf.distribute replica context, the increment goes to tf's
    own `assign_add`/`assign_sub` of the distributed variable, which
    aggregates the increment (Keras' ``assign(v + x)`` would aggregate the
    replicas' new values: a "sum" variable would get every replica's copy
    of v added up). A variable on a parameter server, anywhere (a worker's
    scheduled function or the coordinator), gets tf's atomic
    `assign_add`/`assign_sub` on the ps (Keras' read-then-write would lose
    a concurrent worker's update). None elsewhere."""
    from keras_dist.backends.tensorflow import _parameter_servers

    on_ps = _parameter_servers.assign_delta(variable, value, sign)
    if on_ps is not None:
        return on_ps
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


DistributedDataset.register(tf.distribute.DistributedDataset)
DistributedIterator.register(tf.distribute.DistributedIterator)


def _tf_input_options(options):
    return tf.distribute.InputOptions(
        experimental_fetch_to_device=options.experimental_fetch_to_device,
        experimental_replication_mode=tf.distribute.InputReplicationMode[options.experimental_replication_mode.value],
        experimental_place_dataset_on_device=options.experimental_place_dataset_on_device,
        experimental_per_replica_buffer_size=options.experimental_per_replica_buffer_size,
    )


def distribute_dataset_natively(engine, dataset, first_replica, kind, options):
    """tf.data input -> tf's own distributed dataset, which autograph
    iterates inside `tf.function` (a Python loop over keras_dist's would
    read the batch size of a graph tensor, None), with the options carried
    out by tf. Each global batch is cut into the same contiguous shards as
    `split_global_batch`, one per replica of this worker, handed to the
    replicas in turn by `distribute_datasets_from_function`; other input:
    None."""
    if engine is None:  # the default strategy: tf.data as it is, as tf's own does
        return dataset if isinstance(dataset, tf.data.Dataset) else None
    tf_options = _tf_input_options(options)
    if kind == "per_replica_pipelines":  # PER_REPLICA: one dataset per replica
        if not all(isinstance(d, tf.data.Dataset) for d in dataset):
            return None
        return engine.distribute_datasets_from_function(
            lambda context: dataset[context.input_pipeline_id], options=tf_options
        )
    if not isinstance(dataset, tf.data.Dataset):
        return None
    if kind == "per_replica_batches":
        return engine.distribute_datasets_from_function(lambda context: dataset, options=tf_options)
    num_total = engine.num_replicas_in_sync
    num_local = len(engine.extended.worker_devices)
    is_tuple = isinstance(dataset.element_spec, tuple)

    def shards(*element):
        element = element if is_tuple else element[0]
        arrays = [x for x in tf.nest.flatten(element) if x is not None]
        rows = tf.shape(arrays[0], out_type=tf.int64)[0]
        base, extra = rows // num_total, rows % num_total

        def shard(local):
            replica = local + first_replica
            start = replica * base + tf.minimum(replica, extra)
            size = base + tf.cast(replica < extra, tf.int64)
            return tf.nest.map_structure(lambda x: x[start : start + size], element)

        return tf.data.Dataset.range(num_local).map(shard)

    sharded = dataset.flat_map(shards)
    return engine.distribute_datasets_from_function(lambda context: sharded, options=tf_options)


# -- gradient accumulation --------------------------------------------------


def apply_optimizer(optimizer, build, apply):
    """Keras' `optimizer.apply` (`apply()`, whose gradients are the global
    batch's: summed over the replicas before it). With
    `gradient_accumulation_steps`, in a replica of a strategy, it runs once
    in cross-replica context (tf's merge_call; `apply` is the first
    replica's, whose summed gradients every replica shares): Keras picks
    between accumulating and updating with a cond, and tf cannot hold its
    synchronisation points inside a cond in replica context ("merge_call
    called while defining a new graph", plain tf.distribute too); in
    cross-replica context each write is `extended.update` of the summed
    gradient, as one device makes it. Otherwise, and in a parameter
    server's scheduled function, as before."""
    from keras_dist.backends.tensorflow import _exactly_once, _parameter_servers

    context = tf.distribute.get_replica_context()
    if (
        not getattr(optimizer, "gradient_accumulation_steps", None)
        or context is None  # cross-replica already
        or not tf.distribute.has_strategy()
        or _exactly_once.in_closure()
    ):
        return _parameter_servers.apply_optimizer(optimizer, build, apply)
    if build is not None:
        build_outside_replicas(build)

    def merge_fn(strategy):
        # Keras' TF optimizer writes through tf's `maybe_merge_call`, which
        # asks for a replica context unless the strategy uses none: here, in
        # cross-replica context, it must call its function directly. The
        # replicas wait in merge_call meanwhile; the instance attribute goes.
        extended = strategy.extended
        extended._use_merge_call = lambda: False
        try:
            apply()
        finally:
            del extended._use_merge_call

    context.merge_call(merge_fn)
