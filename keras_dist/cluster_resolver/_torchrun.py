"""`TorchrunClusterResolver`: the job torchrun (torch.distributed.run)
describes in each process's environment. Standard library only.

torchrun gives every process its rank (`RANK`), the job's size
(`WORLD_SIZE`), its rank on its machine (`LOCAL_RANK`) and the rendezvous
address (`MASTER_ADDR`, `MASTER_PORT`), not the other processes' addresses.
The resolver lists every worker at the rendezvous address (its cluster
spec's addresses are not the processes' own: `worker_addresses_known` is
False), which is all an engine that joins through one address needs
(torch.distributed's `env://`). `MultiWorkerMirroredStrategy()` uses it where
`TF_CONFIG` is unset and torchrun's variables are set.
"""

from __future__ import annotations

import os
from typing import Any, Mapping, Optional

from keras_dist.cluster_resolver._cluster_spec import ClusterSpec
from keras_dist.cluster_resolver._resolvers import ClusterResolver

#: The variables torchrun sets in every process it starts.
TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def in_torchrun_job(environ: Optional[Mapping[str, str]] = None) -> bool:
    """Whether torchrun's variables describe this process's job."""
    environ = os.environ if environ is None else environ
    return all(environ.get(name) for name in TORCHRUN_VARS)


class TorchrunClusterResolver(ClusterResolver):
    """The cluster of a torchrun job, from `RANK`, `WORLD_SIZE`, `LOCAL_RANK`,
    `MASTER_ADDR` and `MASTER_PORT` (read when made; `environ`: another
    mapping than `os.environ`).

    >>> env = {"RANK": "1", "WORLD_SIZE": "2", "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    >>> resolver = TorchrunClusterResolver(environ=env)
    >>> resolver.num_workers, resolver.worker_index, resolver.is_chief, resolver.chief_address
    (2, 1, False, '10.0.0.1:29500')
    """

    #: torchrun names the rendezvous address only, not each process's.
    worker_addresses_known = False

    def __init__(self, environ: Optional[Mapping[str, str]] = None):
        environ = dict(os.environ if environ is None else environ)
        missing = [name for name in TORCHRUN_VARS if not environ.get(name)]
        if missing:
            raise ValueError(
                f"TorchrunClusterResolver: {', '.join(missing)} not set. torchrun sets {', '.join(TORCHRUN_VARS)} "
                "in every process it starts (torchrun --nproc-per-node N script.py); outside torchrun use "
                "TFConfigClusterResolver (keras-dist launch sets TF_CONFIG)."
            )
        numbers = {}
        for name in ("RANK", "WORLD_SIZE", "MASTER_PORT", "LOCAL_RANK"):
            text = environ.get(name, "0")
            if not text.isdigit():
                raise ValueError(f"TorchrunClusterResolver: {name}={text!r} is not a non-negative integer.")
            numbers[name] = int(text)
        if numbers["WORLD_SIZE"] < 1 or numbers["RANK"] >= numbers["WORLD_SIZE"]:
            raise ValueError(
                f"TorchrunClusterResolver: RANK={numbers['RANK']} is not a rank of WORLD_SIZE={numbers['WORLD_SIZE']}."
            )
        self._rank, self._world = numbers["RANK"], numbers["WORLD_SIZE"]
        self.local_rank = numbers["LOCAL_RANK"]
        self._address = f"{environ['MASTER_ADDR']}:{numbers['MASTER_PORT']}"
        self.task_type = "worker"
        self.task_id = self._rank
        self.rpc_layer = None

    def cluster_spec(self) -> ClusterSpec:
        """Every worker at the rendezvous address (see `worker_addresses_known`)."""
        return ClusterSpec({"worker": [self._address] * self._world})

    def master(self, task_type: Optional[str] = None, task_id: Optional[int] = None, rpc_layer: Optional[str] = None) -> str:
        return self._address

    def num_accelerators(self, task_type: Optional[str] = None, task_id: Optional[int] = None, config_proto: Any = None) -> dict:
        return {}

    @property
    def num_workers(self) -> int:
        return self._world

    @property
    def worker_index(self) -> int:
        return self._rank

    @property
    def is_chief(self) -> bool:
        return self._rank == 0

    @property
    def chief_address(self) -> str:
        return self._address
