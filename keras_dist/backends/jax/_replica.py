"""JAX custom-loop support: per-replica values, `run`, reduce, gather.

A per-replica value is ONE global `jax.Array` sharded over the mesh's batch
axis, so it can pass through `jax.jit`:

- batch values (from a distributed dataset): replica ``r`` holds rows
  ``[r*m, (r+1)*m)``, of which the first ``counts[r]`` are real; uneven
  shards are zero-padded to the same length ``m`` (SPMD needs equal
  shapes). `compute_average_loss` masks the padding and divides by the real
  global row count, and `gather`, `reduce(axis=0)`, `all_gather(axis=0)`
  and `experimental_local_results` drop it, so uneven and partial batches
  stay exact. Sums over rows are exact too (padding is zero); a function
  that averages rows itself sees ``m`` rows.
- stacked values (per-replica results of `run`): replica ``r`` holds row r.

`run` maps the function over replicas with `jax.shard_map` (check_vma on):
JAX tracks which results vary across replicas, so results equal on every
replica come back as ordinary replicated arrays. Gradients of replicated
values are summed over replicas by autodiff itself (the transpose of a
broadcast is a psum); `ReplicaContext.all_reduce` refuses to SUM such
already-reduced values again, the trap that multiplies gradients by the
replica count.
"""

from __future__ import annotations

import collections
import contextlib

import numpy as np
import jax
import jax.numpy as jnp
from jax.sharding import NamedSharding, PartitionSpec as P

from keras_dist import _context
from keras_dist._reduce import ReduceOp, check_summable
from keras_dist._replica_ops import ReplicaOps
from keras_dist._split import shard_sizes
from keras_dist._values import PerReplica
from keras_dist.backends.jax import _run_variables
from keras_dist.backends.jax._engine import (
    BATCH_AXIS,
    ParameterServerEngine,
    place_global_batch,
    replicated_sharding,
)


@jax.tree_util.register_pytree_node_class
class JaxPerReplica(PerReplica):
    """Per-replica value held as one sharded global array (see module doc)."""

    def __init__(self, array, counts=None, num_replicas=None):
        self.array = array
        self.counts = None if counts is None else tuple(int(c) for c in counts)
        self.num_replicas = num_replicas or (
            len(self.counts) if self.counts is not None else array.shape[0]
        )

    @property
    def rows_per_replica(self) -> int:
        return self.array.shape[0] // self.num_replicas

    @property
    def values(self) -> tuple:
        if self.counts is None:
            return tuple(self.array[r] for r in range(self.num_replicas))
        m = self.rows_per_replica
        return tuple(
            self.array[r * m : r * m + count] for r, count in enumerate(self.counts)
        )

    def tree_flatten(self):
        return (self.array,), (self.counts, self.num_replicas)

    @classmethod
    def tree_unflatten(cls, aux, children):
        return cls(children[0], aux[0], aux[1])

    def __repr__(self) -> str:
        kind = "stacked" if self.counts is None else f"rows={list(self.counts)}"
        return f"PerReplica({kind}, shape={tuple(self.array.shape)})"


_varying = _run_variables.varying


# -- input ----------------------------------------------------------------


def iterate_batches(dataset):
    """Global batches as numpy structures (tf.data datasets included)."""
    if hasattr(dataset, "as_numpy_iterator"):
        return dataset.as_numpy_iterator()
    return iter(dataset)


def _padded_global(parts, m):
    """Concatenates per-replica row blocks, each zero-padded to `m` rows."""
    blocks = []
    for part in parts:
        if len(part) < m:
            pad = np.zeros((m - len(part),) + part.shape[1:], part.dtype)
            part = np.concatenate([part, pad], axis=0)
        blocks.append(part)
    return np.concatenate(blocks, axis=0)


def _place(engine, array):
    return place_global_batch(engine, array, NamedSharding(engine.mesh, P(BATCH_AXIS)))


