"""PyTorch: joining a multi-worker job through `torch.distributed` (gloo on
CPU, NCCL on GPU), and values agreed across its workers.

The job's rendezvous is torch's TCP store at the chief's address (or
`KERAS_DIST_COORDINATOR`, as `keras-dist launch` sets it); every process is
one replica. A worker that raises ends the job at once (`_fail_fast`): the
others would wait in their next collective until gloo's timeout.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
import threading

import numpy as np
import torch
import torch.distributed as dist

from keras_dist._communication import join_timeout_seconds
from keras_dist.backends import _gloo
from keras_dist.cluster_resolver._validate import check_bindable

#: Whether this process joined a job, its rank's device, the job's devices.
_job = {"initialized": False, "device": None, "devices": None}

#: How long a collective waits for its peers when CommunicationOptions sets
#: no timeout (torch's own default for gloo).
_DEFAULT_COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=30)


def initialize_multi_worker(resolver, options) -> None:
    """Joins the job described by `resolver` (once per process): one torch
    process group over the workers, each worker one replica."""
    if resolver.num_workers <= 1 or _job["initialized"]:
        return
    gpu = torch.cuda.is_available() and torch.cuda.device_count() > 0
    implementation = options.implementation.value
    if implementation == "NCCL" and not gpu:
        raise ValueError(
            "CommunicationImplementation.NCCL needs GPUs; this worker has none. Use AUTO or RING (gloo) on CPU."
        )
    backend = "nccl" if gpu and implementation in ("AUTO", "NCCL") else "gloo"
    if backend == "gloo":
        _gloo.event_loop_choice()  # a bad setting fails before joining the job
    address = os.environ.get("KERAS_DIST_COORDINATOR") or resolver.chief_address
    host, _, port = address.rpartition(":")
    join_timeout = join_timeout_seconds(options)
    timeout = (
        _DEFAULT_COLLECTIVE_TIMEOUT
        if options.timeout_seconds is None
        else datetime.timedelta(seconds=float(options.timeout_seconds))
    )
    rank, world = resolver.worker_index, resolver.num_workers
    if gpu:
        local_rank = int(os.environ.get("LOCAL_RANK", rank % torch.cuda.device_count()))
        torch.cuda.set_device(local_rank)
    if rank == 0 and getattr(resolver, "worker_addresses_known", True):  # the chief serves the rendezvous
        check_bindable(address, "The torch rendezvous address (the chief's)")
    try:
        if getattr(resolver, "worker_addresses_known", True):
            store = dist.TCPStore(
                host or "127.0.0.1",
                int(port),
                world_size=world,
                is_master=rank == 0,
                timeout=datetime.timedelta(seconds=float(join_timeout)),
                wait_for_workers=True,
            )
            dist.init_process_group(backend, store=store, rank=rank, world_size=world, timeout=timeout)
        else:  # torchrun: its rendezvous (the agent's store, or rank 0's), as torch's env:// reads it
            os.environ.setdefault("MASTER_ADDR", host)
            os.environ.setdefault("MASTER_PORT", port)
            dist.init_process_group(backend, init_method="env://", rank=rank, world_size=world, timeout=timeout)
            store = dist.TCPStore(host, int(port), world_size=world, is_master=False,
                                  timeout=datetime.timedelta(seconds=float(join_timeout)))
    except (RuntimeError, dist.DistError) as error:
        from keras_dist._communication import did_not_join_error

        raise did_not_join_error(resolver, join_timeout, error) from error
    _job["initialized"] = True
    device = f"gpu:{torch.cuda.current_device()}" if gpu else f"cpu:{rank}"
    _job["device"] = device
    names = [None] * world
    dist.all_gather_object(names, device)
    if gpu:  # every process's GPU, numbered in rank order
        names = [f"gpu:{i}" for i in range(world)]
        _job["device"] = names[rank]
    _job["devices"] = tuple(names)
    _job["backend"] = backend
    # The workers draw what they draw alike from here on (Keras' shuffles of
    # NumPy input, an unseeded Dropout's masks): from the chief's state,
    # which is each one's own where every worker seeded the same.
    random_state_from_chief()
    _fail_fast(store, host or "127.0.0.1", int(port), rank, world)
    if backend == "gloo":
        _gloo.yield_event_loop()  # the process group's connections started gloo's loop


def process_device() -> str:
    return _job["device"]


def job_devices() -> tuple[str, ...]:
    return _job["devices"]


def is_multi_process() -> bool:
    return _job["initialized"]


def initialize_tpu_system(resolver) -> None:
    raise NotImplementedError(
        "TPUs are not supported on the torch backend (torch_xla is not a Keras backend); use the JAX or "
        "TensorFlow backend for TPUStrategy."
    )


_PEER_FAILURE_TEXTS = ("Connection closed", "Connection reset", "Broken pipe", "Gloo", "gloo", "NCCL", "timed out")


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed for want of a peer."""
    return isinstance(error, (RuntimeError, dist.DistError)) and any(t in str(error) for t in _PEER_FAILURE_TEXTS)


