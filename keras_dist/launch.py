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
"[Gloo] Rank i is connected to n peer ranks" lines, absl's "All log
messages before absl::InitializeLog()" line and the engines' C++ INFO lines
are dropped (`--log-dir` keeps everything; `--local-ranks-filter 0`
shows only worker 0's output, as torchrun's option does). If a worker
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
- `KERAS_DIST_JOIN_FILE` (the workers of a multi-worker job, the servers of
  a parameter-server job): where keras_dist writes "joining", then
  "joined", as the worker joins the cluster (a server: once it is up); the
  launcher says when all have, and every `JOIN_NOTICE_SECONDS` while some
  are joining, whom it waits for,
- `KERAS_BACKEND` when a backend is given (else it is inherited),
- `PYTHONUNBUFFERED=1` unless already set, so output arrives line by line.

The server processes of a TensorFlow parameter-server job also get
`TF_CPP_MIN_LOG_LEVEL=1` unless it is set (no C++ INFO lines).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Mapping, Sequence

from keras_dist import _launch_output as _output
from keras_dist import _launch_tasks as _tasks

__all__ = ["free_ports", "launch", "main", "cli"]

BACKENDS = ("jax", "tensorflow", "torch")
# Seconds between SIGTERM and SIGKILL when stopping workers.
GRACE_SECONDS = 5.0
# How often the launcher checks on its workers.
_POLL_SECONDS = 0.05
#: Seconds the other workers get to end on their own after one failed.
_SETTLE_SECONDS = 1.0
#: ... and when one recorded an exception (keras_dist's own ending: the
#: others stop within a few seconds, JAX's chief up to 6.5 s after them).
_SETTLE_RECORDED_SECONDS = 10.0
#: While some workers of a multi-worker job are joining the cluster, the
#: launcher says whom it is waiting for every this many seconds.
JOIN_NOTICE_SECONDS = 15.0
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


