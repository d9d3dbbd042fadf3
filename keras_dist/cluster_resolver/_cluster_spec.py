"""`ClusterSpec`: which tasks make up a cluster, with `tf.train.ClusterSpec`'s API.

Standard library only: no backend is imported here, nor the rest of
keras_dist (which lends `accept_foreign` for TensorFlow's objects).
"""

from __future__ import annotations

import json
import re
from typing import Any, Callable, Mapping, Optional, Union

# TensorFlow's device-name grammar for a job: "/job:<name>".
_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*\Z")
_DIGITS = re.compile(r"[0-9]+\Z")

ClusterDict = Mapping[str, Any]

#: `keras_dist._foreign.accept`, lent by keras_dist when it is imported (this
#: package imports nothing of keras_dist's): a TensorFlow object where a
#: cluster spec is taken (ported code) becomes keras_dist's, or one error
#: names keras_dist's spelling. None (this package alone): values go as they are.
accept_foreign: Optional[Callable[[Any, str], Any]] = None


def take_foreign(value: Any, kind: str) -> Any:
    """`value` through `accept_foreign` where keras_dist lent it."""
    return value if accept_foreign is None else accept_foreign(value, kind)


def _key(key: Any) -> str:
    """`key` as a subscript: `["worker"]`, `[1]`."""
    if isinstance(key, str):
        return "[" + json.dumps(key) + "]"
    return f"[{key!r}]"


def _describe(value: Any) -> str:
    """`value` for an error message: its type and a short repr."""
    text = repr(value)
    if len(text) > 80:
        text = text[:77] + "..."
    return f"{type(value).__name__} {text}"


def check_job_name(name: Any, where: str, type_error: type = TypeError) -> str:
    """`name` if it is a valid job name, else an error about `where`."""
    if not isinstance(name, str):
        raise type_error(f"{where}: job names must be strings, got {_describe(name)}")
    if not _JOB_NAME.match(name):
        raise ValueError(
            f"{where}: invalid job name {name!r}; a job name starts with a letter "
            "and has only letters, digits and underscores (e.g. 'worker')"
        )
    return name


def check_address(address: Any, where: str, type_error: type = TypeError) -> str:
    """`address` if it is a "host:port" string, else an error naming `where`.

    Any non-empty port token is accepted (TensorFlow's own examples write
    "host1:port"); IPv6 hosts must be in brackets ("[::1]:2222").
    """
    example = '(e.g. "10.0.0.1:2222")'
    if not isinstance(address, str):
        raise type_error(f'{where} must be a "host:port" string, got {_describe(address)}')
    if not address or any(ch.isspace() for ch in address):
        raise ValueError(f'{where} must be a "host:port" address {example}, got {address!r}')
    if "://" in address:
        raise ValueError(
            f'{where} must be a plain "host:port" address {example}, got {address!r}: '
            "give the protocol (e.g. grpc) as the rpc_layer, not in the address"
        )
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port:
        missing = "port" if not sep or not port else "host"
        raise ValueError(
            f'{where} must be a "host:port" address {example}, got {address!r}: '
            f"the {missing} is missing"
        )
    if ":" in host and not (host.startswith("[") and host.endswith("]")):
        raise ValueError(
            f'{where} must be a "host:port" address {example}, got {address!r}: '
            'write an IPv6 host in brackets, e.g. "[::1]:2222"'
        )
    return address


def _task_index(key: Any, where: str, type_error: type) -> int:
    if isinstance(key, str) and _DIGITS.match(key):  # JSON object keys
        return int(key)
    if isinstance(key, bool) or not isinstance(key, int):
        raise type_error(
            f"{where}: task indices must be non-negative integers, got {_describe(key)}"
        )
    if key < 0:
        raise ValueError(f"{where}: task indices must be non-negative integers, got {key}")
    return key


def normalize_cluster(
    cluster: Any, root: str = "cluster", type_error: type = TypeError
) -> dict[str, dict[int, str]]:
    """`{job: {index: address}}`, sorted, from the forms `ClusterSpec` accepts.

    Errors name the offending field as a subscript of `root`, e.g.
    `cluster["worker"][1]`. Malformed types raise `type_error`, malformed
    values `ValueError`.
    """
    if not isinstance(cluster, Mapping):
        raise type_error(
            f"{root} must be a dict mapping job names to lists of "
            f'"host:port" addresses, got {_describe(cluster)}'
        )
    jobs: dict[str, dict[int, str]] = {}
    for name, tasks in cluster.items():
        check_job_name(name, root, type_error)
        where = root + _key(name)
        if isinstance(tasks, (list, tuple)):
            items = list(enumerate(tasks))
        elif isinstance(tasks, Mapping):
            items = list(tasks.items())
        else:
            raise type_error(
                f'{where} must be a list of "host:port" addresses or a dict '
                f"mapping task indices to addresses, got {_describe(tasks)}"
            )
        job: dict[int, str] = {}
        for key, address in items:
            index = _task_index(key, where, type_error)
            if index in job:
                raise ValueError(f"{where}: task index {index} is given twice")
            job[index] = check_address(address, where + _key(key), type_error)
        jobs[name] = dict(sorted(job.items()))
    return dict(sorted(jobs.items()))


