"""Cross-worker communication options (tf.distribute names)."""

from __future__ import annotations

import contextlib
import ctypes
import dataclasses
import enum
import os
import signal
import subprocess
import sys
from typing import Optional

from keras_dist import _foreign


#: How long a worker waits for every other worker to join the job when
#: `CommunicationOptions.timeout_seconds` is None (JAX's own default).
DEFAULT_JOIN_TIMEOUT_SECONDS = 300


def join_timeout_seconds(options: "CommunicationOptions") -> float:
    """Seconds a worker waits for the others to join the job."""
    timeout = options.timeout_seconds
    return DEFAULT_JOIN_TIMEOUT_SECONDS if timeout is None else timeout


def _did_not_join_message(resolver, timeout: float, waiting_for: str, detail: str = "") -> str:
    return (
        f"Worker {resolver.worker_index} of {resolver.num_workers}: the job did "
        f"not join within {timeout:g} s (waiting for {waiting_for}). Start every "
        "worker of the cluster (keras-dist launch does), check that each one's "
        "TF_CONFIG names the same cluster, and create MultiWorkerMirroredStrategy "
        "before any other computation; CommunicationOptions(timeout_seconds=...) "
        "sets this wait." + (f" Engine error: {detail}" if detail else "")
    )


def _others(resolver) -> list[int]:
    return [i for i in range(resolver.num_workers) if i != resolver.worker_index]


def did_not_join_error(resolver, timeout: float, error: BaseException) -> "PeerWorkerError":
    """The error for a job that some worker never joined."""
    names = ", ".join(f"worker {i}" for i in _others(resolver))
    lines = str(error).strip().splitlines()
    detail = f"{type(error).__name__}: {lines[0] if lines else ''}"
    return PeerWorkerError(_did_not_join_message(resolver, timeout, names, detail))


def _worker_addresses(resolver) -> list[str]:
    """`worker i=host:port` for every other worker of the cluster."""
    from keras_dist.cluster_resolver._resolvers import _worker_tasks

    spec = resolver.cluster_spec()
    return [
        f"worker {index}={spec.task_address(job, task)}"
        for index, (job, task) in enumerate(_worker_tasks(spec))
        if index != resolver.worker_index
    ]


#: The watchdog process of `exit_unless_joined`: waits, then names whom the
#: job waited for, prints the error on the worker's stderr and ends it with
#: the signal it is given (SIGHUP, which the worker turned into `_exit(1)`;
#: else SIGTERM), SIGKILL if it is still there 3 s later.
_WATCHDOG = r"""
import os, signal, socket, sys, time
pid, seconds, prefix, suffix = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
probe, end_with, others = sys.argv[5] == "probe", int(sys.argv[6]), sys.argv[7:]
end = time.monotonic() + seconds
while time.monotonic() < end:
    if os.getppid() != pid:
        sys.exit(0)  # the worker is gone
    time.sleep(0.2)
names = []
for other in others:
    name, address = other.split("=", 1)
    host, _, port = address.rpartition(":")
    if probe:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            continue
        except OSError:
            name += f" at {address}, not listening"
    names.append(name)
names = names or [other.split("=", 1)[0] for other in others]
sys.stderr.write(f"keras_dist.PeerWorkerError: {prefix}{', '.join(names)}{suffix}\n")
sys.stderr.flush()
os.kill(pid, end_with)
time.sleep(3)
try:
    os.kill(pid, signal.SIGKILL)
except ProcessLookupError:
    pass
"""