def _run_attempt(
    command: list[str],
    num_workers: int,
    host: str,
    base_env: Mapping[str, str],
    backend: str | None,
    attempt: int,
    deadline: float | None,
    stall_timeout: float | None,
    signals: _tasks.Signals,
    output: _output.Output,
    num_ps: int = 0,
    log_dir: str | None = None,
    shown_workers: frozenset | None = None,
) -> _tasks.Outcome:
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
    progress = _tasks.Progress(len(tasks), heartbeats)
    error_files = [os.path.join(heartbeats, f"task{i}.error.json") for i in range(len(tasks))]
    recent = [deque(maxlen=_output.RECENT_LINES) for _ in tasks]
    exit_seen: list[float | None] = [None] * len(tasks)  # when each was first seen exited
    logs = []
    joins = _tasks.Joins(
        {i: task[3] for i, task in enumerate(tasks) if not num_ps or task[0] is not command},
        heartbeats,
        servers=bool(num_ps),
        notice_seconds=JOIN_NOTICE_SECONDS,
    )
    output.message(_start_line(tasks, cluster, coordinator, backend, base_env, attempt, log_dir))
    outcome = None
    try:
        for index, (task_command, task_type, task_index, label) in enumerate(tasks):
            env = dict(base_env)
            env.setdefault("PYTHONUNBUFFERED", "1")
            if task_command is not command:
                # keras_dist's own server processes: no TF C++ INFO lines
                # (each printed its ConfigProto, 19 lines). The user's script
                # keeps its own level (e.g. a setdefault of its own).
                env.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
            env.update(
                TF_CONFIG=json.dumps({"cluster": cluster, "task": {"type": task_type, "index": task_index}}),
                KERAS_DIST_COORDINATOR=coordinator,
                KERAS_DIST_NUM_WORKERS=str(num_workers),
                KERAS_DIST_WORKER_INDEX=str(task_index),
                KERAS_DIST_RESTART=str(attempt),
                KERAS_DIST_HEARTBEAT_FILE=progress.files[index],
                KERAS_DIST_ERROR_FILE=error_files[index],
            )
            if index in joins.files:
                env["KERAS_DIST_JOIN_FILE"] = joins.files[index]
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
            log = None
            if log_dir is not None:
                suffix = f".attempt{attempt}" if attempt else ""
                log = open(os.path.join(log_dir, f"{label.replace(' ', '')}{suffix}.log"), "ab")
                logs.append(log)
            for pipe, name in ((process.stdout, "stdout"), (process.stderr, "stderr")):
                pump = threading.Thread(
                    target=_output.pump,
                    args=(pipe, prefix, name, output, progress, index, recent[index] if name == "stderr" else None, log,
                          shown_workers is None or task_type != "worker" or task_index in shown_workers),
                    daemon=True,
                    name=f"keras-dist-{label.replace(' ', '')}-{name}",
                )
                pump.start()
                pumps.append(pump)

        while True:
            if signals.received is not None:
                return _tasks.Outcome("signal")
            running = False
            _tasks.note_exits(processes, exit_seen)
            for index, process in enumerate(processes):
                if index not in decisive:
                    continue
                returncode = process.poll()
                if returncode is None:
                    running = True
                elif returncode != 0:
                    outcome = _tasks.Outcome("failed", index, returncode, label=tasks[index][3])
                    return outcome
            if not running:
                return _tasks.Outcome("ok")
            line = joins.poll()
            if line is not None:
                output.message(line)
            if stall_timeout is not None and all(
                progress.silent_for(i) > stall_timeout for i in range(len(processes))
            ):
                return _tasks.Outcome("stalled", detail=progress.describe(processes))
            wait = _POLL_SECONDS
            if deadline is not None:
                left = deadline - time.monotonic()
                if left <= 0:
                    return _tasks.Outcome("timeout")
                wait = min(wait, left)
            signals.event.wait(wait)
    finally:
        if outcome is not None:
            # A moment for the others to end on their own (keras_dist ends
            # them when a worker fails), with their own last lines.
            # When a task recorded an exception, keras_dist is ending the
            # others itself (on JAX the chief goes last): wait for that.
            recorded = any(os.path.exists(path) for path in error_files)
            settle = time.monotonic() + (_SETTLE_RECORDED_SECONDS if recorded else _SETTLE_SECONDS)
            # (A stopped process cannot end on its own: no waiting for it.)
            while time.monotonic() < settle and any(
                p.poll() is None and _tasks.process_state(p.pid) != "stopped" for p in processes
            ):
                _tasks.note_exits(processes, exit_seen)
                time.sleep(_POLL_SECONDS)
            _tasks.note_exits(processes, exit_seen)
        ended = [p.poll() for p in processes]  # before the launcher stops the rest
        _tasks.stop(processes, GRACE_SECONDS)
        for pump in pumps:
            pump.join(timeout=2.0)
        for log in logs:
            log.close()
        if outcome is not None:
            outcome.report = _tasks.failure_report(outcome, tasks, ended, error_files, recent, exit_seen)
        shutil.rmtree(heartbeats, ignore_errors=True)


