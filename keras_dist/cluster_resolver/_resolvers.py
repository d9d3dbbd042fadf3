"""`ClusterResolver`, `SimpleClusterResolver` and `TFConfigClusterResolver`.

Standard library only: no backend is imported here.
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from typing import Any, Mapping, Optional, Union

from keras_dist.cluster_resolver._cluster_spec import (
    ClusterSpec,
    _describe,
    _key,
    normalize_cluster,
    take_foreign,
)

TF_CONFIG = "TF_CONFIG"


def format_master_url(master: str, rpc_layer: Optional[str] = None) -> str:
    """`master` prefixed with `rpc_layer://` when both are given ("" stays "")."""
    return f"{rpc_layer}://{master}" if rpc_layer and master else master


def _check_task_id(task_id: Any, name: str = "task_id") -> Optional[int]:
    if task_id is None:
        return None
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise TypeError(f"{name} must be an integer or None, got {_describe(task_id)}")
    if task_id < 0:
        raise ValueError(f"{name} must be >= 0, got {task_id}")
    return task_id


def _check_optional_str(value: Any, name: str) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"{name} must be a string or None, got {_describe(value)}")
    return value


def _worker_tasks(spec: ClusterSpec) -> list[tuple[str, int]]:
    """`(job, index)` of the chief tasks then the worker tasks, in order."""
    return [
        (job, index)
        for job in ("chief", "worker")
        if job in spec.jobs
        for index in spec.task_indices(job)
    ]


class ClusterResolver(abc.ABC):
    """Where this process sits in a cluster (as `tf.distribute.cluster_resolver`).

    Subclasses implement `cluster_spec()` and `master()`. On top of
    TensorFlow's API, the base class derives the facts a multi-worker strategy
    needs: `num_workers`, `is_chief`, `chief_address` and `worker_index`. The
    workers are the `chief` task (if any) followed by the `worker` tasks;
    `ps` and `evaluator` tasks are not workers. The chief is the `chief` task
    if there is a chief job, else worker 0. An empty cluster spec is a
    single-process job: one worker, which is the chief.

    >>> class Fixed(ClusterResolver):
    ...     def cluster_spec(self):
    ...         return ClusterSpec({"chief": ["c:1"], "worker": ["w0:1", "w1:1"]})
    ...     def master(self, task_type=None, task_id=None, rpc_layer=None):
    ...         return ""
    >>> resolver = Fixed()
    >>> resolver.task_type, resolver.task_id = "worker", 0
    >>> resolver.num_workers, resolver.worker_index, resolver.is_chief
    (3, 1, False)
    >>> resolver.chief_address
    'c:1'
    """

    @abc.abstractmethod
    def cluster_spec(self) -> ClusterSpec:
        """The `ClusterSpec` of the whole cluster."""

    @abc.abstractmethod
    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The address of a task (this one by default), as `rpc_layer://host:port`."""

    def num_accelerators(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """Accelerators per task, as `{"GPU": n}`; `{}` (unknown) by default."""
        del task_type, task_id, config_proto
        return {}

    @property
    def task_type(self) -> Optional[str]:
        """This task's job name ("chief", "worker", "ps", "evaluator"), or None."""
        return getattr(self, "_task_type", None)

    @task_type.setter
    def task_type(self, task_type: Optional[str]) -> None:
        self._task_type = _check_optional_str(task_type, "task_type")

    @property
    def task_id(self) -> Optional[int]:
        """This task's index within its job, or None."""
        return getattr(self, "_task_id", None)

    @task_id.setter
    def task_id(self, task_id: Optional[int]) -> None:
        self._task_id = _check_task_id(task_id)

    @property
    def rpc_layer(self) -> Optional[str]:
        """The protocol between tasks (e.g. "grpc"), or None."""
        return getattr(self, "_rpc_layer", None)

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: Optional[str]) -> None:
        self._rpc_layer = _check_optional_str(rpc_layer, "rpc_layer")

    @property
    def environment(self) -> str:
        """The environment the cluster runs in (e.g. "cloud"); "" by default."""
        return ""

    # keras_dist helpers -------------------------------------------------

    @property
    def num_workers(self) -> int:
        """Number of chief and worker tasks; 1 for an empty (single-process) cluster."""
        spec = self.cluster_spec()
        if not spec:
            return 1
        return len(_worker_tasks(spec))

    @property
    def is_chief(self) -> bool:
        """Whether this task is the chief (True in a single-process job)."""
        spec = self.cluster_spec()
        if not spec:
            return True
        workers = _worker_tasks(spec)
        return bool(workers) and workers[0] == (self.task_type, self.task_id)

    @property
    def chief_address(self) -> Optional[str]:
        """The chief task's address; None without one (e.g. a single-process job)."""
        spec = self.cluster_spec()
        workers = _worker_tasks(spec)
        return spec.task_address(*workers[0]) if workers else None

    @property
    def worker_index(self) -> Optional[int]:
        """This task's position among the chief then worker tasks.

        0 in a single-process job; None for a task that is not a worker
        (`ps`, `evaluator`) or when this task is unknown.
        """
        spec = self.cluster_spec()
        if not spec:
            return 0
        try:
            return _worker_tasks(spec).index((self.task_type, self.task_id))
        except ValueError:
            return None

    def _master_of(
        self,
        task_type: Optional[str],
        task_id: Optional[int],
        rpc_layer: Optional[str],
    ) -> str:
        """`master()` from the cluster spec, for this task by default ("" if unknown)."""
        task_type = self.task_type if task_type is None else task_type
        task_id = self.task_id if task_id is None else task_id
        if task_type is None or task_id is None:
            return ""
        address = self.cluster_spec().task_address(task_type, task_id)
        return format_master_url(address, rpc_layer or self.rpc_layer)


