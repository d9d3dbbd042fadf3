"""`ParameterServerStrategy`: asynchronous training with parameter servers.

The core half: the cluster's shape and its checks. The engine (TensorFlow:
tf's own `ParameterServerStrategy` over `tf.distribute.Server`s; JAX: Ray
actors) is the adapter's, built by `create_engine`; functions reach the
workers through `keras_dist.coordinator.ClusterCoordinator`.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from keras_dist import _foreign
from keras_dist._engine_kind import EngineKind
from keras_dist._input import check_dataset_fn_result
from keras_dist.strategies._base import Strategy, StrategyExtended
from keras_dist.backends import get_adapter

#: The jobs a parameter-server cluster may have.
_JOBS = ("chief", "worker", "ps", "evaluator")


class _ParameterServerExtended(StrategyExtended):
    engine_kind = EngineKind.PARAMETER_SERVER

    def __init__(self, strategy, resolver, variable_partitioner):
        super().__init__(strategy, ("cpu:0",))
        self._resolver = resolver
        self._variable_partitioner = variable_partitioner
        spec = resolver.cluster_spec()
        self._num_ps = spec.num_tasks("ps")
        self._num_remote_workers = spec.num_tasks("worker")

    @property
    def parameter_devices(self) -> tuple[str, ...]:
        """One per ps task: where the variables live."""
        return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(self._num_ps))

    @property
    def cluster_resolver(self) -> Any:
        return self._resolver

    @property
    def variable_partitioner(self) -> Optional[Callable]:
        """The partitioner the strategy was made with, or None."""
        return self._variable_partitioner

    @property
    def num_ps(self) -> int:
        return self._num_ps

    @property
    def num_remote_workers(self) -> int:
        """The `worker` tasks that run scheduled functions."""
        return self._num_remote_workers

    @property
    def num_workers(self) -> int:
        # The coordinator's process is the only one running this program's
        # cross-replica code: for input and checkpoints it is one worker.
        return 1


def require_parameter_servers(adapter) -> None:
    """Raises NotImplementedError, naming the backend, when its adapter has
    no parameter-server engine (the optional capability group
    `CAPABILITY_GROUPS["parameter_servers"]` left None)."""
    from keras_dist.backends import CAPABILITY_GROUPS

    if all(getattr(adapter, name) is not None for name in CAPABILITY_GROUPS["parameter_servers"]):
        return
    hint = adapter.unsupported.get(
        "parameter_servers", "use MultiWorkerMirroredStrategy (synchronous), or the JAX or TensorFlow backend."
    )
    raise NotImplementedError(f"ParameterServerStrategy is not supported on the {adapter.name} backend: {hint}")


class ParameterServerStrategy(Strategy):
    """Asynchronous data parallelism: variables on parameter servers,
    functions run by workers, scheduled from a coordinator.

    The program runs on the coordinator (the cluster's `chief` task);
    `keras_dist.coordinator.ClusterCoordinator(strategy).schedule(fn)` runs
    `fn` on a free worker. Each worker applies its own gradients to the
    variables on the parameter servers, without waiting for the others:
    not bitwise equal to one device, but no update is lost.

    ```text  (needs a cluster: run under `keras-dist launch --workers N --ps M`)
    resolver = keras_dist.cluster_resolver.TFConfigClusterResolver()
    strategy = keras_dist.ParameterServerStrategy(resolver)
    coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
    ```
    """

    def __init__(self, cluster_resolver: Any = None, variable_partitioner: Optional[Callable] = None):
        from keras_dist.cluster_resolver import TFConfigClusterResolver

        require_parameter_servers(get_adapter())
        get_adapter().check_parameter_servers_supported()  # a missing package: say so now
        resolver = _foreign.accept(cluster_resolver, "cluster_resolver") or TFConfigClusterResolver()
        check_parameter_server_cluster(resolver)
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise TypeError(
                "variable_partitioner must be a callable (shape, dtype) -> "
                "partitions, such as keras_dist.experimental.partitioners."
                f"MinSizePartitioner(); got {variable_partitioner!r}."
            )
        self._cluster_resolver = resolver
        super().__init__(_ParameterServerExtended(self, resolver, variable_partitioner))

    @property
    def cluster_resolver(self):
        return self._cluster_resolver

    def __repr__(self) -> str:
        extended = self._extended
        return (
            f"ParameterServerStrategy(workers={extended.num_remote_workers}, "
            f"ps={extended.num_ps})"
        )


def check_parameter_server_cluster(resolver: Any) -> None:
    """Raises, naming the fix, unless `resolver` describes a parameter-server
    cluster this process can coordinate."""
    spec = resolver.cluster_spec()
    jobs = set(spec.jobs) if spec else set()
    unknown = sorted(jobs - set(_JOBS))
    if unknown:
        raise ValueError(
            f"A parameter-server cluster has the jobs {list(_JOBS)}; this one "
            f"also has {unknown}."
        )
    if "ps" not in jobs or spec.num_tasks("ps") == 0:
        raise ValueError(
            "ParameterServerStrategy needs at least one 'ps' task in the cluster "
            f"(jobs found: {sorted(jobs) or 'none'}). Add a 'ps' job to TF_CONFIG "
            "or start the job with `keras-dist launch --workers N --ps M`; for "
            "synchronous training without parameter servers use "
            "keras_dist.MultiWorkerMirroredStrategy."
        )
    if "worker" not in jobs or spec.num_tasks("worker") == 0:
        raise ValueError(
            "ParameterServerStrategy needs at least one 'worker' task to run "
            f"scheduled functions (jobs found: {sorted(jobs)}). Add a 'worker' "
            "job to TF_CONFIG or start the job with `keras-dist launch --workers N --ps M`."
        )
    task_type = resolver.task_type
    if task_type not in (None, "chief"):
        raise ValueError(
            f"ParameterServerStrategy is made on the coordinator (the 'chief' "
            f"task); this process is {task_type!r}. Worker and ps tasks run "
            "`keras_dist.Server(...).join()` instead, as in tf.distribute."
        )


class DatasetCreator:
    """A dataset function for `model.fit` under a `ParameterServerStrategy`
    (tf.keras.utils.experimental.DatasetCreator's spelling, exported as
    `keras_dist.experimental.DatasetCreator`).

    Each worker calls `dataset_fn(input_context)` to make its own input (a
    `keras_dist.InputContext`); the dataset should repeat, and `fit` needs
    `steps_per_epoch`. A plain callable works the same.

    >>> creator = DatasetCreator(lambda context: [1, 2, 3])
    >>> creator(None)
    [1, 2, 3]
    """

    def __init__(self, dataset_fn: Callable, input_options: Any = None):
        if not callable(dataset_fn):
            raise TypeError(
                "DatasetCreator takes a function making the dataset (called with "
                f"an InputContext on each worker), got {type(dataset_fn).__name__}."
            )
        if input_options is not None:
            raise ValueError(
                "DatasetCreator(input_options=...) is not supported: each worker "
                "iterates its own dataset as dataset_fn makes it; leave it None."
            )
        self.dataset_fn = dataset_fn
        self.input_options = input_options

    def __call__(self, *args, **kwargs):
        return check_dataset_fn_result(self.dataset_fn(*args, **kwargs), self.dataset_fn)

    def __repr__(self) -> str:
        return f"DatasetCreator({self.dataset_fn!r})"


def call_dataset_fn(dataset_fn: Callable, input_context: Any) -> Any:
    """`dataset_fn(input_context)`, or `dataset_fn()` if it takes no
    argument; its result checked to be a dataset."""
    import inspect

    if isinstance(dataset_fn, DatasetCreator):
        return dataset_fn(input_context)
    try:
        parameters = inspect.signature(dataset_fn).parameters.values()
    except (TypeError, ValueError):
        return check_dataset_fn_result(dataset_fn(input_context), dataset_fn)
    takes_one = any(
        p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters
    )
    return check_dataset_fn_result(dataset_fn(input_context) if takes_one else dataset_fn(), dataset_fn)
