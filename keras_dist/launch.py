"""Run a multi-worker job on this machine: `keras-dist launch`.

(`keras-dist bench` is the other subcommand: see `keras_dist._bench`.)

Starts N copies of a script, each with a `TF_CONFIG` naming all N workers on
free loopback ports and its own index, so `MultiWorkerMirroredStrategy()`
finds the cluster with no other set-up:

```
keras-dist launch -n 2 train.py --epochs 3
python -m keras_dist.launch -n 2 --backend jax train.py --epochs 3
```

Each worker's output lines are prefixed with `[worker i] `; gloo's
"[Gloo] Rank i is connected to n peer ranks" lines are dropped. If a worker
fails, the others are stopped and the whole job is restarted (with fresh
ports) while `--max-restarts` allows, else the launcher exits with the
failing worker's code. No worker (nor anything it started) outlives the
launcher.

Liveness guard: with `--timeout SECONDS`, a job in which no worker has
made progress for SECONDS (no output line, no heartbeat: keras_dist beats
at every training step and `strategy.run`) is stopped, naming each silent
worker and whether its process is stopped, and the launcher exits 124.
`--max-time SECONDS` bounds the whole job instead, progress or not.

Every worker gets, besides `TF_CONFIG`:

- `KERAS_DIST_COORDINATOR`: `host:port` for JAX's distributed coordinator,
- `KERAS_DIST_NUM_WORKERS`, `KERAS_DIST_WORKER_INDEX`,
- `KERAS_DIST_RESTART`: the attempt number, 0 for the first run,
- `KERAS_DIST_HEARTBEAT_FILE`: the file keras_dist touches on progress,
- `KERAS_BACKEND` when a backend is given (else it is inherited),
- `PYTHONUNBUFFERED=1` unless already set, so output arrives line by line.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence

__all__ = ["free_ports", "launch", "main", "cli"]

BACKENDS = ("jax", "tensorflow")
# Seconds between SIGTERM and SIGKILL when stopping workers.
GRACE_SECONDS = 5.0
# How often the launcher checks on its workers.
_POLL_SECONDS = 0.05
_PREFIX = "keras-dist launch: "
_TIMEOUT_EXIT_CODE = 124


def free_ports(n: int, host: str = "127.0.0.1") -> list[int]:
    """`n` distinct TCP ports that are free on `host` right now.

    All `n` sockets are bound (to port 0) before any is closed, so the ports
    differ; another process may still take one before it is used.

    >>> ports = free_ports(3)
    >>> len(set(ports)) == 3 and all(0 < p < 65536 for p in ports)
    True
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sockets = []
    try:
        for _ in range(n):
            s = socket.socket(family, socket.SOCK_STREAM)
            sockets.append(s)
            s.bind((host, 0))
        return [s.getsockname()[1] for s in sockets]
    finally:
        for s in sockets:
            s.close()


def _address(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _check_seconds(name: str, value) -> None:
    if value is not None and (
        isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0
    ):
        raise ValueError(f"{name} must be a number of seconds > 0 (or None), got {value!r}")


def _validate(script, args, num_workers, backend, max_restarts, timeout, max_time=None) -> None:
    if isinstance(num_workers, bool) or not isinstance(num_workers, int) or num_workers < 1:
        raise ValueError(f"the number of workers must be an integer >= 1, got {num_workers!r}")
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be an integer >= 0, got {max_restarts!r}")
    _check_seconds("timeout", timeout)
    _check_seconds("max_time", max_time)
    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)} (or None), got {backend!r}")
    if not isinstance(script, (str, os.PathLike)) or not os.fspath(script):
        raise ValueError(f"script must be a path, got {script!r}")
    if not os.path.isfile(script):
        raise ValueError(f"script not found: {os.fspath(script)!r}")
    if isinstance(args, (str, bytes)):
        raise ValueError(f"args must be a sequence of arguments, not a string: {args!r}")


class _Output:
    """Writes whole lines to the launcher's stdout/stderr, one at a time."""

    def __init__(self) -> None:
        self._lock = threading.Lock()

    def write(self, stream, data: bytes) -> None:
        with self._lock:
            try:
                stream.flush()
                buffer = getattr(stream, "buffer", None)
                if buffer is not None:
                    buffer.write(data)
                    buffer.flush()
                else:
                    stream.write(data.decode("utf-8", errors="replace"))
                    stream.flush()
            except (OSError, ValueError):
                pass  # launcher's stream closed: drop the line, keep draining

    def message(self, text: str) -> None:
        """A launcher message, on stderr."""
        self.write(sys.stderr, (_PREFIX + text + "\n").encode())


