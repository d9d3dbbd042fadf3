"""JAX: joining a multi-worker job through `jax.distributed` (gloo on CPU)."""

from __future__ import annotations

import os

import jax
import numpy as np

#: Whether this process joined a job (JAX joins one per process).
_multi_worker = {"initialized": False}


def initialize_multi_worker(resolver, options) -> None:
    """Joins the job through `jax.distributed` (once per process).

    The coordinator is `KERAS_DIST_COORDINATOR` (set by `keras-dist
    launch`) or the chief's address; CPU collectives go through gloo.
    """
    if resolver.num_workers <= 1 or _multi_worker["initialized"]:
        return
    if options.implementation.value == "NCCL" and not any(
        d.platform == "gpu" for d in jax.local_devices()
    ):
        raise ValueError(
            "CommunicationImplementation.NCCL needs GPUs; this worker has none. "
            "Use AUTO or RING (gloo) on CPU."
        )
    from keras_dist.backends.jax import _gloo

    _gloo.event_loop_choice()  # a bad setting fails before joining the job
    coordinator = os.environ.get("KERAS_DIST_COORDINATOR") or resolver.chief_address
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = options.timeout_seconds
    kwargs = {}
    if timeout is not None:
        kwargs = {
            "initialization_timeout": max(1, int(timeout)),
            # a dead peer is declared after this; survivors exit within
            # `timeout` (JAX adds a few seconds of polling)
            "heartbeat_timeout_seconds": max(1, int(timeout) // 2),
        }
    try:
        jax.distributed.initialize(
            coordinator_address=coordinator,
            num_processes=resolver.num_workers,
            process_id=resolver.worker_index,
            **kwargs,
        )
    except RuntimeError as error:
        raise RuntimeError(
            f"Worker {resolver.worker_index} of {resolver.num_workers} could "
            f"not join the job through the coordinator at {coordinator}: "
            f"{error}. Create MultiWorkerMirroredStrategy before any JAX "
            "computation, and start every worker (keras-dist launch does)."
        ) from error
    _multi_worker["initialized"] = True
    # The first collective starts gloo. (Every worker's variables take the
    # chief's values as they are created: `values_from_chief`, called by
    # the hook on Keras' `distribute_tensor`. No random state is touched.)
    from jax.experimental import multihost_utils

    multihost_utils.sync_global_devices("keras_dist: joined")
    if all(d.platform == "cpu" for d in jax.local_devices()):
        _gloo.yield_event_loop()  # that collective started gloo


_PEER_FAILURE_TEXTS = ("Connection reset", "Connection closed", "Socket closed", "heartbeat", "Gloo", "gloo")


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed for want of a peer.

    (When the coordination service sees a peer's heartbeat stop, JAX
    terminates the process itself, with its own message.)
    """
    return isinstance(error, jax.errors.JaxRuntimeError) and any(
        text in str(error) for text in _PEER_FAILURE_TEXTS
    )


def is_multi_process() -> bool:
    return _multi_worker["initialized"]


def values_from_chief(values):
    """The chief's values of host or process-local `values`, on every worker
    (one broadcast of all of them). Values already global (spanning the
    processes) or traced, and every value outside a multi-process job, come
    back unchanged."""
    values = list(values)
    if not is_multi_process():
        return values
    local = [
        i
        for i, v in enumerate(values)
        if not isinstance(v, jax.core.Tracer) and not (isinstance(v, jax.Array) and not v.is_fully_addressable)
    ]
    if not local:
        return values
    from jax.experimental import multihost_utils

    chiefs = multihost_utils.broadcast_one_to_all([np.asarray(values[i]) for i in local])
    for i, value in zip(local, chiefs):
        values[i] = np.asarray(value)
    return values