def split_global_batch(engine, batch):
    """One global batch -> per-replica values with contiguous shards."""
    num = engine.num_replicas

    def split(x):
        if x is None:
            return None
        x = np.asarray(x)
        counts = shard_sizes(x.shape[0], num)
        m = max(counts)
        bounds = np.cumsum([0] + counts)
        parts = [x[bounds[r] : bounds[r + 1]] for r in range(num)]
        return JaxPerReplica(_place(engine, _padded_global(parts, m)), counts, num)

    return jax.tree_util.tree_map(split, batch)


def combine_replica_batches(engine, batches):
    """Per-replica batches (one per replica; fewer at the end) -> values."""
    num = engine.num_replicas

    def combine(*parts):
        parts = [np.asarray(p) for p in parts]
        empty = np.zeros((0,) + parts[0].shape[1:], parts[0].dtype)
        parts = parts + [empty] * (num - len(parts))
        counts = [len(p) for p in parts]
        return JaxPerReplica(_place(engine, _padded_global(parts, max(counts))), counts, num)

    return jax.tree_util.tree_map(combine, *batches)


# -- replica context ------------------------------------------------------


class _ReplicaOps(ReplicaOps):
    def __init__(self, engine, counts):
        self.engine = engine
        self.counts = counts
        self.rows = None if counts is None else max(counts)

    def all_reduce(self, reduce_op, value, options=None):
        # options: checked by the core to ask only for the strategy's own.
        num = self.engine.num_replicas

        def reduce(x):
            x = jnp.asarray(x)
            if not _varying(x):
                if reduce_op is ReduceOp.MEAN:
                    return x
                raise ValueError(
                    "all_reduce(SUM) of a value that is already the same on "
                    "every replica. Under strategy.run on JAX, gradients with "
                    "respect to replicated variables (model weights) are "
                    "already summed over replicas by autodiff; summing them "
                    f"again would multiply them by {num}. Use the gradients "
                    "as they are (with keras_dist.compute_average_loss they "
                    "are exactly the global-batch gradients)."
                )
            total = jax.lax.psum(x, BATCH_AXIS)
            return total / num if reduce_op is ReduceOp.MEAN else total

        return jax.tree_util.tree_map(reduce, value)

    def all_gather(self, value, axis):
        num = self.engine.num_replicas

        def gather(x):
            x = jnp.asarray(x)
            if not _varying(x):
                return jnp.concatenate([x] * num, axis=axis)
            gathered = jax.lax.all_gather(x, BATCH_AXIS, axis=axis, tiled=True)
            if self.counts is not None and axis == 0 and x.shape[0] == self.rows:
                keep = [r * self.rows + i for r, c in enumerate(self.counts) for i in range(c)]
                gathered = jnp.take(gathered, jnp.asarray(keep, jnp.int32), axis=0)
            return gathered

        return jax.tree_util.tree_map(gather, value)

    def loop_carry(self, value):
        return jax.tree_util.tree_map(lambda x: _run_variables.make_varying(jnp.asarray(x)), value)

    def sync_on_read(self):
        access = _run_variables.active_access()
        return access.sync_on_read() if access is not None else contextlib.nullcontext()

    def row_mask(self, value):
        if self.counts is None or value.shape[0] != self.rows:
            return None
        index = jax.lax.axis_index(BATCH_AXIS)
        return jnp.arange(self.rows) < jnp.asarray(self.counts)[index]

    def global_rows(self, local_rows):
        if self.counts is not None and local_rows == self.rows:
            return sum(self.counts)  # the real rows, padding excluded
        # Not a dataset batch: every replica holds the same number of rows.
        return local_rows * self.engine.num_replicas

    def merge_call(self, strategy, merge_fn, args, kwargs):
        num = self.engine.num_replicas

        def gathered(x):
            if not isinstance(x, (jax.Array, np.ndarray, np.generic)):
                return x
            x = jnp.asarray(x)
            if not _varying(x):
                return x  # the same on every replica
            # Every replica's x in one array typed as the same on every
            # replica (so cross-replica code may use it): each writes its
            # rows into zeros and the psum adds them (exact: zeros elsewhere).
            index = jax.lax.axis_index(BATCH_AXIS)
            if self.counts is not None and x.ndim >= 1 and x.shape[0] == self.rows:
                zeros = jnp.zeros((num * x.shape[0],) + x.shape[1:], x.dtype)
                placed = jax.lax.dynamic_update_slice_in_dim(zeros, x, index * x.shape[0], axis=0)
                return JaxPerReplica(jax.lax.psum(placed, BATCH_AXIS), self.counts, num)
            placed = jax.lax.dynamic_update_index_in_dim(jnp.zeros((num,) + x.shape, x.dtype), x, index, axis=0)
            return JaxPerReplica(jax.lax.psum(placed, BATCH_AXIS), None, num)

        args, kwargs = jax.tree_util.tree_map(gathered, (args, kwargs))
        access = _run_variables.active_access()
        with _context.cross_replica(), (access.cross_replica() if access else contextlib.nullcontext()):
            result = merge_fn(strategy, *args, **kwargs)
        index = jax.lax.axis_index(BATCH_AXIS)

        def own(x):
            if isinstance(x, JaxPerReplica):
                if x.counts is None:
                    return x.array[index]
                return jax.lax.dynamic_slice_in_dim(x.array, index * x.rows_per_replica, x.rows_per_replica)
            return x

        return jax.tree_util.tree_map(own, result, is_leaf=lambda x: isinstance(x, JaxPerReplica))

    def devices(self, strategy):
        raise NotImplementedError(
            "ReplicaContext.devices has no fixed value on JAX: one compiled "
            "program serves every replica, so the replica is only known as "
            "a traced index. Use replica_id_in_sync_group (the index) and "
            "strategy.extended.worker_devices (the devices, in replica order)."
        )