def _start_line(tasks, cluster, coordinator, backend, base_env, attempt, log_dir) -> str:
    """What the launcher is about to start, in one line."""
    what = ", ".join(f"{len(hosts)} {kind}{'s' if len(hosts) > 1 and kind == 'worker' else ''}"
                     for kind, hosts in cluster.items())
    addresses = "; ".join(f"{kind} {', '.join(hosts)}" for kind, hosts in cluster.items())
    started = {task_type for _, task_type, _, _ in tasks}
    actors = [kind for kind in cluster if kind not in started]
    line = (
        f"starting {what} (backend {_backend_of(backend, base_env)}"
        + (f"; the {' and '.join(actors)} tasks are the strategy's Ray actors, no process here" if actors else "")
        + (f", restart {attempt}" if attempt else "")
        + f"): {addresses}; coordinator {coordinator}"
    )
    if log_dir is not None:
        line += f"; logs in {log_dir}"
    return line


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
    log_dir: str | os.PathLike | None = None,
    local_ranks_filter: Sequence[int] | None = None,
) -> int:
    """Runs `script` as `num_workers` local workers; returns the exit code.

    With `num_ps` > 0, a parameter-server job instead: `script` runs once,
    as the `chief` task (the coordinator of a `ParameterServerStrategy`),
    with `num_workers` worker and `num_ps` ps tasks in its TF_CONFIG; on
    TensorFlow each of those is a server process (`python -m
    keras_dist.serve`), on JAX there is none (the strategy starts Ray
    actors). The job's outcome is the script's; every process is reaped.
    With `log_dir`, each process's output also goes, unprefixed, to
    `log_dir/<task>.log` (`worker0.log`, `chief.log`, `ps0.log`; a
    restart's to `worker0.attempt1.log`). With `local_ranks_filter` (worker
    indices, as torchrun's), only those workers' output reaches the console
    (the chief and ps tasks of a parameter-server job always do); the
    others' still goes to `log_dir`, and a failing worker's last lines are
    still in the failure report.

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
    shown_workers = _check_ranks_filter(local_ranks_filter, num_workers)
    command = [sys.executable, os.fspath(script), *map(str, args)]
    base_env = dict(os.environ if env is None else env)
    if log_dir is not None:
        log_dir = os.fspath(log_dir)
        os.makedirs(log_dir, exist_ok=True)
    started = time.monotonic()
    deadline = None if max_time is None else started + max_time
    output = _output.Output()
    attempt = 0

    def finish(code: int, how: str) -> int:
        restarts = f", {attempt} of {max_restarts} restart(s) used" if max_restarts else ""
        output.message(f"{how}: exit code {code} after {time.monotonic() - started:.1f} s{restarts}")
        return code

    with _tasks.Signals() as signals:
        while True:
            outcome = _run_attempt(
                command, num_workers, host, base_env, backend, attempt, deadline, timeout,
                signals, output, num_ps, log_dir, shown_workers,
            )
            if outcome.kind == "ok":
                return finish(0, "the job finished, every process exited 0")
            if outcome.kind == "timeout":
                output.message(f"the job ran past --max-time {max_time:g} s; stopped all workers")
                return finish(_TIMEOUT_EXIT_CODE, "the job was stopped")
            if outcome.kind == "stalled":
                output.message(
                    f"no worker made progress (no output, no heartbeat) for --timeout "
                    f"{timeout:g} s ({outcome.detail}); stopped all workers"
                )
                return finish(_TIMEOUT_EXIT_CODE, "the job was stopped")
            if outcome.kind == "signal":
                name = signal.Signals(signals.received).name
                output.message(f"received {name}; stopped all workers")
                return finish(128 + signals.received, "the job was stopped")
            for line in outcome.report:
                output.message(line)
            if outcome.root is not None:  # the first to fail, not the first seen exiting
                outcome.label, outcome.returncode = outcome.root
            failure = _tasks.describe(outcome.label, outcome.returncode)
            if attempt < max_restarts:
                attempt += 1
                output.message(f"{failure}; restarting the job (attempt {attempt}/{max_restarts})")
                continue
            restarts = f" after {attempt} restart(s)" if max_restarts else ""
            output.message(f"{failure}; stopped all workers, the job failed{restarts}")
            return finish(_tasks.exit_code(outcome.returncode), "the job failed")


def _check_ranks_filter(ranks: Sequence[int] | None, num_workers: int) -> frozenset | None:
    """The worker indices `--local-ranks-filter` shows, checked; None: all."""
    if ranks is None:
        return None
    ranks = list(ranks)
    bad = [r for r in ranks if isinstance(r, bool) or not isinstance(r, int) or not 0 <= r < num_workers]
    if not ranks or bad:
        raise ValueError(
            f"--local-ranks-filter must name worker indices from 0 to {num_workers - 1} "
            f"(comma-separated, e.g. 0 or 0,1), got {ranks!r}"
        )
    return frozenset(ranks)


def _ranks(text: str) -> list[int]:
    try:
        return [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not comma-separated worker indices: {text!r}") from None


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
    parser.add_argument("-n", "--num-workers", "--workers", "--nproc-per-node", "--nproc_per_node",
                        dest="num_workers", type=int, required=True,
                        metavar="N", help="number of worker processes (>= 1; --nproc-per-node: torchrun's "
                        "spelling, this one host's processes)")
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
    parser.add_argument("--log-dir", default=None, metavar="DIR",
                        help="also write each process's output to DIR/<task>.log "
                        "(worker0.log, ...; default: none)")
    parser.add_argument("--local-ranks-filter", type=_ranks, default=None, metavar="RANKS",
                        help="show only these workers' output on the console (comma-separated "
                        "indices, e.g. 0 or 0,2; torchrun's option); the others' goes to "
                        "--log-dir, and a failing worker's last lines are still reported "
                        "(default: every worker)")
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


#: torchrun's options for jobs over several hosts, which keras-dist launch
#: (the workers of one host, on free loopback ports) does not take.
_TORCHRUN_ONLY = ("--node-rank", "--master-addr", "--master-port", "--rdzv-endpoint", "--rdzv-backend",
                  "--rdzv-id", "--rdzv-conf", "--max-nodes")


#: keras-dist launch's own options that take a value.
_TAKES_A_VALUE = ("-n", "--num-workers", "--workers", "--nproc-per-node", "--ps", "--backend", "--max-restarts",
                  "--timeout", "--max-time", "--log-dir", "--local-ranks-filter", "--host")


def _torchrun_options(parser, argv: list) -> list:
    """torchrun's one-host spellings before the script: `--standalone` and
    `--nnodes 1` (what keras-dist launch does) are taken; its multi-host
    options are one usage error naming torchrun."""
    out = []
    arguments = iter(argv)
    for argument in arguments:
        if not argument.startswith("-"):  # the script: the rest is the script's
            out.append(argument)
            out.extend(arguments)
            break
        name, has_value, value = argument.partition("=")
        spelling = name.replace("_", "-")
        if spelling == "--standalone":
            continue
        if spelling == "--nnodes":
            value = value if has_value else next(arguments, "")
            if value.strip() not in ("1", "1:1"):
                parser.error(f"--nnodes {value}: keras-dist launch starts the workers of one host. For several "
                             "hosts run torchrun itself on each (keras_dist reads torchrun's variables), or set "
                             "TF_CONFIG per host.")
            continue
        if spelling in _TAKES_A_VALUE and not has_value:  # its value is not the script
            out.append(argument)
            out.append(next(arguments, ""))
            continue
        if spelling in _TORCHRUN_ONLY:
            parser.error(f"{name} is torchrun's option for jobs over several hosts: keras-dist launch starts the "
                         "workers of one host on free loopback ports. Run torchrun itself for that (keras_dist "
                         "reads torchrun's variables).")
        out.append(argument)
    return out


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
        argv = _torchrun_options(parser, argv)
        options = parser.parse_args(argv)
        try:
            _validate(options.script, options.args, options.num_workers, options.backend,
                      options.max_restarts, options.timeout, options.max_time)
            if options.ps < 0:
                raise ValueError(f"--ps must be >= 0, got {options.ps}")
            _check_ranks_filter(options.local_ranks_filter, options.num_workers)
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
        log_dir=options.log_dir,
        local_ranks_filter=options.local_ranks_filter,
    )


def cli() -> None:
    """Entry point of the `keras-dist` console script."""
    sys.exit(main())


if __name__ == "__main__":
    cli()
