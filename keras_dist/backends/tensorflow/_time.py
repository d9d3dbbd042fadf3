"""TensorFlow: timing one all-reduce of the training step's size (ScalingReport)."""

from __future__ import annotations

import time

import numpy as np
import tensorflow as tf


def time_all_reduce(engine, shapes_and_dtypes, repeats: int = 5) -> float:
    """Median seconds to all-reduce buffers of these shapes over the engine.

    One `tf.function` sums one buffer per shape across the replicas with
    `ReplicaContext.all_reduce`, the path the training step's gradients
    take (the engine's cross-device ops, its packing). The buffers are put
    on the replicas' devices beforehand, so only the reduction is timed.
    """
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