class ClusterSpec:
    """The tasks of a cluster: job names mapped to "host:port" addresses.

    Same names and semantics as `tf.train.ClusterSpec`. Built from a dict of
    job name to a list of addresses (task `i` is the i-th address), to a
    dict `{task_index: address}` (a sparse job), or from another ClusterSpec
    (on the TensorFlow backend, also a `tf.train.ClusterSpec`).

    >>> spec = ClusterSpec({"worker": ["host1:2222", "host2:2222"],
    ...                     "ps": {0: "host3:2222", 2: "host4:2222"}})
    >>> spec.jobs
    ['ps', 'worker']
    >>> spec.num_tasks("worker"), spec.task_address("worker", 1)
    (2, 'host2:2222')
    >>> spec.task_indices("ps"), spec.job_tasks("ps")
    ([0, 2], ['host3:2222', None, 'host4:2222'])
    >>> spec.as_dict()
    {'ps': {0: 'host3:2222', 2: 'host4:2222'}, 'worker': ['host1:2222', 'host2:2222']}
    """

    def __init__(self, cluster: Union["ClusterSpec", ClusterDict]):
        cluster = take_foreign(cluster, "cluster_spec")  # TensorFlow: a tf.train.ClusterSpec
        if isinstance(cluster, ClusterSpec):
            self._cluster = {job: dict(tasks) for job, tasks in cluster._cluster.items()}
        else:
            self._cluster = normalize_cluster(cluster)

    @classmethod
    def _from_normalized(cls, cluster: dict[str, dict[int, str]]) -> "ClusterSpec":
        spec = cls.__new__(cls)
        spec._cluster = cluster
        return spec

    @property
    def jobs(self) -> list[str]:
        """The job names, sorted."""
        return list(self._cluster)

    def _job(self, job_name: str) -> dict[int, str]:
        try:
            return self._cluster[job_name]
        except (KeyError, TypeError):
            raise ValueError(
                f"No such job in cluster: {job_name!r} (jobs: {self.jobs})"
            ) from None

    def num_tasks(self, job_name: str) -> int:
        """The number of tasks in `job_name`; `ValueError` if there is no such job."""
        return len(self._job(job_name))

    def task_indices(self, job_name: str) -> list[int]:
        """The task indices of `job_name`, sorted."""
        return list(self._job(job_name))

    def task_address(self, job_name: str, task_index: int) -> str:
        """The address of task `task_index` of `job_name`; `ValueError` if none."""
        job = self._job(job_name)
        try:
            return job[task_index]
        except (KeyError, TypeError):
            raise ValueError(
                f"No task with index {task_index!r} in job {job_name!r} "
                f"(task indices: {list(job)})"
            ) from None

    def job_tasks(self, job_name: str) -> list[Optional[str]]:
        """The addresses of `job_name` by task index, None where a sparse job has none."""
        job = self._job(job_name)
        if not job:
            return []
        return [job.get(index) for index in range(max(job) + 1)]

    def as_dict(self) -> dict[str, Union[list[str], dict[int, str]]]:
        """A dict `ClusterSpec` accepts: a list for a dense job, a dict for a sparse one."""
        result: dict[str, Union[list[str], dict[int, str]]] = {}
        for name, job in self._cluster.items():
            if not job:
                result[name] = {}
            elif max(job) + 1 == len(job):
                result[name] = list(job.values())
            else:
                result[name] = dict(job)
        return result

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ClusterSpec):
            return self._cluster == other._cluster
        if isinstance(other, Mapping):
            try:
                return self._cluster == normalize_cluster(other)
            except (TypeError, ValueError):
                return False
        return NotImplemented

    __hash__ = None  # mutable-looking value type, as in TensorFlow

    def __bool__(self) -> bool:
        return bool(self._cluster)

    def __repr__(self) -> str:
        return f"ClusterSpec({self.as_dict()!r})"