@contextlib.contextmanager
def exit_unless_joined(resolver, timeout: float, probe_addresses: bool, grace: float = 0.0):
    """Bounds the engine's wait for every worker to join the job.

    Engines wait for missing peers inside native code that Python cannot
    interrupt (TensorFlow's leader waits without end, holding the
    interpreter; JAX aborts with a stack dump). A small watchdog process
    ends the wait: if the block is still running after `timeout` seconds,
    (plus `grace`, which leaves the engine time to raise its own error
    first) it prints a `PeerWorkerError` naming the workers waited for on
    this worker's stderr and terminates it. With `probe_addresses` (engines whose
    workers serve their cluster address), only the workers not listening
    there are named.
    """
    message = _did_not_join_message(resolver, timeout, "{}")
    prefix, suffix = message.split("{}")
    suffix += " This process is ended (exit code 1): the engine's wait cannot be interrupted."
    restore = _exit_1_on_sighup()
    end_with = signal.SIGHUP if restore is not None else signal.SIGTERM
    try:
        watchdog = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, str(os.getpid()), str(timeout + grace), prefix, suffix,
             "probe" if probe_addresses else "names", str(int(end_with)), *_worker_addresses(resolver)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
        )
        try:
            yield
        finally:
            watchdog.kill()
            watchdog.wait()
    finally:
        if restore is not None:
            restore()


def _exit_1_on_sighup():
    """Until the returned function is called, SIGHUP ends this process at
    once with exit code 1, even while native code holds the interpreter (a
    Python handler would wait for it; TensorFlow's SIGTERM handler keeps a
    process alive): libc's `_exit` is the C handler, and a handler is
    called with the signal's number, which is 1 for SIGHUP. None where this
    cannot be done (no libc `signal`/`_exit`, SIGHUP not 1)."""
    if getattr(signal, "SIGHUP", None) != 1:
        return None
    try:
        libc = ctypes.CDLL(None)
        set_handler, exit_now = libc.signal, libc._exit
    except (OSError, AttributeError):
        return None
    set_handler.restype = ctypes.c_void_p
    set_handler.argtypes = (ctypes.c_int, ctypes.c_void_p)
    previous = set_handler(signal.SIGHUP, ctypes.cast(exit_now, ctypes.c_void_p))
    if previous == ctypes.c_void_p(-1).value:  # SIG_ERR
        return None
    return lambda: set_handler(signal.SIGHUP, previous)


class PeerWorkerError(RuntimeError):
    """A collective failed because another worker of the job died or hung.

    Raised by `fit`/`evaluate`/`predict` under MultiWorkerMirroredStrategy
    when the engine reports the failure (TF: the collective's
    ``timeout_seconds``; JAX terminates the process itself when the
    coordination service stops hearing from a peer). Restart the whole job
    and resume with ``keras.callbacks.BackupAndRestore``::

        keras-dist launch -n 2 --max-restarts 3 train.py

    ```python
    try:
        model.fit(x, y, batch_size=32, verbose=0)
    except keras_dist.PeerWorkerError:  # a RuntimeError: another worker is gone
        raise SystemExit(1)  # the launcher restarts the job; BackupAndRestore resumes it
    ```
    """


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to use across workers.

    AUTO lets the backend choose (JAX: gloo on CPU, NCCL on GPU; TF: its
    own choice); RING asks for ring all-reduce (gloo on JAX CPU); NCCL asks
    for NCCL and needs GPUs.

    ```python
    options = keras_dist.CommunicationOptions(implementation=keras_dist.CommunicationImplementation.RING)
    options.implementation.value  # 'RING'
    ```
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """Options for cross-worker collectives.

    Args:
        bytes_per_pack: split gradients into packs of about this many bytes
            for the all-reduce; 0 lets the engine decide. TensorFlow: tf's
            packing; torch: the buckets `fit` sums as backward produces the
            gradients (0: DDP's, 1 MiB first and 25 MiB after); JAX: XLA
            packs the compiled step's all-reduces itself, and a nonzero
            value warns that it has no effect.
        timeout_seconds: give up (with an error) when a peer does not
            answer within this many seconds; None waits for the engine's
            default. Also bounds the wait for every worker to join the job
            (default 300 s when None).
        implementation: a `CommunicationImplementation` (on the TensorFlow
            backend also tf.distribute.experimental's).

    ```python
    options = keras_dist.CommunicationOptions(timeout_seconds=60)
    ```
    """

    bytes_per_pack: int = 0
    timeout_seconds: Optional[float] = None
    implementation: CommunicationImplementation = CommunicationImplementation.AUTO

    def __post_init__(self):
        if not isinstance(self.bytes_per_pack, int) or self.bytes_per_pack < 0:
            raise ValueError(
                f"bytes_per_pack must be an integer >= 0, got {self.bytes_per_pack!r}."
            )
        if self.timeout_seconds is not None and (
            isinstance(self.timeout_seconds, bool) or not isinstance(self.timeout_seconds, (int, float))
        ):
            raise TypeError(
                f"timeout_seconds must be a number of seconds or None, got {self.timeout_seconds!r} "
                f"({type(self.timeout_seconds).__name__}); e.g. CommunicationOptions(timeout_seconds=60)."
            )
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise ValueError(
                f"timeout_seconds must be positive or None, got {self.timeout_seconds!r}."
            )
        # TensorFlow: tf.distribute.experimental.CommunicationImplementation's
        object.__setattr__(self, "implementation", _foreign.accept(self.implementation, "communication_implementation"))
        if not isinstance(self.implementation, CommunicationImplementation):
            raise ValueError(
                "implementation must be a keras_dist.CommunicationImplementation, "
                f"got {self.implementation!r}."
            )


