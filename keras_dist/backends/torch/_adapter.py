"""`TorchAdapter`: the PyTorch implementation of `keras_dist.backends.BackendAdapter`.

Each method is a function of the module that owns the concern: `_engine`
(devices, the engine, placement), `_cluster` (`torch.distributed` process
groups), `_replica` (custom loops), `_step` (fit's steps), `_time` (timing a
collective). One replica per process (torch.distributed's model).
"""

from __future__ import annotations

from keras_dist.backends._base import BackendAdapter
from keras_dist.backends.torch import _cluster, _engine, _replica, _step, _time


class TorchAdapter(BackendAdapter):
    name = "torch"
    # devices and placement
    visible_devices = staticmethod(_engine.visible_devices)
    global_devices = staticmethod(_engine.global_devices)
    simulate_cpu_devices = staticmethod(_engine.simulate_cpu_devices)
    check_cross_device_ops = staticmethod(_engine.check_cross_device_ops)
    create_engine = staticmethod(_engine.create_engine)
    scope = staticmethod(_engine.scope)
    owns_variable = staticmethod(_engine.owns_variable)
    # multi-process jobs
    initialize_multi_worker = staticmethod(_cluster.initialize_multi_worker)
    initialize_tpu_system = staticmethod(_cluster.initialize_tpu_system)
    is_multi_process = staticmethod(_cluster.is_multi_process)
    is_peer_failure = staticmethod(_cluster.is_peer_failure)
    values_from_chief = staticmethod(_cluster.values_from_chief)
    values_from_every_worker = staticmethod(_cluster.values_from_every_worker)
    # input
    iterate_batches = staticmethod(_replica.iterate_batches)
    split_global_batch = staticmethod(_replica.split_global_batch)
    combine_replica_batches = staticmethod(_replica.combine_replica_batches)
    # custom loops
    distribute_values = staticmethod(_replica.distribute_values)
    run = staticmethod(_replica.run)
    reduce = staticmethod(_replica.reduce)
    gather = staticmethod(_replica.gather)
    local_results = staticmethod(_replica.local_results)
    place_state = staticmethod(_replica.place_state)
    # Keras training steps
    make_trainer_function = staticmethod(_step.make_trainer_function)
    build_outside_replicas = staticmethod(_replica.build_outside_replicas)
    assign_delta_in_replica = staticmethod(_replica.assign_delta_in_replica)
    sum_gradients_over_replicas = staticmethod(_step.sum_gradients_over_replicas)
    sum_gradients_for_apply = staticmethod(_replica.sum_gradients_for_apply)
    apply_optimizer = staticmethod(_replica.apply_optimizer)
    global_moments = staticmethod(_step.global_moments)
    # measurement
    time_all_reduce = staticmethod(_time.time_all_reduce)
    # Optional capabilities torch lacks (None, BackendAdapter's default):
    # the parameter-server group and its variables (ParameterServerStrategy
    # is not supported on torch), distribute_dataset_natively (batches are
    # split on the host), create_server, from_backend_object.
    unsupported = {
        "parameter_servers": "use MultiWorkerMirroredStrategy (synchronous, exact), or the JAX (Ray) or TensorFlow "
        "backend for parameter servers.",
        "create_server": "on the torch backend there are no parameter-server tasks to serve.",
    }
