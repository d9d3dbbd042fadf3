"""`TPUClusterResolver`: a Cloud TPU VM (or multi-host TPU slice) from its environment.

Standard library only: no backend is imported, and no Google Cloud API is
ever called (the resolver reads environment variables, nothing else).
"""

from __future__ import annotations

import math
import os
import re
from typing import Any, Optional

from keras_dist.cluster_resolver._cluster_spec import ClusterSpec, _describe
from keras_dist.cluster_resolver._resolvers import ClusterResolver, _check_optional_str

#: The port of a TPU worker (TensorFlow's TPU worker port).
TPU_WORKER_PORT = 8470
#: Comma-separated host names of the slice's hosts (unset on a single-host VM).
HOSTNAMES_VAR = "TPU_WORKER_HOSTNAMES"
#: This host's index in the slice, first set wins (default 0).
WORKER_ID_VARS = ("TPU_WORKER_ID", "CLOUD_TPU_TASK_ID")
#: The TPU's name; when set, a `tpu` name given must equal it.
TPU_NAME_VAR = "TPU_NAME"
#: TPU chips on this host as "x,y,z" bounds (e.g. "2,2,1": 4 chips).
CHIPS_PER_HOST_VAR = "TPU_CHIPS_PER_HOST_BOUNDS"

_LOCAL_NAMES = (None, "", "local")
_BOUNDS = re.compile(r"[0-9]+(?:,[0-9]+)*\Z")


def _env(name: str) -> Optional[str]:
    """The stripped value of `name`, or None when unset or blank."""
    value = os.environ.get(name)
    return value.strip() if value is not None and value.strip() else None


def _hosts_from_env() -> list[str]:
    value = _env(HOSTNAMES_VAR)
    if value is None:
        return ["localhost"]
    hosts = [host.strip() for host in value.split(",")]
    for host in hosts:
        if not host or any(ch.isspace() or ch in ":[]" for ch in host):
            raise ValueError(
                f"{HOSTNAMES_VAR}={value!r} is not a comma-separated list of host "
                f"names (bad entry {host!r}), e.g. 't1v-n-0,t1v-n-1'"
            )
    return hosts


def _worker_id_from_env(num_hosts: int) -> int:
    for name in WORKER_ID_VARS:
        value = _env(name)
        if value is None:
            continue
        if not re.fullmatch(r"[0-9]+", value):
            raise ValueError(f"{name}={value!r} is not an integer >= 0 (this host's index)")
        worker_id = int(value)
        if worker_id >= num_hosts:
            if num_hosts > 1:
                detail = f"{HOSTNAMES_VAR} lists {num_hosts} hosts (indices 0 to {num_hosts - 1})"
            else:
                detail = f"{HOSTNAMES_VAR} is unset, so this is a single-host TPU (index 0)"
            raise ValueError(f"{name}={worker_id} is out of range: {detail}")
        return worker_id
    return 0


