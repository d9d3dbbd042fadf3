"""JAX: joining a multi-worker job through `jax.distributed` (gloo on CPU)."""

from __future__ import annotations

import os

import jax
import numpy as np

from keras_dist._communication import exit_unless_joined, join_timeout_seconds
from keras_dist.cluster_resolver._validate import check_bindable

#: Seconds JAX's own join deadline leaves after keras_dist's watchdog.
_JAX_JOIN_GRACE_SECONDS = 10

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
    if resolver.worker_index == 0:  # the chief serves JAX's coordinator
        check_bindable(coordinator, "The JAX coordinator address")
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    timeout = options.timeout_seconds
    join_timeout = join_timeout_seconds(options)
    kwargs = {
        # the watchdog below ends the wait first, with a clear message
        # (JAX's own end is a fatal log with a stack dump)
        "initialization_timeout": int(join_timeout) + _JAX_JOIN_GRACE_SECONDS,
    }
    if timeout is not None:
        # a dead peer is declared after this; survivors exit within
        # `timeout` (JAX adds a few seconds of polling)
        kwargs["heartbeat_timeout_seconds"] = max(1, int(timeout) // 2)
    try:
        with exit_unless_joined(resolver, join_timeout, probe_addresses=False):
            jax.distributed.initialize(
                coordinator_address=coordinator,
                num_processes=resolver.num_workers,
                process_id=resolver.worker_index,
                **kwargs,
            )
            from jax.experimental import multihost_utils

            # The first collective starts gloo. (Every worker's variables
            # take the chief's values as they are created:
            # `values_from_chief`, called by the hook on Keras'
            # `distribute_tensor`. No random state is touched.)
            multihost_utils.sync_global_devices("keras_dist: joined")
    except RuntimeError as error:
        raise RuntimeError(
            f"Worker {resolver.worker_index} of {resolver.num_workers} could "
            f"not join the job through the coordinator at {coordinator}: "
            f"{error}. Create MultiWorkerMirroredStrategy before any JAX "
            "computation, and start every worker (keras-dist launch does)."
        ) from error
    _multi_worker["initialized"] = True
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


def values_from_every_worker(values):
    """Every worker's host `values`, stacked in worker (process) order
    along a new first axis, on every worker: one all-gather of all of them
    over the job (`multihost_utils.process_allgather`). Outside a
    multi-process job, each value with a first axis of length 1."""
    values = [np.asarray(v) for v in values]
    if not is_multi_process() or not values:
        return [v[None] for v in values]
    from jax.experimental import multihost_utils

    return [np.asarray(v) for v in multihost_utils.process_allgather(values)]


def initialize_tpu_system(resolver) -> None:
    """A multi-host TPU slice: joins it with `jax.distributed.initialize()`,
    which detects the slice's hosts itself (once; before any computation).
    One host needs nothing: JAX finds its TPU cores on first use."""
    from keras_dist._devices import TPU_ON_CPU_ENV

    if resolver is None or resolver.num_workers <= 1 or _multi_worker["initialized"]:
        return
    if os.environ.get(TPU_ON_CPU_ENV) == "1":
        raise RuntimeError(
            f"{TPU_ON_CPU_ENV}=1 runs TPUStrategy on this host's CPU devices, one "
            "host only: a multi-host TPU slice needs real TPUs (JAX detects the "
            "slice's hosts from the TPU runtime). For several CPU processes use "
            "keras_dist.MultiWorkerMirroredStrategy."
        )
    jax.distributed.initialize()  # TPU auto-detection (not run here: no TPU)
    _multi_worker["initialized"] = True
