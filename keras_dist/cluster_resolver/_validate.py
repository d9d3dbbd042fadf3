"""Checks a multi-worker cluster before a process joins it (standard library
only): a bad description gets one clear error here, instead of a hang or an
engine's stack dump once the workers try to meet."""

from __future__ import annotations

import socket
from typing import Any

from keras_dist.cluster_resolver._resolvers import _worker_tasks


def check_cluster_to_join(resolver: Any) -> None:
    """Raises ValueError naming the fix when `resolver` describes a job of
    several workers that this process cannot join: no task for this
    process, a task that is not a worker, two tasks at one address, or a
    port that is not a number in 1..65535; or a cluster without a chief or
    worker task (e.g. a resolver that lists machines found none running)."""
    spec = resolver.cluster_spec()
    if not spec:
        return
    workers = _worker_tasks(spec)
    if not workers:
        jobs = ", ".join(f"{job} ({spec.num_tasks(job)} task(s))" for job in spec.jobs)
        raise ValueError(
            f"The cluster has no chief or worker task (its jobs: {jobs}), so there is "
            "no worker to run on. If a resolver lists the machines (Kubernetes pods, "
            "a Compute Engine instance group), none was found running: start them "
            "first, and check its label selectors or instance group."
        )
    if len(workers) <= 1:
        return
    if resolver.task_type is None or resolver.task_id is None:
        raise ValueError(
            f"The cluster has {len(workers)} worker tasks but this process's task "
            "is not set: every process of a multi-worker job names its own, e.g. "
            'TF_CONFIG=\'{"cluster": {...}, "task": {"type": "worker", "index": 0}}\' '
            "(keras-dist launch sets it for each worker)."
        )
    if (resolver.task_type, resolver.task_id) not in workers:
        names = ", ".join(f"{job}:{index}" for job, index in workers)
        raise ValueError(
            f"This process is task {resolver.task_type}:{resolver.task_id}, which is "
            f"not a worker of the cluster (its workers: {names}). Set the task to "
            "one of them."
        )
    if not getattr(resolver, "worker_addresses_known", True):
        return  # torchrun: one rendezvous address, not each worker's
    seen: dict[str, str] = {}
    for job, index in workers:
        address = spec.task_address(job, index)
        host, _, port = address.rpartition(":")
        if not port.isdigit() or not 1 <= int(port) <= 65535:
            raise ValueError(
                f"Task {job}:{index} has the address {address!r}, whose port is not "
                "a number in 1..65535. Give every task a real port "
                "(keras_dist.launch.free_ports picks free ones)."
            )
        key = f"{host.lower().strip('[]')}:{int(port)}"
        if key in seen:
            raise ValueError(
                f"Tasks {seen[key]} and {job}:{index} have the same address "
                f"{address!r}; two processes cannot serve one port. Give each task "
                "its own host:port."
            )
        seen[key] = f"{job}:{index}"


def check_bindable(address: str, what: str) -> None:
    """Raises ValueError naming the fix when this process cannot serve
    `address` (`host:port`): the port is taken, or the host is not an
    address of this machine. Backends call it for the addresses their
    engine binds (TensorFlow: the task's own address; JAX: the coordinator,
    on the chief)."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    probe = socket.socket(family, socket.SOCK_STREAM)
    try:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind((host, int(port)))
    except OSError as error:
        raise ValueError(
            f"{what} {address!r} cannot be served by this process "
            f"({error.strerror or error}): another process uses the port, or "
            f"{host!r} is not an address of this machine. Give it a free port on "
            "this machine (keras_dist.launch.free_ports picks free ones; "
            "keras-dist launch does it for you)."
        ) from None
    finally:
        probe.close()


def check_worker_addresses_known(resolver: Any, backend: str) -> None:
    """Raises ValueError naming the fix when `resolver` knows only one
    rendezvous address (torchrun's) and this backend's engine needs every
    worker's own (TensorFlow's gRPC servers; JAX's coordinator binds the
    address torchrun's agent holds)."""
    if resolver.num_workers > 1 and not getattr(resolver, "worker_addresses_known", True):
        raise ValueError(
            f"MultiWorkerMirroredStrategy on the {backend} backend in a torchrun job: torchrun names only its "
            f"rendezvous address ({resolver.chief_address}), and the {backend} engine needs an address for every "
            "worker. Start the job with `keras-dist launch -n N --backend "
            f"{backend} script.py` (it sets TF_CONFIG), or run it on the torch backend."
        )
