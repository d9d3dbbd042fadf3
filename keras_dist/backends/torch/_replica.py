"""PyTorch custom-loop support: `run`, `reduce`, `gather`, distributed input.

One replica per process: a per-replica value (`TorchPerReplica`) holds this
process's component, as tf's do on a worker (`experimental_local_results`);
`reduce`, `gather` and the replica context's collectives go over the job's
process group. With one replica, `run` returns plain values, as tf does.
"""

from __future__ import annotations

import threading

import keras
import numpy as np
import torch

from keras_dist import _context
from keras_dist._reduce import ReduceOp, check_summable
from keras_dist._replica_ops import ReplicaOps
from keras_dist._split import shard_bounds
from keras_dist._values import PerReplica, differs_across_replicas_message
from keras_dist.backends.torch import _collectives, _reducer


class TorchPerReplica(PerReplica):
    """A per-replica value: this process's component (one replica per process)."""

    def __init__(self, values, num_replicas: int = 1):
        super().__init__(values)
        #: The replicas of the whole job (this process holds one).
        self.num_replicas = num_replicas


# -- input ----------------------------------------------------------------


def iterate_batches(dataset):
    """Global batches as they come (tf.data datasets as NumPy)."""
    if hasattr(dataset, "as_numpy_iterator"):
        return dataset.as_numpy_iterator()
    return iter(dataset)


def _tensor(x):
    if x is None or isinstance(x, torch.Tensor):
        return x
    return keras.ops.convert_to_tensor(np.asarray(x))


def _first_leaf(batch):
    return next((x for x in keras.tree.flatten(batch) if x is not None), None)


def replica_rows(engine, data):
    """`(start, stop, global_rows, local)`: this process's contiguous rows of
    the global batch `data` (sizes differ by at most one row, larger ones
    first); `local` is None where `data` has no arrays."""
    first = _first_leaf(data)
    if first is None:
        return 0, 0, 0, None
    rows = int(first.shape[0])
    start, stop = shard_bounds(rows, engine.num_replicas)[engine.replica_id]
    return start, stop, rows, keras.tree.map_structure(lambda x: None if x is None else x[start:stop], data)


def split_global_batch(engine, batch):
    """This process's rows of one global batch, as a per-replica value."""
    data = keras.tree.map_structure(_tensor, batch)
    local = replica_rows(engine, data)[3]
    return data if local is None else _per_replica_leaves(engine, local)


def _per_replica_leaves(engine, value):
    return keras.tree.map_structure(lambda x: x if x is None else TorchPerReplica([x], engine.num_replicas), value)


def combine_replica_batches(engine, batches):
    """One batch per replica (this process's replica's first) -> values."""
    batches = [keras.tree.map_structure(_tensor, b) for b in batches]
    if len(batches) != 1 or engine.num_replicas != 1:
        raise ValueError(
            f"{len(batches)} per-replica batches for {engine.num_replicas} replica(s) in this process: on the torch "
            "backend each process runs one replica and reads one batch a step."
        )
    return _per_replica_leaves(engine, batches[0])


def distribute_values(engine, values):
    values = list(values)
    if len(values) != 1:
        raise ValueError(f"{len(values)} values for the one replica this process runs on the torch backend.")
    return _per_replica_leaves(engine, keras.tree.map_structure(_tensor, values[0]))


# -- the replica context ----------------------------------------------------


_OPS = {ReduceOp.SUM: "SUM", ReduceOp.MEAN: "MEAN"}


class _ReplicaOps(ReplicaOps):
    """The collectives of a replica: this process, over the job's group."""

    def __init__(self, engine):
        self.engine = engine

    def all_reduce(self, reduce_op, value, options=None):
        leaves = keras.tree.flatten(value)
        reduced = iter(_collectives.all_reduce([torch.as_tensor(v) for v in leaves], _OPS[reduce_op], True))
        return keras.tree.pack_sequence_as(value, [next(reduced) for _ in leaves])

    def all_gather(self, value, axis):
        return keras.tree.map_structure(lambda x: _collectives.all_gather_rows(x, axis, True), value)

    def row_mask(self, value):
        return None  # shards are exact: no padding

    def global_rows(self, local_rows):
        (rows,) = _collectives.all_reduce_sum([torch.as_tensor(local_rows, dtype=torch.float32)])
        return rows

    def merge_call(self, strategy, merge_fn, args, kwargs):
        wrap = lambda x: x if x is None or isinstance(x, PerReplica) else TorchPerReplica([x], self.engine.num_replicas)  # noqa: E731
        args = keras.tree.map_structure(wrap, tuple(args))
        kwargs = {k: keras.tree.map_structure(wrap, v) for k, v in dict(kwargs).items()}
        with _context.cross_replica():
            result = merge_fn(strategy, *args, **kwargs)
        return keras.tree.map_structure(lambda x: x.values[0] if isinstance(x, TorchPerReplica) else x, result)

    def devices(self, strategy):
        return (self.engine.device,)


def _component(value):
    if isinstance(value, PerReplica):
        parts = value.values
        if len(parts) != 1:
            raise ValueError(
                f"A per-replica value of {len(parts)} components given to a process of the torch backend, which runs "
                "one replica: make per-replica values with this strategy's own methods."
            )
        return parts[0]
    return value