# -- run ------------------------------------------------------------------

_DYNAMIC = (jax.Array, np.ndarray, np.generic, float, int, bool, complex)
#: Compiled `run` programs, most recently used last; at most `_RUN_CACHE_SIZE`
#: (a loop that makes a new function per step must not grow memory forever).
_run_cache: "collections.OrderedDict" = collections.OrderedDict()
_RUN_CACHE_SIZE = 64


def _is_tracer(x) -> bool:
    return isinstance(x, jax.core.Tracer)


def run(strategy, engine, fn, args, kwargs):
    leaves, treedef = jax.tree_util.tree_flatten(
        (args, kwargs), is_leaf=lambda x: isinstance(x, JaxPerReplica)
    )
    kinds, dynamic, static = [], [], []
    batch_counts = None
    for leaf in leaves:
        if isinstance(leaf, JaxPerReplica):
            if leaf.num_replicas != engine.num_replicas:
                raise ValueError(
                    f"A per-replica value of {leaf.num_replicas} replicas was "
                    f"passed to a strategy of {engine.num_replicas}."
                )
            kinds.append(("per_replica", leaf.counts))
            dynamic.append(leaf.array)
            if leaf.counts is not None and batch_counts is None:
                batch_counts = leaf.counts
        elif isinstance(leaf, _DYNAMIC):
            kinds.append(("replicated", None))
            if isinstance(leaf, jax.Array) and not _is_tracer(leaf):
                if leaf.sharding.device_set != set(engine.devices):
                    leaf = jax.device_put(leaf, replicated_sharding(engine))
            dynamic.append(leaf)
        else:
            kinds.append(("static", len(static)))
            static.append(leaf)
    signature = tuple(
        (tuple(np.shape(x)), str(jnp.result_type(x))) for x in dynamic
    )
    key = (fn, treedef, tuple(kinds), signature, tuple(id(s) for s in static), id(engine))
    compiled = _run_cache.get(key)
    if compiled is None:
        compiled = _compile_run(strategy, engine, fn, treedef, kinds, static, batch_counts, dynamic)
        _run_cache[key] = compiled
        while len(_run_cache) > _RUN_CACHE_SIZE:
            _run_cache.popitem(last=False)
    else:
        _run_cache.move_to_end(key)
    call, out_treedef, out_kinds, reads, writes = compiled
    outputs = call(*dynamic, *[_run_variables.input_value(engine, v) for v in reads])
    outputs, written = outputs[: len(out_kinds)], outputs[len(out_kinds) :]
    _run_variables.check_concrete(writes, written)
    _run_variables.assign_written(writes, written)
    wrapped = []
    for value, (kind, counts) in zip(outputs, out_kinds):
        if kind == "replicated":
            _remember_replicated(value)
            wrapped.append(value)
        elif engine.num_replicas == 1:  # one replica: its value, as tf's OneDeviceStrategy.run gives it
            wrapped.append(value if counts is not None else value[0])
        else:
            wrapped.append(JaxPerReplica(value, counts, engine.num_replicas))
    return jax.tree_util.tree_unflatten(out_treedef, wrapped)