def _to_tensor(value) -> torch.Tensor:
    if isinstance(value, torch.Tensor):
        return value.detach()
    return torch.as_tensor(np.asarray(value))


def values_from_chief(values):
    """The chief's values of `values` (host arrays or torch tensors), on
    every worker: one broadcast of all of them; unchanged outside a job."""
    values = list(values)
    if not is_multi_process() or not values:
        return values
    payload = [[np.asarray(_to_tensor(v).cpu()) if _is_numeric(v) else v for v in values]]
    dist.broadcast_object_list(payload, src=0)
    out = []
    for mine, chiefs in zip(values, payload[0]):
        if isinstance(mine, torch.Tensor):
            chiefs = torch.as_tensor(chiefs).to(mine.device, mine.dtype)
        out.append(chiefs)
    return out


def _is_numeric(value) -> bool:
    return isinstance(value, (torch.Tensor, np.ndarray, np.generic, int, float, bool))


def values_from_every_worker(values):
    """Every worker's host `values`, stacked in rank order along a new first
    axis, on every worker (one all-gather); outside a job, each with a
    first axis of length 1."""
    values = [np.asarray(v) for v in values]
    if not is_multi_process() or not values:
        return [v[None] for v in values]
    gathered = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, values)
    return [np.stack([worker[i] for worker in gathered]) for i in range(len(values))]


# -- a failing worker ends the job --------------------------------------------

_FAILED_KEY = "keras_dist/failed"
_WATCH_SECONDS = 0.5


def _fail_fast(store, host: str, port: int, rank: int, world: int) -> None:
    """An uncaught exception in any worker ends every worker at once: the
    failing one writes its rank in the job's store, the others (a watcher
    thread) print one line naming it and exit with code 1. Without this the
    others wait in their next collective for gloo's timeout (30 minutes)."""
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        previous(kind, value, traceback)
        try:
            store.set(_FAILED_KEY, str(rank))
        except Exception:  # the store's host (the chief) may be gone already
            pass
        sys.stderr.flush()
        os._exit(130 if issubclass(kind, KeyboardInterrupt) else 1)

    sys.excepthook = excepthook

    stop = threading.Event()

    def watch():
        try:  # a connection of its own: the process group's is the main thread's
            watcher = dist.TCPStore(host, port, world_size=world, is_master=False, timeout=datetime.timedelta(seconds=30))
        except Exception:  # noqa: BLE001 - the job is ending already
            return
        while not stop.wait(_WATCH_SECONDS):
            try:
                if not watcher.check([_FAILED_KEY]):
                    continue
                failed = watcher.get(_FAILED_KEY).decode()
            except Exception:  # noqa: BLE001 - the store is gone: the job is ending
                return
            if failed == str(rank):
                return
            print(
                f"keras_dist: worker {failed} of {world} failed (its traceback is in its output); worker {rank} "
                "stops too (exit code 1).",
                file=sys.stderr,
                flush=True,
            )
            os._exit(1)

    thread = threading.Thread(target=watch, name="keras_dist-fail-fast", daemon=True)
    thread.start()

    def finish():  # a normal exit: the watcher ends outside any store call, then the group
        stop.set()
        thread.join()
        if dist.is_initialized():  # gloo's threads end here, not in static destructors (which abort)
            dist.destroy_process_group()

    atexit.register(finish)



def random_state_from_chief() -> None:
    """Sets this process's torch random state (CPU, and the current GPU's) to
    the chief's: one broadcast. Keras draws an unseeded layer's random
    numbers (Dropout(seed=None)) from torch's global generator, which each
    worker seeded its own way; a step that draws them takes the chief's,
    so every replica cuts its rows of the one mask one device would draw."""
    if not is_multi_process():
        return
    states = [torch.get_rng_state()]
    if torch.cuda.is_available():
        states.append(torch.cuda.get_rng_state())
    payload = [states]
    dist.broadcast_object_list(payload, src=0)
    torch.set_rng_state(payload[0][0])
    if torch.cuda.is_available():
        torch.cuda.set_rng_state(payload[0][1])
