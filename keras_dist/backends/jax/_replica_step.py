"""JAX: a training step run per replica, with one packed gradient all-reduce.

The default JAX step is written on global arrays and XLA's SPMD partitioner
inserts the all-reduces. XLA combines them into one tuple all-reduce, but
on CPU its gloo collectives run each tuple element as its own all-reduce,
and each costs a round of socket traffic (and, with one core per worker,
the wait for gloo's busy event loop to yield the core). So for
multi-process CPU jobs the training step runs instead as one replica of
many under `jax.shard_map`, as the TensorFlow engine runs it:

- each replica runs Keras' own `train_step` on its rows; the hooks scale
  its loss by local rows / global rows (`scale_factor`), and
  BatchNormalization takes moments over the global batch (`global_moments`);
- the gradients are summed across replicas in ONE all-reduce of one flat
  buffer (`sum_gradients_over_replicas`, applied by the
  `compute_loss_and_updates` hook), so every replica applies the same
  update;
- metric variables are combined by their aggregation in one more packed
  all-reduce, and the logs are computed from the combined values.

It is taken only where it computes what one device computes: batches that
divide evenly over the replicas (`_engine.divides_evenly`), default packing
(`_engine.trains_per_replica`), and models that use Keras' own `train_step`
and `compute_loss_and_updates` and have no random layers (each replica
would draw its own numbers; `_step.trains_exactly_per_replica`). Everything
else keeps the SPMD step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import PartitionSpec as P

from keras_dist import _metric_state, _moments, _shard
from keras_dist.backends.jax._engine import BATCH_AXIS


def packed_psum(values):
    """Sums a list of arrays across replicas, one all-reduce per dtype.

    The arrays are flattened into one buffer per dtype, summed, and cut
    back into their shapes.
    """
    values = list(values)
    out = [None] * len(values)
    by_dtype = {}
    for index, value in enumerate(values):
        by_dtype.setdefault(jnp.result_type(value), []).append(index)
    for indices in by_dtype.values():
        flat = jnp.concatenate([jnp.ravel(values[i]) for i in indices])
        summed = jax.lax.psum(flat, BATCH_AXIS)
        offset = 0
        for i in indices:
            size = int(np.prod(np.shape(values[i])))
            out[i] = summed[offset : offset + size].reshape(np.shape(values[i]))
            offset += size
    return out


def sum_gradients_over_replicas(values):
    """Identity on `values`; their gradients are summed across replicas.

    The backward pass sums all cotangents in one packed all-reduce.
    """

    @jax.custom_vjp
    def identity(values):
        return values

    def forward(values):
        return values, None

    def backward(_, cotangents):
        return (packed_psum(cotangents),)

    identity.defvjp(forward, backward)
    return identity(list(values))


def global_moments(inputs, axes, mask):
    """BatchNormalization moments over the global batch (see `keras_dist._moments`)."""
    return _moments.global_moments(inputs, axes, mask, packed_psum)


def make_train_step(engine, model):
    """`step(state, data) -> (logs, state)` to jit: Keras' step per replica."""
    num = engine.num_replicas

    def body(state, data):
        local_rows = next(x for x in jax.tree_util.tree_leaves(data) if np.ndim(x) >= 1).shape[0]
        with _shard.shard_scope(_shard.Shard(local_rows, local_rows * num, replicas=num)):
            logs, new_state = model.train_step(state, data)
        *rest, metrics = new_state
        variables = model.metrics_variables
        metrics = _metric_state.combine_by_aggregation(  # every replica started from the same values
            variables, metrics, packed_psum, jax.lax.axis_index(BATCH_AXIS) == 0, num, starts=list(state[3])
        )
        logs = _metric_state.global_logs(
            logs, variables, lambda: metrics, model.get_metrics_result, lambda v: jax.lax.pmean(v, BATCH_AXIS)
        )
        return logs, (*rest, metrics)

    def step(state, data):
        specs = jax.tree_util.tree_map(lambda _: P(BATCH_AXIS), data)  # None stays None
        return jax.shard_map(
            body,
            mesh=engine.mesh,
            in_specs=(P(), specs),
            out_specs=(P(), P()),
            check_vma=False,  # gradients are summed by hand, once, packed
        )(state, data)

    return step