def _unwrap(nest):
    return keras.tree.map_structure(_component, nest) if nest is not None else nest


def run(strategy, engine, fn, args, kwargs):
    """Runs `fn` as this process's replica: per-replica arguments give their
    component; with several replicas tensor results come back per-replica."""
    args = tuple(_unwrap(a) for a in args)
    kwargs = {k: _unwrap(v) for k, v in kwargs.items()}
    context = _context.ReplicaContext(strategy, engine.replica_id, _ReplicaOps(engine))
    with _context.in_replica(context):
        result = fn(*args, **kwargs)
    if engine.num_replicas == 1:
        return result

    def regroup(x):
        if isinstance(x, (torch.Tensor, np.ndarray, np.generic, int, float)) and not isinstance(x, bool):
            return TorchPerReplica([x], engine.num_replicas)
        return x

    return keras.tree.map_structure(regroup, result)


def _as_tensor(value):
    if isinstance(value, keras.Variable):
        value = value.value
    return keras.ops.convert_to_tensor(value)


def reduce(engine, reduce_op, value, axis):
    num = engine.num_replicas
    local = _as_tensor(_component(value))
    per_replica = isinstance(value, PerReplica)
    if axis is not None:
        count = torch.tensor(float(local.shape[axis]) if local.ndim else 1.0)
        local = torch.sum(local, dim=axis)
    if per_replica:
        (total,) = _collectives.all_reduce_sum([local])
    else:  # never distributed: MEAN gives it back, SUM is refused (as tf)
        check_summable(reduce_op, num)
        total = local * num
    if reduce_op is ReduceOp.SUM:
        return total
    if axis is None:
        return total / num
    (rows,) = _collectives.all_reduce_sum([count]) if per_replica else (count * num,)
    return total / rows.to(total.dtype)


def gather(engine, value, axis):
    local = _as_tensor(_component(value))
    if not isinstance(value, PerReplica):  # not distributed: as it is, as tf gives it back
        return local
    return _collectives.all_gather_rows(local, axis)


def local_results(engine, value):
    if isinstance(value, PerReplica):
        return tuple(value.values)
    return (value,)


def place_state(engine, state):
    """One replica per process, on its one device, where its variables
    are: the state is placed as `run` returns it already."""
    return state


# -- variables and optimizers inside run -------------------------------------

#: Whether this thread runs an optimizer's apply inside `run` (its writes are
#: the cross-replica update: each process applies the summed gradients).
_applying = threading.local()


def build_outside_replicas(build_fn):
    """torch runs `run`'s function eagerly, one replica per process: every
    process builds (creating the same variables in the same order)."""
    build_fn()


def sum_gradients_for_apply(grads):
    """Inside `run` of several replicas, and in fit's replica steps: each
    process's gradients are its own replica's, summed over the job here
    (one packed all-reduce) so clipping and updates see the global batch's."""
    from keras_dist import _shard

    if _collectives.world_size() == 1:
        return None
    if _context.replica_context() is None and not _shard.in_replica_step():
        return None
    step = _reducer.current()  # fit's step: the sums made as backward produced the gradients
    summed = None if step is None or step.reducer is None else step.reducer.take(grads)
    if summed is not None:
        return summed
    grads = list(grads)
    present = [i for i, g in enumerate(grads) if g is not None]
    check = None if step is None else step.check  # fit's same-batch check: sent along, verified before the apply
    if check is None:
        summed = _collectives.all_reduce_sum([grads[i] for i in present])
    else:
        device = grads[present[0]].device if present else torch.device("cpu")
        summed = check.fold([grads[i] for i in present], _collectives.all_reduce_sum, device)
    for i, g in zip(present, summed):
        grads[i] = g
    return grads


def apply_optimizer(optimizer, build, apply):
    """Inside `run`: the optimizer's writes are the cross-replica update, the
    same on every process (its gradients are summed), not aggregated again."""
    previous = getattr(_applying, "value", False)
    _applying.value = True
    try:
        return apply()
    finally:
        _applying.value = previous


def assign_delta_in_replica(variable, value, sign):
    """Inside `run` of several replicas: tf's aggregation of the increment
    across replicas ("sum": every replica's; "mean": their mean;
    "only_first_replica": replica 0's; "none": refused unless the same on
    every replica). None elsewhere: Keras' own method."""
    if _context.replica_context() is None or getattr(_applying, "value", False) or _collectives.world_size() == 1:
        return None
    delta = keras.ops.convert_to_tensor(value, dtype=variable.dtype)
    aggregation = variable.aggregation
    if aggregation == "sum":
        (delta,) = _collectives.all_reduce_sum([delta])
    elif aggregation == "mean":
        (delta,) = _collectives.all_reduce([delta], "MEAN")
    elif aggregation == "only_first_replica":
        (delta,) = _collectives.broadcast_from_first([delta])
    elif not _collectives.same_on_every_process(delta):
        raise ValueError(differs_across_replicas_message(variable.path, aggregation, "MirroredVariable"))
    return variable.assign(variable.value + delta if sign > 0 else variable.value - delta)
