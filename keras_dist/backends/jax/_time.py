"""JAX: timing one all-reduce of the training step's size (ScalingReport)."""

from __future__ import annotations

import time

import jax
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from keras_dist.backends.jax import _engine
from keras_dist.backends.jax._engine import BATCH_AXIS, JaxEngine


def time_all_reduce(engine: JaxEngine, shapes_and_dtypes, repeats: int = 5) -> float:
    """Median seconds to all-reduce buffers of these shapes over the engine.

    One compiled program sums one buffer per shape across the replicas, as
    the training step sums the gradients (same mesh, same compile options,
    so the same packing; one flat buffer where the step trains per
    replica); every worker must call it (it is a collective).
    """
    if engine.num_replicas == 1 or not shapes_and_dtypes:
        return 0.0
    if _engine.trains_per_replica(engine):  # one flat buffer per dtype
        sizes = {}
        for shape, dtype in shapes_and_dtypes:
            sizes[dtype] = sizes.get(dtype, 0) + int(np.prod(shape))
        shapes_and_dtypes = [((size,), dtype) for dtype, size in sizes.items()]

    sharding = NamedSharding(engine.mesh, PartitionSpec(BATCH_AXIS))
    buffers = []
    for shape, dtype in shapes_and_dtypes:
        global_shape = (engine.num_replicas,) + tuple(shape)
        zeros = np.zeros((1,) + tuple(shape), dtype)
        buffers.append(
            jax.make_array_from_callback(global_shape, sharding, lambda index, z=zeros: z)
        )

    def body(*values):
        return [jax.lax.psum(value[0], BATCH_AXIS) for value in values]

    program = jax.jit(
        jax.shard_map(
            body,
            mesh=engine.mesh,
            in_specs=(PartitionSpec(BATCH_AXIS),) * len(buffers),
            out_specs=[PartitionSpec()] * len(buffers),
        ),
        compiler_options=engine.compiler_options,
    )
    jax.block_until_ready(program(*buffers))  # compile and warm up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        jax.block_until_ready(program(*buffers))
        times.append(time.perf_counter() - start)
    return float(np.median(times))
