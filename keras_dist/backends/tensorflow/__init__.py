"""TensorFlow adapter: `tf.distribute` strategies underneath.

Variables are `tf.distribute` mirrored (metrics: sync-on-read sums). Each
step receives the whole global batch and every replica takes its own
contiguous rows, so any batch size splits exactly (tf.data's rebatching
cannot: with an unknown batch size it hands whole batches to replicas).
keras_dist owns what Keras 3's TF trainer gets wrong: each replica's loss is
scaled by its share of the *global* batch (local rows / global rows) instead
of by 1 / replica count, BatchNormalization uses global-batch moments
(two-pass, all-reduced), per-step logs are read from the aggregated
metrics, and ``*_on_batch`` calls split their batch instead of copying it to
every replica.
"""

from keras_dist.backends.tensorflow._adapter import (  # noqa: F401
    check_cross_device_ops,
    create_engine,
    global_devices,
    global_moments,
    initialize_multi_worker,
    is_multi_process,
    is_peer_failure,
    in_replica_step,
    make_predict_function,
    make_step_function,
    name,
    owns_variable,
    replica_step,
    scale_factor,
    slice_for_replica,
    time_all_reduce,
    scope,
    simulate_cpu_devices,
    unscale_factor,
    visible_devices,
)
from keras_dist.backends.tensorflow._replica import (  # noqa: F401
    build_outside_replicas,
    combine_replica_batches,
    gather,
    iterate_batches,
    local_results,
    reduce,
    run,
    split_global_batch,
)