def CollectiveHints(bytes_per_pack: int = 0, timeout_seconds: Optional[float] = None) -> CommunicationOptions:
    """tf.distribute.experimental's deprecated `CollectiveHints`: as in tf,
    it makes a `CommunicationOptions` with the same two fields (warns).

    ```python
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        hints = keras_dist.experimental.CollectiveHints(timeout_seconds=30)
    assert hints == keras_dist.CommunicationOptions(timeout_seconds=30)
    ```
    """
    import warnings

    warnings.warn(
        "CollectiveHints is deprecated (as in tf.distribute): use "
        "keras_dist.CommunicationOptions(bytes_per_pack=..., timeout_seconds=...).",
        DeprecationWarning,
        stacklevel=2,
    )
    return CommunicationOptions(bytes_per_pack=bytes_per_pack, timeout_seconds=timeout_seconds)


def call_options(strategy, options, where: str, engine_applies_them: bool = False) -> Optional[CommunicationOptions]:
    """The `options=` of one collective call (`ReplicaContext.all_reduce`,
    `StrategyExtended.reduce_to`), checked: a `CommunicationOptions` (or, on
    TensorFlow, tf's), or None.

    With `engine_applies_them` (tf's `ReplicaContext.all_reduce` takes them
    per call) any options are returned for the engine. Otherwise a call's
    collectives are those of the strategy, compiled with the rest of the step
    on JAX, so the options may ask only for what the strategy already does:
    each field at its default or equal to the strategy's
    `communication_options`; a timeout is accepted in a one-process job (no
    peer to wait for). Anything else raises, naming the strategy's option.
    """
    if options is None:
        return None
    options = _foreign.accept(options, "communication_options")
    if not isinstance(options, CommunicationOptions):
        raise TypeError(
            f"{where}(options=...) takes a keras_dist.CommunicationOptions (or None), got {options!r}."
        )
    if engine_applies_them:
        return options
    own = strategy.extended.communication_options or CommunicationOptions()
    one_process = strategy.extended.num_workers <= 1
    asked = {
        "bytes_per_pack": options.bytes_per_pack not in (0, own.bytes_per_pack),
        "timeout_seconds": not one_process and options.timeout_seconds not in (None, own.timeout_seconds),
        "implementation": options.implementation not in (CommunicationImplementation.AUTO, own.implementation),
    }
    differing = [name for name, differs in asked.items() if differs]
    if differing:
        raise NotImplementedError(
            f"{where}(options=...) asks for {', '.join(differing)} other than the "
            f"strategy's ({own}); this call's collectives are the strategy's, "
            "compiled with the rest of the step, so they cannot differ per call. "
            "Set them on the strategy (MultiWorkerMirroredStrategy("
            "communication_options=keras_dist.CommunicationOptions(...))) or "
            "leave these fields at their defaults."
        )
    return options