#: gloo (JAX's CPU collectives across processes) prints "[Gloo] Rank i is
#: connected to n peer ranks. Expected number of connected peer ranks is : n"
#: to stdout for every group of devices a worker joins, with no setting to
#: turn it off; groups that connect at once interleave its pieces mid-line.
#: Lines made only of those pieces are dropped ("is NOT connected" passes).
_GLOO_CONNECTED = re.compile(
    rb"^(?=.*(?:\[Gloo\]|connected))"
    rb"(?:\[Gloo\] Rank |\d+| is connected to | peer ranks\. |Expected number of connected peer ranks is : )+"
    rb"\r?\n?$"
)


def _pump(pipe, prefix: bytes, stream_name: str, output: _Output, progress: "_Progress", index: int) -> None:
    with pipe:
        for line in iter(pipe.readline, b""):
            progress.record(index)
            if _GLOO_CONNECTED.match(line):
                continue
            if not line.endswith(b"\n"):
                line += b"\n"
            output.write(getattr(sys, stream_name), prefix + line)


def _process_state(pid: int) -> str:
    """'stopped' (SIGSTOP), 'running' or 'waiting', from /proc where there is one."""
    try:
        with open(f"/proc/{pid}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
    return {"T": "stopped", "t": "stopped", "R": "running", "Z": "exited"}.get(state, "waiting")


class _Progress:
    """When each worker last made progress: an output line or a heartbeat
    (the mtime of its `KERAS_DIST_HEARTBEAT_FILE`)."""

    def __init__(self, num_workers: int, directory: str) -> None:
        start = time.monotonic()
        self._last = [start] * num_workers
        self.files = [os.path.join(directory, f"worker{i}.heartbeat") for i in range(num_workers)]

    def record(self, index: int) -> None:
        self._last[index] = time.monotonic()

    def silent_for(self, index: int) -> float:
        now = time.monotonic()
        last = self._last[index]
        try:
            beat_age = time.time() - os.stat(self.files[index]).st_mtime
            last = max(last, now - max(0.0, beat_age))
        except OSError:
            pass  # no heartbeat yet
        return now - last

    def describe(self, processes: list[subprocess.Popen]) -> str:
        parts = []
        for index, process in enumerate(processes):
            state = _process_state(process.pid)
            parts.append(
                f"worker {index}: silent {self.silent_for(index):.0f} s"
                + (f", process {state}" if state else "")
            )
        return "; ".join(parts)


class _Signals:
    """Records SIGINT/SIGTERM/SIGHUP while a job runs (main thread only)."""

    NAMES = ("SIGINT", "SIGTERM", "SIGHUP")

    def __init__(self) -> None:
        self.received: int | None = None
        self.event = threading.Event()
        self._previous: dict[int, object] = {}

    def _handle(self, signum, frame) -> None:
        if self.received is None:
            self.received = signum
        self.event.set()

    def __enter__(self) -> "_Signals":
        if threading.current_thread() is threading.main_thread():
            for name in self.NAMES:
                signum = getattr(signal, name, None)
                if signum is not None:
                    self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


def _exit_code(returncode: int) -> int:
    """A worker's return code as a shell exit code (killed by signal S: 128+S)."""
    return 128 - returncode if returncode < 0 else returncode


def _describe(index: int, returncode: int) -> str:
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = f"signal {-returncode}"
        return f"worker {index} exited with code {_exit_code(returncode)} (killed by {name})"
    return f"worker {index} exited with code {returncode}"


def _signal_group(pid: int, signum: int) -> None:
    try:
        os.killpg(pid, signum)
    except (ProcessLookupError, PermissionError):
        pass  # the group is gone


def _stop(processes: list[subprocess.Popen], grace: float) -> None:
    """SIGTERM every worker's process group, SIGKILL after `grace`, reap all."""
    for p in processes:
        if p.poll() is None:
            _signal_group(p.pid, signal.SIGTERM)
    end = time.monotonic() + grace
    for p in processes:
        try:
            p.wait(timeout=max(0.0, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    # Also reaches what the workers started and left behind, even on success.
    for p in processes:
        _signal_group(p.pid, signal.SIGKILL)
    for p in processes:
        p.wait()


class _Outcome:
    def __init__(self, kind: str, index: int = -1, returncode: int = 0, detail: str = "") -> None:
        self.kind = kind  # "ok", "failed", "stalled", "timeout" or "signal"
        self.index = index
        self.returncode = returncode
        self.detail = detail


def _run_attempt(
    command: list[str],
    num_workers: int,
    host: str,
    base_env: Mapping[str, str],
    backend: str | None,
    attempt: int,
    deadline: float | None,
    stall_timeout: float | None,
    signals: _Signals,
    output: _Output,
    num_ps: int = 0,
) -> _Outcome:
    tasks = _parameter_server_tasks(command, num_workers, num_ps, host, backend, base_env) if num_ps else None
    if tasks is None:
        ports = free_ports(num_workers + 1, host)
        cluster = {"worker": [_address(host, p) for p in ports[:num_workers]]}
        tasks = [(command, "worker", index, f"worker {index}") for index in range(num_workers)]
        coordinator = _address(host, ports[-1])
    else:
        tasks, cluster, coordinator = tasks
    # Which processes decide the outcome: every worker's in a multi-worker
    # job; the script's alone (the chief) in a parameter-server job, where a
    # worker lost is the coordinator's to handle and servers never exit.
    decisive = range(1) if num_ps else range(len(tasks))
    processes: list[subprocess.Popen] = []
    pumps: list[threading.Thread] = []
    heartbeats = tempfile.mkdtemp(prefix="keras-dist-heartbeat-")
    progress = _Progress(len(tasks), heartbeats)
    try:
        for index, (task_command, task_type, task_index, label) in enumerate(tasks):
            env = dict(base_env)
            env.setdefault("PYTHONUNBUFFERED", "1")
            env.update(
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task_type, "index": task_index}}),
                KERAS_DIST_COORDINATOR=coordinator,
                KERAS_DIST_NUM_WORKERS=str(num_workers),
                KERAS_DIST_WORKER_INDEX=str(task_index),
                KERAS_DIST_RESTART=str(attempt),
                KERAS_DIST_HEARTBEAT_FILE=progress.files[index],
            )
            if num_ps:
                env["KERAS_DIST_NUM_PS"] = str(num_ps)
            if backend is not None:
                env["KERAS_BACKEND"] = backend
            if signals.received is not None:
                break
            process = subprocess.Popen(
                task_command,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,  # own process group: killpg reaches grandchildren
            )
            processes.append(process)
            prefix = f"[{label}] ".encode()
            for pipe, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
                pump = threading.Thread(
                    target=_pump, args=(pipe, prefix, name, output, progress, index), daemon=True,
                    name=f"keras-dist-{label.replace(' ', '')}-{name}",
                )
                pump.start()
                pumps.append(pump)

        while True:
            if signals.received is not None:
                return _Outcome("signal")
            running = False
            for index, process in enumerate(processes):
                if index not in decisive:
                    continue
                returncode = process.poll()
                if returncode is None:
                    running = True
                elif returncode != 0:
                    return _Outcome("failed", index, returncode)
            if not running:
                return _Outcome("ok")
            if stall_timeout is not None and all(
                progress.silent_for(i) > stall_timeout for i in range(len(processes))
            ):
                return _Outcome("stalled", detail=progress.describe(processes))
            wait = _POLL_SECONDS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _Outcome("timeout")
                wait = min(wait, left)
            signals.event.wait(wait)
    finally:
        _stop(processes, GRACE_SECONDS)
        for pump in pumps:
            pump.join(timeout=2.0)
        shutil.rmtree(heartbeats, ignore_errors=True)


