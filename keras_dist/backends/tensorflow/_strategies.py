"""tf.distribute's strategies as keras_dist's engines: subclasses that keep
Keras' input global (each step's batch is split by keras_dist, not by tf),
over one process's devices or one multi-worker job's."""

from __future__ import annotations

import tensorflow as tf
from tensorflow.python.distribute import collective_all_reduce_strategy
from tensorflow.python.distribute import distribute_lib
from tensorflow.python.distribute import distribute_utils
from tensorflow.python.distribute import parameter_server_strategy
from tensorflow.python.distribute import ps_values
from tensorflow.python.eager import context as tf_context

from keras_dist._values import differs_across_replicas_message



def _local_task() -> str:
    """"/job:<job>/task:<i>" of this process in its cluster."""
    from tensorflow.python.eager import context as tf_context

    parts = tf_context.context().host_address_space().strip("/").split("/")
    return "/" + "/".join(p for p in parts if not p.startswith("replica:"))


def _task_devices(worker_device: str, device_type=None) -> list:
    """The logical devices of one task ("/job:worker/task:1"): once the
    cluster's server runs, TF lists the devices of every task."""
    job, task = worker_device.strip("/").split("/")[:2]
    return [
        d
        for d in tf.config.list_logical_devices(device_type)
        if f"/{job}/" in d.name and f"/{task}/" in d.name
    ]


def _tf_device(canonical: str) -> str:
    """tf's full name of this process's device `canonical` ("cpu:1"): under
    its own task's name once it is connected to a cluster (a
    ClusterCoordinator's: "/job:chief/..."), else "/job:localhost/..."."""
    kind, index = canonical.split(":")
    from tensorflow.python.eager import context as tf_context

    return f"{tf_context.context().host_address_space()}/device:{kind.upper()}:{index}"


class _GlobalBatchInput:
    """Mixed into each tf strategy keras_dist runs on, so Keras' input stays
    global.

    Keras hands each dataset to `experimental_distribute_dataset`; here that
    returns the dataset unchanged, so every step receives the whole global
    batch and each replica takes its own contiguous rows (`replica_step`).
    tf.data's own rebatching cannot do that exactly: with an unknown batch
    size (generators, PyDataset) it hands whole batches to replicas.
    """

    def experimental_distribute_dataset(self, dataset, options=None):
        return dataset


class _GlobalBatchMirroredStrategy(_GlobalBatchInput, tf.distribute.MirroredStrategy):
    """tf.distribute.MirroredStrategy whose Keras input stays global."""


class _GlobalBatchOneDeviceStrategy(_GlobalBatchInput, tf.distribute.OneDeviceStrategy):
    """tf.distribute.OneDeviceStrategy whose Keras input stays global: its
    variables are plain ones on the device, so `tf.GradientTape` reads them
    outside `run`, as in tf."""


class _CentralStorageExtended(parameter_server_strategy.ParameterServerStrategyExtended):
    """tf's CentralStorage extended, with what Keras 3 needs of it.

    - Metric accumulators (``synchronization="on_read"``) get one partial
      value per compute device, aggregated when read (tf's SyncOnRead
      variables, as under MirroredStrategy). tf keeps them once and sums
      each replica's *write* in a merge_call, which is right for
      ``assign_add`` but not for Keras 3 metrics that write
      ``assign(var + x)`` (AUC: n * old + sum of the parts).
    - Non-trainable variables with no aggregation (BatchNormalization's
      moving statistics, seed states) take replica 0's write: keras_dist
      makes every replica compute the same value (global moments), and tf
      refuses an un-aggregated write in replica context.
    - A variable made inside a `tf.function` (a layer built lazily by the
      first call in a traced step) is wrapped as tf wraps one made
      eagerly; tf's own creator then fails (`Using a symbolic tf.Tensor as
      a Python bool`: it looks the variable up in graph collections, which
      Keras 3 does not use), under plain tf.distribute too.
    Everything else is tf's: one variable on the parameter device, and
    the optimizer applies the summed gradient there once.
    """

    def _create_var_creator(self, next_creator, **kwargs):
        if self._num_replicas_in_sync <= 1:
            return super()._create_var_creator(next_creator, **kwargs)
        aggregation = kwargs.pop("aggregation", tf.VariableAggregation.NONE)
        super()._create_var_creator(next_creator, aggregation=aggregation, **kwargs)  # tf's checks

        def var_creator(**kwargs):
            kwargs.pop("collections", None)
            return _CentralVariable(self._container_strategy(), next_creator(**kwargs), aggregation)

        return var_creator

    def _create_variable(self, next_creator, **kwargs):
        synchronization = kwargs.get("synchronization")
        if synchronization == tf.VariableSynchronization.ON_READ and "colocate_with" not in kwargs:
            return self._create_per_device_variable(next_creator, **kwargs)
        if (
            kwargs.get("aggregation", tf.VariableAggregation.NONE) == tf.VariableAggregation.NONE
            and not kwargs.get("trainable", True)
        ):
            kwargs["aggregation"] = tf.VariableAggregation.ONLY_FIRST_REPLICA
        return super()._create_variable(next_creator, **kwargs)

    def _create_per_device_variable(self, next_creator, **kwargs):
        devices = self._compute_devices

        def creator(**kwargs):
            created = []
            for index, device in enumerate(devices):
                with tf.device(device):
                    if index:
                        first = created[0]
                        kwargs["initial_value"] = lambda: tf.identity(first.value())
                        kwargs["name"] = "%s/replica_%d/" % (first.name.split(":")[0], index)
                    with tf_context.device_policy(tf_context.DEVICE_PLACEMENT_SILENT):
                        created.append(next_creator(**kwargs))
            return created

        return distribute_utils.create_mirrored_variable(
            self._container_strategy(),
            creator,
            distribute_utils.VARIABLE_CLASS_MAPPING,
            distribute_utils.VARIABLE_POLICY_MAPPING,
            **kwargs,
        )


