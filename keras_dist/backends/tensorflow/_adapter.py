"""`TensorFlowAdapter`: the TensorFlow implementation of
`keras_dist.backends.BackendAdapter`.

Each method is a function of the module that owns the concern: `_engine`
(tf.distribute strategies, devices, joining a job), `_replica` (custom
loops), `_step` (fit's steps), `_time` (timing a collective), `_foreign`
(tf.distribute's own objects, as keras_dist's).
"""

from __future__ import annotations

from keras_dist.backends._base import BackendAdapter
from keras_dist.backends.tensorflow import _cluster, _engine, _foreign, _parameter_servers, _replica, _step, _time


class TensorFlowAdapter(BackendAdapter):
    name = "tensorflow"
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
    distribute_dataset_natively = staticmethod(_replica.distribute_dataset_natively)
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
    global_moments = staticmethod(_step.global_moments)
    # parameter servers
    create_coordinator = staticmethod(_parameter_servers.create_coordinator)
    schedule = staticmethod(_parameter_servers.schedule)
    fetch = staticmethod(_parameter_servers.fetch)
    join = staticmethod(_parameter_servers.join)
    done = staticmethod(_parameter_servers.done)
    create_per_worker_dataset = staticmethod(_parameter_servers.create_per_worker_dataset)
    create_server = staticmethod(_parameter_servers.create_server)
    variable_parts = staticmethod(_parameter_servers.variable_parts)
    assign_on_ps = staticmethod(_parameter_servers.assign_on_ps)
    apply_optimizer = staticmethod(_replica.apply_optimizer)
    # measurement
    time_all_reduce = staticmethod(_time.time_all_reduce)
    # the backend library's own objects
    from_backend_object = staticmethod(_foreign.from_backend_object)