class SimpleClusterResolver(ClusterResolver):
    """A resolver that returns what it was given.

    >>> resolver = SimpleClusterResolver(
    ...     ClusterSpec({"worker": ["w0:2222", "w1:2222"]}),
    ...     task_type="worker", task_id=1, rpc_layer="grpc")
    >>> resolver.master(), resolver.master("worker", 0)
    ('', 'grpc://w0:2222')
    >>> resolver.num_workers, resolver.worker_index, resolver.is_chief
    (2, 1, False)
    """

    def __init__(
        self,
        cluster_spec: Union[ClusterSpec, Mapping[str, Any]],
        master: str = "",
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        environment: str = "",
        num_accelerators: Optional[Mapping[str, int]] = None,
        rpc_layer: Optional[str] = None,
    ):
        cluster_spec = take_foreign(cluster_spec, "cluster_spec")  # TensorFlow: a tf.train.ClusterSpec
        if not isinstance(cluster_spec, (ClusterSpec, Mapping)):
            raise TypeError(
                f"cluster_spec must be a ClusterSpec or a dict, got {_describe(cluster_spec)}"
            )
        if not isinstance(master, str):
            raise TypeError(f"master must be a string, got {_describe(master)}")
        if not isinstance(environment, str):
            raise TypeError(f"environment must be a string, got {_describe(environment)}")
        if num_accelerators is not None and not isinstance(num_accelerators, Mapping):
            raise TypeError(
                "num_accelerators must be a dict such as {'GPU': 2} or None, "
                f"got {_describe(num_accelerators)}"
            )
        self._cluster_spec = ClusterSpec(cluster_spec)
        self._master = master
        self.task_type = task_type
        self.task_id = task_id
        self._environment = environment
        self._num_accelerators = dict(num_accelerators or {})
        self.rpc_layer = rpc_layer

    def cluster_spec(self) -> ClusterSpec:
        return ClusterSpec(self._cluster_spec)

    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The given task's address, else the `master` given to the constructor."""
        if task_type is not None and task_id is not None:
            master = self._cluster_spec.task_address(task_type, task_id)
        else:
            master = self._master
        return format_master_url(master, rpc_layer or self.rpc_layer)

    def num_accelerators(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        del task_type, task_id, config_proto
        return dict(self._num_accelerators)

    @property
    def environment(self) -> str:
        return self._environment


# TF_CONFIG ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _TFConfig:
    cluster: ClusterSpec
    task_type: Optional[str]
    task_id: Optional[int]
    rpc_layer: Optional[str]
    environment: Optional[str]


_ROOT = TF_CONFIG


def _field(*keys: Any) -> str:
    return _ROOT + "".join(_key(key) for key in keys)


def parse_tf_config(text: Optional[str]) -> _TFConfig:
    """Parse and validate a TF_CONFIG JSON string (None or blank: no cluster).

    Every problem is a `ValueError` naming the field, e.g.
    `TF_CONFIG["task"]["index"] must be an integer, got str '1'`.
    """
    if text is None or not text.strip():
        return _TFConfig(ClusterSpec({}), None, None, None, None)
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        raise ValueError(
            f"{_ROOT} is not valid JSON: {error.msg} at line {error.lineno} "
            f"column {error.colno} (char {error.pos}): {text[:200]!r}"
        ) from None
    if not isinstance(config, dict):
        raise ValueError(
            f'{_ROOT} must be a JSON object like {{"cluster": {{...}}, "task": {{...}}}}, '
            f"got {_describe(config)}"
        )

    cluster_field = _field("cluster")
    raw_cluster = config.get("cluster")
    if raw_cluster is None:
        cluster = ClusterSpec({})
    else:
        cluster = ClusterSpec._from_normalized(
            normalize_cluster(raw_cluster, cluster_field, ValueError)
        )
    for job in ("chief", "evaluator"):
        if job in cluster.jobs and cluster.num_tasks(job) > 1:
            raise ValueError(
                f"{_field('cluster', job)} has {cluster.num_tasks(job)} tasks; "
                f"a cluster has at most one {job}"
            )

    task_type = task_id = None
    task = config.get("task")
    if task is not None:
        if not isinstance(task, dict):
            raise ValueError(
                f'{_field("task")} must be a JSON object like '
                f'{{"type": "worker", "index": 0}}, got {_describe(task)}'
            )
        if task:
            task_type, task_id = _parse_task(task, cluster, cluster_field)

    rpc_layer = config.get("rpc_layer")
    if rpc_layer is not None and not isinstance(rpc_layer, str):
        raise ValueError(f'{_field("rpc_layer")} must be a string, got {_describe(rpc_layer)}')
    environment = config.get("environment")
    if environment is not None and not isinstance(environment, str):
        raise ValueError(
            f'{_field("environment")} must be a string, got {_describe(environment)}'
        )
    return _TFConfig(cluster, task_type, task_id, rpc_layer or None, environment)


def _parse_task(task: dict, cluster: ClusterSpec, cluster_field: str) -> tuple[str, int]:
    type_field, index_field = _field("task", "type"), _field("task", "index")
    for name, field in (("type", type_field), ("index", index_field)):
        if name not in task:
            raise ValueError(
                f'{field} is missing: "task" must give both "type" and "index", '
                'e.g. {"type": "worker", "index": 0}'
            )
    task_type, task_id = task["type"], task["index"]
    if not isinstance(task_type, str) or not task_type:
        raise ValueError(
            f"{type_field} must be a non-empty string such as \"worker\", "
            f"got {_describe(task_type)}"
        )
    if isinstance(task_id, bool) or not isinstance(task_id, int):
        raise ValueError(f"{index_field} must be an integer, got {_describe(task_id)}")
    if task_id < 0:
        raise ValueError(f"{index_field} must be >= 0, got {task_id}")
    if not cluster:
        return task_type, task_id  # no cluster: a single-process job
    if task_type not in cluster.jobs:
        if task_type == "evaluator":  # an evaluator may sit outside the cluster
            if task_id != 0:
                raise ValueError(
                    f"{index_field} is {task_id}, but there is at most one "
                    "evaluator: its index must be 0"
                )
            return task_type, task_id
        raise ValueError(
            f"{type_field} is {json.dumps(task_type)}, which is not a job in "
            f"{cluster_field} (jobs: {', '.join(map(json.dumps, cluster.jobs))})"
        )
    indices = cluster.task_indices(task_type)
    if task_id not in indices:
        if indices == list(range(len(indices))):
            detail = (
                f"out of range: job {json.dumps(task_type)} has {len(indices)} tasks"
                + (f" (indices 0 to {len(indices) - 1})" if indices else "")
            )
        else:
            detail = (
                f"not a task of the sparse job {json.dumps(task_type)} "
                f"(task indices: {', '.join(map(str, indices))})"
            )
        raise ValueError(f"{index_field} is {task_id}, {detail}")
    return task_type, task_id


class TFConfigClusterResolver(ClusterResolver):
    """A resolver that reads the `TF_CONFIG` environment variable.

    TF_CONFIG is read (and validated) each time a value is needed, as in
    TensorFlow. Arguments given to the constructor override TF_CONFIG's
    `task`, `rpc_layer` and `environment`. An unset or empty TF_CONFIG is a
    single-process job: an empty cluster spec, and no task type or id. A
    malformed TF_CONFIG raises `ValueError` naming the field.

    >>> import json, os
    >>> os.environ["TF_CONFIG"] = json.dumps({
    ...     "cluster": {"worker": ["host1:port", "host2:port", "host3:port"],
    ...                 "ps": ["host4:port", "host5:port"]},
    ...     "task": {"type": "worker", "index": 1}})
    >>> resolver = TFConfigClusterResolver()
    >>> resolver.task_type, resolver.task_id, resolver.num_workers
    ('worker', 1, 3)
    >>> resolver.is_chief, resolver.chief_address, resolver.worker_index
    (False, 'host1:port', 1)
    >>> resolver.master(rpc_layer="grpc")
    'grpc://host2:port'
    >>> del os.environ["TF_CONFIG"]
    """

    def __init__(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
        environment: Optional[str] = None,
    ):
        self._task_type = _check_optional_str(task_type, "task_type")
        self._task_id = _check_task_id(task_id)
        self._rpc_layer = _check_optional_str(rpc_layer, "rpc_layer")
        self._environment = _check_optional_str(environment, "environment")

    @staticmethod
    def _config() -> _TFConfig:
        return parse_tf_config(os.environ.get(TF_CONFIG))

    def cluster_spec(self) -> ClusterSpec:
        """The cluster from TF_CONFIG; empty when TF_CONFIG has none."""
        return self._config().cluster

    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The address of the given task (this task by default); "" if unknown."""
        return self._master_of(task_type, task_id, rpc_layer)

    @property
    def task_type(self) -> Optional[str]:
        if self._task_type is not None:
            return self._task_type
        return self._config().task_type

    @task_type.setter
    def task_type(self, task_type: Optional[str]) -> None:
        self._task_type = _check_optional_str(task_type, "task_type")

    @property
    def task_id(self) -> Optional[int]:
        if self._task_id is not None:
            return self._task_id
        return self._config().task_id

    @task_id.setter
    def task_id(self, task_id: Optional[int]) -> None:
        self._task_id = _check_task_id(task_id)

    @property
    def rpc_layer(self) -> Optional[str]:
        if self._rpc_layer is not None:
            return self._rpc_layer
        return self._config().rpc_layer

    @rpc_layer.setter
    def rpc_layer(self, rpc_layer: Optional[str]) -> None:
        self._rpc_layer = _check_optional_str(rpc_layer, "rpc_layer")

    @property
    def environment(self) -> str:
        if self._environment is not None:
            return self._environment
        return self._config().environment or ""