def _compile_run(strategy, engine, fn, treedef, kinds, static, batch_counts, dynamic):
    """Traces `fn` twice: a probe (`jax.eval_shape`) that learns which
    results vary across replicas and which Keras variables `fn` reads and
    writes, then the program, which takes those variables' values as inputs
    and returns the written ones (see `_run_variables`)."""
    num = engine.num_replicas
    in_specs = tuple(P(BATCH_AXIS) if kind == "per_replica" else P() for kind, _ in kinds if kind != "static")
    rows = None if batch_counts is None else max(batch_counts)
    record = {}

    def call_fn(inputs, access):
        values = iter(inputs)
        leaves = []
        for kind, extra in kinds:
            if kind == "static":
                leaves.append(static[extra])
            elif kind == "per_replica" and extra is None:
                leaves.append(next(values)[0])  # stacked: this replica's row
            else:
                leaves.append(next(values))
        args, kwargs = jax.tree_util.tree_unflatten(treedef, leaves)
        context = _context.ReplicaContext(
            strategy, jax.lax.axis_index(BATCH_AXIS), _ReplicaOps(engine, batch_counts)
        )
        with _context.in_replica(context), access:
            out = fn(*args, **kwargs)
        out_leaves, out_treedef = jax.tree_util.tree_flatten(out)
        out_leaves = [jnp.asarray(x) for x in out_leaves]
        record["treedef"] = out_treedef
        record["kinds"] = [
            "replicated"
            if not _varying(x)
            else ("per_example" if rows is not None and x.ndim >= 1 and x.shape[0] == rows else "stacked")
            for x in out_leaves
        ]
        return out_leaves

    def probe(*inputs):
        access = _run_variables.VariableAccess(num)
        out = call_fn(inputs, access)
        record["reads"], record["writes"] = list(access.reads), list(access.writes)
        return tuple(x[None] for x in out)

    abstract = [jax.ShapeDtypeStruct(np.shape(x), jnp.result_type(x)) for x in dynamic]
    jax.eval_shape(
        jax.shard_map(probe, mesh=engine.mesh, in_specs=in_specs, out_specs=P(BATCH_AXIS)),
        *abstract,
    )
    out_kinds = list(record["kinds"])
    out_treedef = record["treedef"]
    reads, writes = record["reads"], record["writes"]
    on_read = [_run_variables.is_on_read(v) for v in writes]

    def body(*inputs):
        inputs, variable_inputs = inputs[: len(in_specs)], inputs[len(in_specs) :]
        planned = {
            id(v): (x[0] if _run_variables.is_on_read(v) else x) for v, x in zip(reads, variable_inputs)
        }
        access = _run_variables.VariableAccess(num, planned, discover=False)
        out = call_fn(inputs, access)
        if [id(v) for v in access.writes] != [id(v) for v in writes]:
            raise RuntimeError(
                "strategy.run's function wrote other variables on its second "
                "trace than on its first; it must touch the same variables "
                "every time it is traced."
            )
        written = access.written_values()
        return (
            *(x[None] if kind == "stacked" else x for x, kind in zip(out, out_kinds)),
            *(x[None] if read else x for x, read in zip(written, on_read)),
        )

    out_specs = (
        *(P() if kind == "replicated" else P(BATCH_AXIS) for kind in out_kinds),
        *(P(BATCH_AXIS) if read else P() for read in on_read),
    )
    variable_specs = tuple(_run_variables.input_spec(v) for v in reads)
    mapped = jax.jit(
        jax.shard_map(body, mesh=engine.mesh, in_specs=in_specs + variable_specs, out_specs=out_specs),
        compiler_options=engine.compiler_options,
    )
    result_kinds = [
        ("replicated", None) if kind == "replicated"
        else ("per_replica", batch_counts if kind == "per_example" else None)
        for kind in out_kinds
    ]
    return mapped, out_treedef, result_kinds, reads, writes


