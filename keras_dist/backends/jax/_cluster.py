"""JAX: joining a multi-worker job through `jax.distributed` (gloo on CPU)."""

from __future__ import annotations

import atexit
import os
import sys
import threading
import time

import jax
import numpy as np

from keras_dist._communication import exit_unless_joined, join_timeout_seconds
from keras_dist.cluster_resolver._validate import check_bindable, check_worker_addresses_known

#: Seconds JAX's own join deadline leaves after keras_dist's watchdog.
_JAX_JOIN_GRACE_SECONDS = 10

#: Whether this process joined a job (JAX joins one per process).
_multi_worker = {"initialized": False}


def initialize_multi_worker(resolver, options) -> None:
    """Joins the job through `jax.distributed` (once per process).

    The coordinator is `KERAS_DIST_COORDINATOR` (set by `keras-dist
    launch`) or the chief's address; CPU collectives go through gloo.
    """
    if options.bytes_per_pack:
        import warnings

        warnings.warn(
            f"CommunicationOptions(bytes_per_pack={options.bytes_per_pack}) has no effect on the JAX backend: XLA "
            "packs the all-reduces of keras_dist's compiled step itself (TensorFlow and torch split the gradients' "
            "sum into packs of about that size). The results are the same either way.",
            stacklevel=3,
        )
    if resolver.num_workers <= 1 or _multi_worker["initialized"]:
        return
    check_worker_addresses_known(resolver, "jax")
    if options.implementation.value == "NCCL" and not any(
        d.platform == "gpu" for d in jax.local_devices()
    ):
        raise ValueError(
            "CommunicationImplementation.NCCL needs GPUs; this worker has none. "
            "Use AUTO or RING (gloo) on CPU."
        )
    from keras_dist.backends import _gloo

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
    _fail_fast(resolver.worker_index, resolver.num_workers)
    if all(d.platform == "cpu" for d in jax.local_devices()):
        _gloo.yield_event_loop()  # that collective started gloo


_PEER_FAILURE_TEXTS = ("Connection reset", "Connection closed", "Socket closed", "heartbeat", "Gloo", "gloo")


def is_peer_failure(error: BaseException) -> bool:
    """Whether `error` is a collective that failed for want of a peer.

    (When the coordination service sees a peer's heartbeat stop, JAX
    terminates the process itself, with its own message.)
    """
    # (`multihost_utils.process_allgather` raises gloo's failure as a ValueError.)
    return isinstance(error, (jax.errors.JaxRuntimeError, ValueError)) and any(
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


#: Keys in JAX's coordination service (its key-value store) by which a
#: failing worker tells the others: the failed worker's index, and each
#: worker's "gone" mark just before it exits.
_FAILED_KEY = "keras_dist/failed"
_GONE_KEY = "keras_dist/gone/{}"
#: Seconds the chief waits for the other workers to exit before it does
#: (its exit ends the coordination service; a worker still connected then
#: dies of JAX's fatal error, with a C++ stack dump).
_CHIEF_LAST_SECONDS = 5.0
#: Seconds the chief still waits after the last "gone" mark: the worker
#: that wrote it has yet to reach its `os._exit` (under load, a while).
_CHIEF_GRACE_SECONDS = 1.5
#: Seconds one wait of the watcher lasts (it then checks whether to stop).
_WATCH_SECONDS = 0.5

#: The exit code of a worker that ends on an uncaught exception (None: none),
#: and whether a normal exit has begun.
_failure = {"code": None, "exiting": False}


def _fail_fast(worker_index: int, num_workers: int) -> None:
    """An uncaught exception in any worker ends every worker at once.

    JAX at exit waits in its coordination service's shutdown barrier for
    every worker (up to 5 minutes) while the others wait in a collective
    for this one: the job hung, then died of a C++ check failure. Instead:

    - the failing worker, once Python has printed its traceback, writes its
      index under `_FAILED_KEY` in JAX's coordination service and exits
      (code 1; 130 for Ctrl-C) without JAX's barrier;
    - every other worker watches that key (a thread waiting in the
      service's `blocking_key_value_get`, half a second at a time, until
      JAX's shutdown barrier at a normal exit is passed), prints one line
      naming the failed worker, and exits with code 1;
    - the chief, which hosts the service, exits last (up to
      `_CHIEF_LAST_SECONDS` after the others said they are gone), so that no
      worker sees the service vanish under it.

    Exit handlers registered before the strategy joined are skipped; those
    registered later run first, as usual. A worker killed by a signal
    cannot say so: the others end within `timeout_seconds` (JAX's
    heartbeat), as before.
    """
    from jax._src import distributed

    client = distributed.global_state.client
    if client is None:
        return
    previous = sys.excepthook

    def excepthook(kind, value, traceback):
        _failure["code"] = 130 if issubclass(kind, KeyboardInterrupt) else 1
        previous(kind, value, traceback)

    def exit_now(code: int) -> None:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        try:
            if worker_index == 0:
                for other in range(1, num_workers):
                    client.blocking_key_value_get(_GONE_KEY.format(other), int(_CHIEF_LAST_SECONDS * 1000))
                time.sleep(_CHIEF_GRACE_SECONDS)
            else:
                client.key_value_set(_GONE_KEY.format(worker_index), "1")
        except Exception:  # noqa: BLE001 - a worker already gone, or the service
            pass
        os._exit(code)

    stop_watching = threading.Event()

    def exit_without_barrier():
        code = _failure["code"]
        if code is None:
            # A normal exit: JAX's shutdown barrier, where every worker
            # meets, with the watcher still on duty (a worker may fail as it
            # ends); then the watcher stops, so that no thread is inside the
            # engine while the interpreter finalizes (that aborts).
            _failure["exiting"] = True
            try:
                jax.distributed.shutdown()
            finally:
                stop_watching.set()
                watcher.join(timeout=2 * _WATCH_SECONDS + 1)
            return
        print(
            f"keras_dist: worker {worker_index} of {num_workers} ends on the "
            "exception above; telling the other workers and exiting now, "
            "without JAX's shutdown barrier.",
            file=sys.stderr,
        )
        try:
            client.key_value_set(_FAILED_KEY, str(worker_index))
        except Exception:  # noqa: BLE001 - another worker failed first
            pass
        exit_now(code)

    def watch():
        while not stop_watching.is_set():
            try:
                failed = client.blocking_key_value_get(_FAILED_KEY, int(_WATCH_SECONDS * 1000))
            except Exception:  # noqa: BLE001 - no news yet, or shut down
                if stop_watching.is_set():
                    return
                if _failure["exiting"]:
                    stop_watching.wait(_WATCH_SECONDS)
                continue
            if failed == str(worker_index) or _failure["code"] is not None:
                return  # this worker's own failure: exit_without_barrier ends it
            print(
                f"keras_dist: worker {worker_index} of {num_workers}: worker "
                f"{failed} failed (see its traceback); ending this worker too "
                "(exit code 1).",
                file=sys.stderr,
            )
            exit_now(1)

    watcher = threading.Thread(target=watch, name="keras_dist-failure-watch", daemon=True)
    sys.excepthook = excepthook
    # atexit runs last-registered first: before JAX's own clean-up (its
    # barrier), registered when jax was imported.
    atexit.register(exit_without_barrier)
    watcher.start()