def _backend_of(backend: str | None, base_env: Mapping[str, str]) -> str:
    """The Keras backend the job runs: given, inherited, or Keras' config file's."""
    if backend or base_env.get("KERAS_BACKEND"):
        return backend or base_env["KERAS_BACKEND"]
    home = base_env.get("KERAS_HOME") or os.path.join(os.path.expanduser("~"), ".keras")
    try:
        with open(os.path.join(home, "keras.json")) as handle:
            return json.load(handle).get("backend", "tensorflow")
    except (OSError, ValueError, AttributeError):
        return "tensorflow"


def _parameter_server_tasks(command, num_workers, num_ps, host, backend, base_env):
    """A parameter-server job: the script is the `chief` (the coordinator,
    task 0 of the processes); on TensorFlow every worker and ps task is a
    server process (`python -m keras_dist.serve`). On JAX the strategy
    starts its workers and parameter servers itself (Ray actors): TF_CONFIG
    carries the counts, with no process behind the worker and ps addresses.
    Returns (tasks, cluster, coordinator address)."""
    ports = free_ports(1 + num_workers + num_ps + 1, host)
    cluster = {
        "chief": [_address(host, ports[0])],
        "worker": [_address(host, p) for p in ports[1 : 1 + num_workers]],
        "ps": [_address(host, p) for p in ports[1 + num_workers : 1 + num_workers + num_ps]],
    }
    tasks = [(command, "chief", 0, "chief")]
    if _backend_of(backend, base_env) == "tensorflow":
        serve = [sys.executable, "-m", "keras_dist.serve"]
        tasks += [(serve, "worker", i, f"worker {i}") for i in range(num_workers)]
        tasks += [(serve, "ps", i, f"ps {i}") for i in range(num_ps)]
    return tasks, cluster, _address(host, ports[-1])