# -- cross-replica --------------------------------------------------------


#: `run`'s results that are equal on every replica come back as plain arrays
#: (so they pass through jit and `float()`), where tf gives a PerReplica. Inside
#: `jax.jit` they are tracers whose placement is unknown, so `run` remembers
#: them (by identity, the most recent `_REPLICATED_SIZE`): `reduce` and
#: `gather` then treat them as one component per replica, as tf does.
_replicated_results: "collections.OrderedDict" = collections.OrderedDict()
_REPLICATED_SIZE = 256


def _remember_replicated(value):
    if _is_tracer(value):
        _replicated_results[id(value)] = value  # kept, so its id is not reused
        while len(_replicated_results) > _REPLICATED_SIZE:
            _replicated_results.popitem(last=False)


def _is_replicated(engine, value) -> bool:
    """Whether `value` is one copy per replica (a result of `run` equal on
    every replica, or an array mirrored over the strategy's devices), not a
    value the strategy never distributed."""
    if _is_tracer(value):
        return _replicated_results.get(id(value)) is value
    return (
        isinstance(value, jax.Array)
        and value.sharding.device_set == set(engine.devices)
        and value.sharding.is_fully_replicated
    )


def place_state(engine, state):
    """Each array of `state` replicated over the strategy's devices, as `run`
    returns a value equal on every replica. Only CentralStorageStrategy
    moves anything: its variables live on the parameter device, so a
    `jax.jit` over `run` saw them there at the first step and the state it
    returned on the compute devices at the second, and compiled twice. One
    replica, a multi-process job (global arrays, placed by Keras on the
    mesh) and a parameter-server engine (its variables live in the ps
    actors): `state` as it is."""
    if isinstance(engine, ParameterServerEngine) or engine.num_replicas == 1 or jax.process_count() > 1:
        return state
    replicated = replicated_sharding(engine)

    def place(value):
        if isinstance(value, jax.Array) and not _is_tracer(value) and not _is_replicated(engine, value):
            return jax.device_put(value, replicated)
        return value

    return jax.tree_util.tree_map(place, state)


def _components(value):
    if isinstance(value, PerReplica):
        return list(value.values)
    return None


def reduce(engine, reduce_op, value, axis):
    num = engine.num_replicas
    if isinstance(value, JaxPerReplica) and value.counts is None and axis is None:
        total = jnp.sum(value.array, axis=0)
        return total / num if reduce_op is ReduceOp.MEAN else total
    parts = _components(value)
    if parts is None:
        if reduce_op is ReduceOp.MEAN or num == 1 or _is_replicated(engine, value):
            if axis is None:
                return value if reduce_op is ReduceOp.MEAN else value * num
            if reduce_op is ReduceOp.MEAN:
                return jnp.mean(value, axis=axis)
            return jnp.sum(value, axis=axis) * num
        check_summable(reduce_op, num)
    if axis is None:
        shapes = {tuple(np.shape(p)) for p in parts}
        if len(shapes) != 1:
            raise ValueError(
                f"reduce(axis=None) needs equal shapes on all replicas, got "
                f"{sorted(shapes)}. Pass axis=0 to reduce along the batch too."
            )
        total = sum(jnp.asarray(p) for p in parts)
        return total / num if reduce_op is ReduceOp.MEAN else total
    total = sum(jnp.sum(jnp.asarray(p), axis=axis) for p in parts)
    if reduce_op is ReduceOp.SUM:
        return total
    count = sum(np.shape(p)[axis] for p in parts)
    return total / count