class TPUClusterResolver(ClusterResolver):
    """A Cloud TPU VM or multi-host TPU slice (as `tf.distribute.cluster_resolver`).

    Reads, once, when constructed, the variables Cloud TPU VMs set:
    `TPU_WORKER_HOSTNAMES` (the slice's hosts; unset on a single-host VM,
    which is then one host, "localhost") and this host's index from
    `TPU_WORKER_ID` (else `CLOUD_TPU_TASK_ID`, else 0). Each host is a
    "worker" task on port 8470. `master()` is "" on a single host, else this
    host's `grpc://host:8470`.

    `tpu` is None, "" or "local" (this VM), or the TPU's name, which must then
    equal `TPU_NAME` when that is set. Legacy TPU Nodes ("grpc://..." `tpu`)
    are not supported. `zone` and `project` are only recorded: no Google
    Cloud API is called. `num_accelerators()` is `{"TPU": chips on this
    host}` from `TPU_CHIPS_PER_HOST_BOUNDS` (e.g. "2,2,1": 4), else `{}`
    (unknown; `TPU_ACCELERATOR_TYPE` is not used, since its number counts
    cores or chips depending on the TPU generation).

    >>> import os
    >>> os.environ.update(TPU_WORKER_HOSTNAMES="t1v-n-0,t1v-n-1", TPU_WORKER_ID="1")
    >>> resolver = TPUClusterResolver()
    >>> resolver.cluster_spec()
    ClusterSpec({'worker': ['t1v-n-0:8470', 't1v-n-1:8470']})
    >>> resolver.task_type, resolver.task_id, resolver.master()
    ('worker', 1, 'grpc://t1v-n-1:8470')
    >>> resolver.num_workers, resolver.is_chief
    (2, False)
    >>> del os.environ["TPU_WORKER_HOSTNAMES"], os.environ["TPU_WORKER_ID"]
    >>> TPUClusterResolver(tpu="local").master()  # one host: local
    ''
    """

    def __init__(
        self,
        tpu: Optional[str] = None,
        zone: Optional[str] = None,
        project: Optional[str] = None,
    ):
        if tpu is not None and not isinstance(tpu, str):
            raise TypeError(
                f"tpu must be a TPU name, '', 'local' or None, got {_describe(tpu)}"
            )
        self._zone = _check_optional_str(zone, "zone")
        self._project = _check_optional_str(project, "project")
        if tpu is not None and tpu.startswith("grpc://"):
            raise ValueError(
                f"tpu={tpu!r}: TPU Nodes (grpc:// addresses) are not supported; "
                "run on a Cloud TPU VM with tpu=None"
            )
        if tpu not in _LOCAL_NAMES:
            tpu_name = _env(TPU_NAME_VAR)
            if tpu_name is not None and tpu != tpu_name:
                raise ValueError(
                    f"tpu={tpu!r} but this VM is {TPU_NAME_VAR}={tpu_name!r}: "
                    "keras_dist only describes the TPU it runs on (pass tpu=None)"
                )
        self._tpu = tpu
        hosts = _hosts_from_env()
        self._hosts = hosts
        self._cluster_spec = ClusterSpec(
            {"worker": [f"{host}:{TPU_WORKER_PORT}" for host in hosts]}
        )
        self.task_type = "worker"
        self.task_id = _worker_id_from_env(len(hosts))
        self.rpc_layer = "grpc"
        self._num_accelerators = _chips_per_host_from_env()

    @property
    def tpu(self) -> Optional[str]:
        """The `tpu` given (None, "", "local" or this TPU's name)."""
        return self._tpu

    @property
    def zone(self) -> Optional[str]:
        """The `zone` given (recorded only)."""
        return self._zone

    @property
    def project(self) -> Optional[str]:
        """The `project` given (recorded only)."""
        return self._project

    def cluster_spec(self) -> ClusterSpec:
        """`{"worker": ["host0:8470", ...]}`, one task per host of the slice."""
        return ClusterSpec(self._cluster_spec)

    def master(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        rpc_layer: Optional[str] = None,
    ) -> str:
        """The given task's address (this host by default); "" for this host of a one-host TPU."""
        if len(self._hosts) == 1 and task_type is None and task_id is None:
            return ""
        return self._master_of(task_type, task_id, rpc_layer)

    def get_master(self) -> str:
        """`master()`."""
        return self.master()

    def get_job_name(self) -> str:
        """The TPU workers' job name, "worker"."""
        return "worker"

    def num_accelerators(
        self,
        task_type: Optional[str] = None,
        task_id: Optional[int] = None,
        config_proto: Any = None,
    ) -> dict[str, int]:
        """`{"TPU": chips per host}` from `TPU_CHIPS_PER_HOST_BOUNDS`, else `{}`."""
        del task_type, task_id, config_proto
        return dict(self._num_accelerators)

    @property
    def environment(self) -> str:
        """Always "google" (a Cloud TPU)."""
        return "google"

    def __repr__(self) -> str:
        return (
            f"TPUClusterResolver(tpu={self._tpu!r}, zone={self._zone!r}, "
            f"project={self._project!r})"
        )


def _chips_per_host_from_env() -> dict[str, int]:
    value = _env(CHIPS_PER_HOST_VAR)
    if value is None or not _BOUNDS.match(value.replace(" ", "")):
        return {}
    chips = math.prod(int(n) for n in value.replace(" ", "").split(","))
    return {"TPU": chips} if chips > 0 else {}