def launch(
    script: str | os.PathLike,
    args: Sequence[str] = (),
    num_workers: int = 2,
    backend: str | None = None,
    max_restarts: int = 0,
    timeout: float | None = None,
    host: str = "127.0.0.1",
    env: Mapping[str, str] | None = None,
    max_time: float | None = None,
    num_ps: int = 0,
) -> int:
    """Runs `script` as `num_workers` local workers; returns the exit code.

    With `num_ps` > 0, a parameter-server job instead: `script` runs once,
    as the `chief` task (the coordinator of a `ParameterServerStrategy`),
    with `num_workers` worker and `num_ps` ps tasks in its TF_CONFIG; on
    TensorFlow each of those is a server process (`python -m
    keras_dist.serve`), on JAX there is none (the strategy starts Ray
    actors). The job's outcome is the script's; every process is reaped.

    `env` is the workers' base environment (default: `os.environ`), to which
    `TF_CONFIG` and the `KERAS_DIST_*` variables are added. A failed worker
    stops the job, which restarts up to `max_restarts` times. `timeout`
    (seconds) is the liveness guard: the job is stopped when no worker has
    printed a line or sent a heartbeat for that long; `max_time` (seconds)
    bounds the whole job, restarts included. Returns 0 on success, the
    failing worker's exit code (128 + signal if it was killed), 124 when
    stopped by `timeout` or `max_time`, or 128 + signal if the launcher was
    interrupted. Invalid arguments raise `ValueError` before anything
    starts.

    >>> from keras_dist.launch import launch
    >>> launch("train.py", ["--epochs", "3"], num_workers=2, backend="jax")  # doctest: +SKIP
    0
    """
    _validate(script, args, num_workers, backend, max_restarts, timeout, max_time)
    if isinstance(num_ps, bool) or not isinstance(num_ps, int) or num_ps < 0:
        raise ValueError(f"the number of ps tasks must be an integer >= 0, got {num_ps!r}")
    command = [sys.executable, os.fspath(script), *map(str, args)]
    base_env = dict(os.environ if env is None else env)
    deadline = None if max_time is None else time.monotonic() + max_time
    output = _Output()
    attempt = 0
    with _Signals() as signals:
        while True:
            outcome = _run_attempt(
                command, num_workers, host, base_env, backend, attempt, deadline, timeout,
                signals, output, num_ps,
            )
            if outcome.kind == "ok":
                return 0
            if outcome.kind == "timeout":
                output.message(f"the job ran past --max-time {max_time:g} s; stopped all workers")
                return _TIMEOUT_EXIT_CODE
            if outcome.kind == "stalled":
                output.message(
                    f"no worker made progress (no output, no heartbeat) for --timeout "
                    f"{timeout:g} s ({outcome.detail}); stopped all workers"
                )
                return _TIMEOUT_EXIT_CODE
            if outcome.kind == "signal":
                name = signal.Signals(signals.received).name
                output.message(f"received {name}; stopped all workers")
                return 128 + signals.received
            failure = _describe(outcome.index, outcome.returncode)
            if attempt < max_restarts:
                attempt += 1
                output.message(f"{failure}; restarting the job (attempt {attempt}/{max_restarts})")
                continue
            restarts = f" after {attempt} restart(s)" if max_restarts else ""
            output.message(f"{failure}; stopped all workers, the job failed{restarts}")
            return _exit_code(outcome.returncode)