def gather(engine, value, axis):
    """The replicas' components of `value` concatenated along `axis`; a value
    the strategy never distributed comes back as it is, as in tf."""
    parts = _components(value)
    if parts is None:
        if not _is_replicated(engine, value):
            return value
        parts = [value] * engine.num_replicas
    return jnp.concatenate([jnp.asarray(p) for p in parts], axis=axis)


def local_results(engine, value):
    """This process's replicas' components of `value`, in replica order (as
    tf: with several workers, a worker's own; each worker holds every
    replica's component of a distributed batch)."""
    parts = _components(value)
    if parts is not None:
        if jax.process_count() > 1 and len(parts) == len(engine.devices):
            return tuple(parts[i] for i in _local_replicas(engine))
        return tuple(parts)
    if isinstance(value, jax.Array) and not _is_tracer(value) and _is_replicated(engine, value):
        # a mirrored value: one copy per replica, in replica order
        by_device = {shard.device: shard.data for shard in value.addressable_shards}
        return tuple(by_device[engine.devices[i]] for i in _local_replicas(engine))
    return (value,)


def _local_replicas(engine) -> list:
    """The replica indices whose devices belong to this process."""
    index = jax.process_index()
    return [i for i, device in enumerate(engine.devices) if device.process_index == index]


def build_outside_replicas(build_fn):
    """JAX traces `run`'s function, where variables cannot be created: inside
    `run` this refuses with the fix (build before the loop); outside it
    simply builds."""
    if _context.replica_context() is not None:
        raise RuntimeError(
            "A Keras optimizer was built inside strategy.run on JAX, where "
            "the function is traced and cannot create variables. Build it "
            "before the loop, optimizer.build(model.trainable_variables), and "
            "apply gradients with optimizer.stateless_apply on state passed "
            "as arguments (see the custom training loops guide)."
        )
    build_fn()


def sum_gradients_for_apply(grads):
    """Inside `run` (and fit's replica steps) JAX's autodiff already sums
    the gradients of replicated variables over the replicas, so Keras'
    clipping and updates see the global batch's gradients: None. A gradient
    that still differs across replicas (computed per replica some other
    way) is summed over them, as tf sums every replica's gradient."""
    if _context.replica_context() is None or not any(g is not None and _varying(g) for g in grads):
        return None
    return [g if g is None or not _varying(g) else jax.lax.psum(g, BATCH_AXIS) for g in grads]


def apply_optimizer(optimizer, build, apply):
    """Inside `run`: Keras' update of each variable is tf's cross-replica
    update (`merge_call`, then `extended.update`): written once, as the
    optimizer computed it from the summed gradients, not aggregated over
    the replicas again (a variable with aggregation="sum" moved
    num_replicas times as far). Elsewhere just `apply()` (it builds an
    unbuilt optimizer itself; `build` is not needed here)."""
    access = _run_variables.active_access()
    if access is None or _context.replica_context() is None:
        return apply()
    with access.cross_replica():
        return apply()


def assign_delta_in_replica(variable, value, sign):
    """Inside `run`'s trace: the increment goes to the variable-access scope
    (aggregated across replicas there); None elsewhere."""
    scope = _run_variables.active_access()
    return None if scope is None else scope.write_delta(variable, value, sign)


def distribute_values(engine, values):
    """One value per replica -> per-replica values: stacked when every
    replica's leaf has the same shape (replica r holds row r), else rows
    padded to equal length like an uneven batch."""
    leaves = [jax.tree_util.tree_leaves(v) for v in values]
    same = all(
        len(ls) == len(leaves[0]) and all(np.shape(a) == np.shape(b) for a, b in zip(ls, leaves[0]))
        for ls in leaves
    )
    if not same:
        return combine_replica_batches(engine, values)

    def stack(*parts):
        stacked = np.stack([np.asarray(p) for p in parts])
        return JaxPerReplica(_place(engine, stacked), None, engine.num_replicas)

    return jax.tree_util.tree_map(stack, *values)