class _CentralVariable(ps_values.AggregatingVariable):
    """tf's AggregatingVariable (one copy, on the parameter device), whose
    aggregation "none" means what it means on JAX: written inside `run`, a
    value that is the same on every replica is written once (Keras' Nadam
    writes its momentum product so; tf refuses every such write), and one
    that differs raises, naming the fix."""

    def _assign_func(self, *args, **kwargs):
        if self._aggregation != tf.VariableAggregation.NONE:
            return super()._assign_func(*args, **kwargs)
        with distribute_lib.enter_or_assert_strategy(self._distribute_strategy):
            if distribute_lib.in_cross_replica_context():
                return super()._assign_func(*args, **kwargs)
            update = kwargs.pop("f")

            def merge_fn(strategy, value, use_locking=False, name=None, read_value=True):
                first = _same_on_every_replica(strategy, value, self.name.split(":")[0])
                return strategy.extended.update(
                    self, update, args=(first,), kwargs={"use_locking": use_locking, "read_value": read_value}
                )

            return distribute_lib.get_replica_context().merge_call(merge_fn, args=args, kwargs=kwargs)


def _same_on_every_replica(strategy, value, name):
    """Replica 0's `value` (a PerReplica, or one value), after checking
    every replica's equals it."""
    values = strategy.experimental_local_results(value)
    first = tf.convert_to_tensor(values[0])
    checks = [
        tf.debugging.assert_equal(
            first,
            other,
            message=differs_across_replicas_message(name, "none", "AggregatingVariable"),
        )
        for other in values[1:]
    ]
    with tf.control_dependencies(checks):
        return tf.identity(first)


class _GlobalBatchCentralStorageStrategy(_GlobalBatchInput, tf.distribute.experimental.CentralStorageStrategy):
    """tf.distribute's CentralStorageStrategy whose Keras input stays global:
    variables live once, on the parameter device; each replica takes its rows
    of the global batch."""

    def __init__(self, compute_devices, parameter_device):
        # tf's constructor hard-codes its extended class; build ours instead.
        distribute_lib.Strategy.__init__(
            self,
            _CentralStorageExtended(
                self, compute_devices=compute_devices, parameter_device=parameter_device
            ),
        )


class _LocalCpusCollectiveExtended(
    collective_all_reduce_strategy.CollectiveAllReduceExtended
):
    """tf's multi-worker extended, with one replica per local logical CPU.

    tf gives a GPU-less worker a single CPU replica; keras_dist simulates
    several CPU devices per worker, so each becomes a replica, as on GPUs.
    """

    def _initialize_local_devices(self, cluster_resolver, worker_device):
        devices, kind = super()._initialize_local_devices(
            cluster_resolver, worker_device
        )
        cpus = _task_devices(worker_device, "CPU")
        if kind == "CPU" and len(cpus) > 1:
            devices = tuple(
                f"{worker_device}/device:CPU:{i}" for i in range(len(cpus))
            )
        return devices, kind

    def _use_merge_call(self):
        # Replica all-reduces launch their collectives directly, as tf does
        # for XLA on GPUs; through merge_call, tensors without a device get
        # no destination in graph mode ("destinations can not be empty").
        return False


class _GlobalBatchMultiWorkerStrategy(_GlobalBatchInput, tf.distribute.MultiWorkerMirroredStrategy):
    """tf.distribute.MultiWorkerMirroredStrategy whose Keras input stays global.

    Every worker receives the same global batch and each replica (numbered
    across workers) takes its own contiguous rows.
    """

    def __init__(self, cluster_resolver, communication_options):
        # tf's constructor hard-codes its extended class; build ours instead.
        distribute_lib.Strategy.__init__(
            self,
            _LocalCpusCollectiveExtended(
                self,
                cluster_resolver=cluster_resolver,
                communication_options=communication_options,
            ),
        )


class _GlobalBatchTPUStrategy(_GlobalBatchInput, tf.distribute.TPUStrategy):
    """tf.distribute.TPUStrategy whose Keras input stays global (used only
    on a real TPU: untested)."""


# tf names the strategy class in its messages ("Using %s eagerly has
# significant overhead ..."): the user's strategy's name, not these
# private classes' (their __qualname__, in tracebacks, stays).
for _engine_class, _public_name in (
    (_GlobalBatchTPUStrategy, "TPUStrategy"),
    (_GlobalBatchMirroredStrategy, "MirroredStrategy"),
    (_GlobalBatchOneDeviceStrategy, "OneDeviceStrategy"),
    (_GlobalBatchCentralStorageStrategy, "CentralStorageStrategy"),
    (_GlobalBatchMultiWorkerStrategy, "MultiWorkerMirroredStrategy"),
):
    _engine_class.__name__ = _public_name
del _engine_class, _public_name
