"""`UnionResolver`: one cluster from several resolvers, as
`tf.distribute.cluster_resolver.UnionResolver`. Standard library only."""

from __future__ import annotations

from typing import Any, Optional, Union

from keras_dist.cluster_resolver._cluster_spec import ClusterSpec, _describe
from keras_dist.cluster_resolver._resolvers import ClusterResolver, format_master_url

_OVERRIDES = ("task_type", "task_id", "rpc_layer")


class _TaskConflictError(ValueError, KeyError):
    """Two resolvers of a `UnionResolver` give the same task. A ValueError,
    and also a KeyError, which TensorFlow raises there."""

    __str__ = ValueError.__str__  # not KeyError's repr() of the message


class UnionResolver(ClusterResolver):
    """The union of several cluster resolvers (as `tf.distribute.cluster_resolver`).

    `cluster_spec()` merges the resolvers' cluster specs, asked at each call.
    Jobs of different names are combined. A job given by several resolvers
    is merged as TensorFlow does: if each gives it as a list (tasks 0..n-1),
    the lists are concatenated in the order of the resolvers; if any gives
    it as a sparse dict, the tasks keep their indices, and two resolvers
    giving one index raise a ValueError (which is also the KeyError
    TensorFlow raises).

    `task_type`, `task_id` and `rpc_layer` are those given as keywords,
    else the first resolver's; `environment`, `num_accelerators()` and, by
    default, `master()` are the first resolver's.

    >>> from keras_dist.cluster_resolver import SimpleClusterResolver
    >>> workers = SimpleClusterResolver(
    ...     {"worker": ["w0:2222", "w1:2222"]}, task_type="worker", task_id=1,
    ...     rpc_layer="grpc", num_accelerators={"GPU": 2})
    >>> chief = SimpleClusterResolver({"chief": ["c0:2222"]})
    >>> resolver = UnionResolver(workers, chief)
    >>> resolver.cluster_spec()
    ClusterSpec({'chief': ['c0:2222'], 'worker': ['w0:2222', 'w1:2222']})
    >>> resolver.task_type, resolver.task_id, resolver.num_accelerators()
    ('worker', 1, {'GPU': 2})
    >>> resolver.num_workers, resolver.worker_index, resolver.is_chief
    (3, 2, False)
    >>> UnionResolver(workers, chief, task_type="chief", task_id=0).master()
    'grpc://c0:2222'
    """

    def __init__(
        self,
        *cluster_resolvers: ClusterResolver,
        **kwargs: Optional[Union[str, int]],
    ):
        unknown = sorted(set(kwargs) - set(_OVERRIDES))
        if unknown:
            raise ValueError(
                f"Unexpected kwargs provided {unknown}: UnionResolver takes "
                "task_type=, task_id= and rpc_layer= (each overrides the first "
                "resolver's)"
            )
        if not cluster_resolvers:
            raise ValueError(
                "At least one ClusterResolver is required: UnionResolver(resolver_a, "
                "resolver_b, ...)"
            )
        for position, resolver in enumerate(cluster_resolvers):
            if not isinstance(resolver, ClusterResolver):
                raise TypeError(
                    "All arguments must be a sub-class of keras_dist's ClusterResolver "
                    f"(keras_dist.cluster_resolver); argument {position} is "
                    f"{_describe(resolver)}"
                )
        self._cluster_resolvers = tuple(cluster_resolvers)
        for name in _OVERRIDES:
            setattr(self, name, kwargs.get(name))  # checked by the base class's setters

    def _override_or_first(self, name: str) -> Any:
        value = getattr(self, f"_{name}", None)
        return getattr(self._cluster_resolvers[0], name) if value is None else value

    @ClusterResolver.task_type.getter
    def task_type(self) -> Optional[str]:
        """The `task_type` given (or set), else the first resolver's."""
        return self._override_or_first("task_type")

    @ClusterResolver.task_id.getter
    def task_id(self) -> Optional[int]:
        """The `task_id` given (or set), else the first resolver's."""
        return self._override_or_first("task_id")

    @ClusterResolver.rpc_layer.getter
    def rpc_layer(self) -> Optional[str]:
        """The `rpc_layer` given (or set), else the first resolver's."""
        return self._override_or_first("rpc_layer")

    @property
    def cluster_resolvers(self) -> tuple[ClusterResolver, ...]:
        """The resolvers given, in order."""
        return self._cluster_resolvers

    def cluster_spec(self) -> ClusterSpec:
        """The resolvers' cluster specs merged (see the class); asked at each call."""
        specs = [resolver.cluster_spec().as_dict() for resolver in self._cluster_resolvers]
        sparse = {job for spec in specs for job, tasks in spec.items() if isinstance(tasks, dict)}
        merged: dict[str, Any] = {}
        origin: dict[tuple[str, int], int] = {}  # (job, index) -> the resolver giving it
        for position, spec in enumerate(specs):
            for job, tasks in spec.items():
                if job not in sparse:
                    merged.setdefault(job, []).extend(tasks)
                    continue
                job_tasks = merged.setdefault(job, {})
                items = tasks.items() if isinstance(tasks, dict) else enumerate(tasks)
                for index, address in items:
                    if index in job_tasks:
                        raise _TaskConflictError(
                            f"Duplicate keys detected when merging two ClusterSpecs: "
                            f"cluster_resolvers[{origin[job, index]}] and "
                            f"cluster_resolvers[{position}] both give task {job}:{index} "
                            f"({job_tasks[index]!r} and {address!r}). Job {job!r} is "
                            "sparse (a dict) in at least one of them, so its tasks are "
                            "merged by index; give them distinct indices, or give the "
                            "job as a list everywhere to concatenate the lists."
                        )
                    job_tasks[index] = address
                    origin[job, index] = position
        return ClusterSpec(merged)

    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The given task's address in the merged cluster; by default this
        task's when `task_type` or `task_id` was overridden, else the first
        resolver's `master()`."""
        if task_type is not None and task_id is not None:
            address = self.cluster_spec().task_address(task_type, task_id)
            return format_master_url(address, rpc_layer or self.rpc_layer)
        if self._task_type is not None or self._task_id is not None:
            return self._master_of(None, None, rpc_layer)
        return self._cluster_resolvers[0].master(rpc_layer=rpc_layer or self._rpc_layer)

    def num_accelerators(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """The first resolver's `num_accelerators()`."""
        return self._cluster_resolvers[0].num_accelerators(task_type, task_id, config_proto)

    @property
    def environment(self) -> str:
        """The first resolver's `environment`."""
        return self._cluster_resolvers[0].environment

    def __repr__(self) -> str:
        inner = ", ".join(repr(resolver) for resolver in self._cluster_resolvers)
        return f"UnionResolver({inner})"
