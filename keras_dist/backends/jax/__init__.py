"""JAX adapter: a `jax.sharding.Mesh` over the strategy's devices.

Variables are replicated on the mesh (through a Keras `DataParallel`
distribution, so Keras places them itself); each global batch is sharded
along the mesh's ``batch`` axis inside the compiled step, so XLA's SPMD
partitioner splits the work and inserts the all-reduces. Because the step
is written on global arrays, losses, metrics and BatchNorm statistics are
those of the global batch, exactly as on one device. Batches that do not
divide by the replica count are handed to the step replicated and sharded
inside it; XLA pads and masks the uneven shards. Multi-process CPU jobs
train even batches per replica instead, with one packed gradient
all-reduce (see `_replica_step`).
"""

from keras_dist.backends.jax._adapter import (  # noqa: F401
    JaxEngine,
    batch_sharding,
    check_cross_device_ops,
    compiler_options_for,
    constrain_batch,
    create_engine,
    divides_evenly,
    engine_of_distribution,
    gather_uneven_outputs,
    global_devices,
    initialize_multi_worker,
    is_multi_process,
    is_peer_failure,
    name,
    owns_variable,
    place_global_batch,
    place_host_data,
    replicated_sharding,
    scope,
    simulate_cpu_devices,
    splits_evenly_on_entry,
    sync_from_chief,
    time_all_reduce,
    visible_devices,
)
from keras_dist.backends.jax._replica_step import (  # noqa: F401
    global_moments,
    in_replica_step,
    scale_factor,
    sum_gradients_over_replicas,
    unscale_factor,
)
from keras_dist.backends.jax._replica_step import engine_trains_per_replica  # noqa: F401
from keras_dist.backends.jax._replica_step import make_train_step as make_replica_train_step  # noqa: F401
from keras_dist.backends.jax._replica import (  # noqa: F401
    JaxPerReplica,
    combine_replica_batches,
    gather,
    iterate_batches,
    local_results,
    reduce,
    run,
    split_global_batch,
)