def _positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
    return value


def _launch_parser(prog: str) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog=prog,
        description="Start N local worker processes of a script, each with TF_CONFIG "
        "set for a multi-worker job on free loopback ports.",
        epilog="Example: keras-dist launch -n 2 --backend jax train.py --epochs 3",
    )
    parser.add_argument("-n", "--num-workers", "--workers", dest="num_workers", type=int, required=True,
                        metavar="N", help="number of worker processes (>= 1)")
    parser.add_argument("--ps", type=int, default=0, metavar="M",
                        help="a parameter-server job: M ps tasks and N workers (TensorFlow: "
                        "server processes), the script running once as the chief (the "
                        "coordinator). Default: 0, a multi-worker job")
    parser.add_argument("--backend", choices=BACKENDS,
                        help="set KERAS_BACKEND for the workers (default: inherited)")
    parser.add_argument("--max-restarts", type=int, default=0, metavar="K",
                        help="restart the whole job up to K times after a worker fails (default: 0)")
    parser.add_argument("--timeout", type=_positive_float, default=None, metavar="SECONDS",
                        help="liveness guard: stop the job and exit 124 when no worker has "
                        "printed a line or sent a heartbeat for SECONDS (default: none)")
    parser.add_argument("--max-time", type=_positive_float, default=None, metavar="SECONDS",
                        help="stop the whole job after SECONDS, progress or not, and exit 124 "
                        "(default: none)")
    parser.add_argument("--host", default="127.0.0.1",
                        help="address the workers bind to (default: 127.0.0.1)")
    parser.add_argument("script", help="the Python script each worker runs")
    parser.add_argument("args", nargs=argparse.REMAINDER, help="arguments for the script")
    return parser


def _top_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="keras-dist",
        description="keras-dist command-line tools.",
        epilog="`launch` may be left out: `keras-dist -n 2 train.py` is "
        "`keras-dist launch -n 2 train.py`. See `keras-dist launch --help` and "
        "`keras-dist bench --help`.",
    )
    commands = parser.add_subparsers(title="commands", metavar="COMMAND")
    commands.add_parser(
        "launch", help="run a script as N local workers with TF_CONFIG set (the default)"
    )
    commands.add_parser(
        "bench",
        help="train a built-in model on N replicas and print where the step time goes "
        "(ScalingReport)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """The `keras-dist` command line; returns the exit code.

    >>> main(["launch", "-n", "2", "train.py", "--epochs", "3"])  # doctest: +SKIP
    0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        if not argv or argv[0] in ("-h", "--help"):
            top = _top_parser()
            if not argv:
                top.print_usage(sys.stderr)
                top.exit(2, f"{top.prog}: error: nothing to do; try `keras-dist launch --help`\n")
            top.print_help()
            return 0
        if argv[0] == "bench":
            from keras_dist import _bench

            return _bench.main(argv[1:])
        if argv[0] == "launch":
            argv = argv[1:]
        parser = _launch_parser("keras-dist launch")
        options = parser.parse_args(argv)
        try:
            _validate(options.script, options.args, options.num_workers, options.backend,
                      options.max_restarts, options.timeout, options.max_time)
            if options.ps < 0:
                raise ValueError(f"--ps must be >= 0, got {options.ps}")
        except ValueError as error:
            parser.error(str(error))
    except SystemExit as exit_:  # argparse: --help (0) or a usage error (2)
        code = exit_.code
        return code if isinstance(code, int) else (0 if code is None else 2)
    return launch(
        options.script,
        options.args,
        num_workers=options.num_workers,
        backend=options.backend,
        max_restarts=options.max_restarts,
        timeout=options.timeout,
        host=options.host,
        max_time=options.max_time,
        num_ps=options.ps,
    )


def cli() -> None:
    """Entry point of the `keras-dist` console script."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
