"""`keras-dist launch`: local multi-worker jobs. The workers here are tiny
scripts (no Keras), each run under a timeout; every test checks that no
worker (nor a worker's child) is left running."""

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from keras_dist import launch as launch_module

pytestmark = pytest.mark.starts_processes  # worker processes, launched jobs

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# argv: out_dir mode. Writes pid-<index>-<attempt> first, then per mode.
WORKER = r"""
import json, os, subprocess, sys, time

out, mode = sys.argv[1], sys.argv[2]
index = int(os.environ["KERAS_DIST_WORKER_INDEX"])
num_workers = int(os.environ["KERAS_DIST_NUM_WORKERS"])
attempt = os.environ["KERAS_DIST_RESTART"]


def write(name, text):
    tmp = os.path.join(out, name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
    os.replace(tmp, os.path.join(out, name))


def wait_for_all_pids():
    names = [f"pid-{i}-{attempt}" for i in range(num_workers)]
    end = time.time() + 20
    while time.time() < end and not all(os.path.exists(os.path.join(out, n)) for n in names):
        time.sleep(0.02)


write(f"pid-{index}-{attempt}", str(os.getpid()))
if mode == "env":
    keys = ["TF_CONFIG", "KERAS_DIST_COORDINATOR", "KERAS_DIST_NUM_WORKERS",
            "KERAS_DIST_WORKER_INDEX", "KERAS_DIST_RESTART", "KERAS_BACKEND"]
    write(f"env-{index}.json", json.dumps({k: os.environ.get(k) for k in keys}))
    print(f"hello from {index}", sys.argv[3:])
    print(f"complaint from {index}", file=sys.stderr)
    sys.stdout.write("unterminated")
elif mode == "fail":  # the last worker fails once all have started
    if index == num_workers - 1:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
        write("grandchild", str(child.pid))
        wait_for_all_pids()
        print("failing now", flush=True)
        sys.exit(3)
    time.sleep(60)
elif mode == "fail-first":  # worker 0 fails on the first attempt only
    if attempt == "0":
        if index == 0:
            wait_for_all_pids()
            sys.exit(5)
        time.sleep(60)
    print(f"attempt {attempt} ok")
elif mode == "sleep":
    time.sleep(60)
elif mode == "join":  # worker 0 joins at once; worker 1 is slow to start joining, then slow to join
    from keras_dist import _heartbeat
    if index == 1:
        time.sleep(1.5)
    _heartbeat.mark_join("joining")
    time.sleep(1.5 if index == 1 else 0)
    _heartbeat.mark_join("joined")
    time.sleep(0.5)
elif mode == "talk":  # prints a line every 0.3 s for 4.5 s, then succeeds
    for _ in range(15):
        print("still here", flush=True)
        time.sleep(0.3)
elif mode == "beat":  # silent, but beats through keras_dist for 4 s
    from keras_dist import _heartbeat
    _heartbeat.INTERVAL_SECONDS = 0.2
    end = time.time() + 4
    while time.time() < end:
        _heartbeat.beat()
        time.sleep(0.05)
elif mode == "raise":  # the last worker raises once all have started; keras_dist imported
    import keras_dist  # noqa: F401 - under the launcher it records the traceback
    if index == num_workers - 1:
        wait_for_all_pids()
        def read_rows():
            raise ValueError("bad row 7 in the input")
        read_rows()
    time.sleep(60)
elif mode == "noise":  # the engines' notices that no setting turns off, then a real warning
    sys.stderr.write("WARNING: All log messages before absl::InitializeLog() is called are written to STDERR\n")
    sys.stderr.write("I0000 00:00:1795692632.346185   21962 port.cc:153] oneDNN custom operations are on. "
                     "You may see slightly different numerical results.\n")
    sys.stderr.write("I1126 10:28:49.955798   19099 coordination_service.cc:1472] Barrier passed\n")
    sys.stderr.write("W0000 00:00:1795699294.809815   18676 local_rendezvous.cc:412] Local rendezvous is aborting "
                     "with status: ABORTED: Cleanup -1609212153637053463 "
                     "[type.googleapis.com/tensorflow.DerivedStatus='']\n")  # a ps's torn-down step
    sys.stderr.write("W0000 00:00:1795699295.000001   18676 local_rendezvous.cc:412] Local rendezvous is aborting "
                     "with status: CANCELLED: worker 1 is gone\n")
    sys.stderr.write("W1126 10:28:50.000001   19099 collective_ops.cc:12] a warning that matters\n")
    print("work done", flush=True)
elif mode == "progress":  # Keras' own progress bar over 6 slow steps, then a line
    from keras.utils import Progbar
    bar = Progbar(6)
    for step in range(1, 7):
        time.sleep(0.4)
        bar.update(step)
    print("DONE", flush=True)
elif mode == "freeze":  # worker 0 stops itself; worker 1 waits, silent
    if index == 0:
        import signal
        os.kill(os.getpid(), signal.SIGSTOP)
    time.sleep(60)
"""


@pytest.fixture
def worker(tmp_path):
    path = tmp_path / "worker.py"
    path.write_text(WORKER)
    return path


def _env():
    return dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(p for p in [ROOT, os.environ.get("PYTHONPATH")] if p),
    )


def _launcher(*argv):
    return [sys.executable, "-m", "keras_dist.launch", *map(str, argv)]


def _run(*argv, timeout=60):
    start = time.monotonic()
    result = subprocess.run(
        _launcher(*argv), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout
    )
    return result, time.monotonic() - start


def _alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # an unreaped zombie (a reparented grandchild) is not running
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def _assert_all_gone(tmp_path):
    pids = [int(p.read_text()) for p in tmp_path.iterdir() if p.name.startswith("pid-")]
    grandchild = tmp_path / "grandchild"
    if grandchild.exists():
        pids.append(int(grandchild.read_text()))
    assert pids
    end = time.monotonic() + 5
    while time.monotonic() < end and any(_alive(p) for p in pids):
        time.sleep(0.05)
    assert not [p for p in pids if _alive(p)], "processes left running"


@pytest.mark.parametrize("num_workers", [2, 3])
def test_workers_get_tf_config_and_prefixed_output(tmp_path, worker, num_workers):
    result, _ = _run("-n", num_workers, worker, tmp_path, "env", "--flag", "-n", "7")
    assert result.returncode == 0, result.stdout + result.stderr
    envs = [json.loads((tmp_path / f"env-{i}.json").read_text()) for i in range(num_workers)]
    configs = [json.loads(e["TF_CONFIG"]) for e in envs]
    cluster = configs[0]["cluster"]
    assert list(cluster) == ["worker"] and len(cluster["worker"]) == num_workers
    hosts = {a.rsplit(":", 1)[0] for a in cluster["worker"]}
    ports = [int(a.rsplit(":", 1)[1]) for a in cluster["worker"]]
    assert hosts == {"127.0.0.1"} and len(set(ports)) == num_workers
    coordinator = envs[0]["KERAS_DIST_COORDINATOR"]
    assert coordinator.startswith("127.0.0.1:") and int(coordinator.split(":")[1]) not in ports
    for i, (env, config) in enumerate(zip(envs, configs)):
        assert config == {"cluster": cluster, "task": {"type": "worker", "index": i}}
        assert env["KERAS_DIST_COORDINATOR"] == coordinator
        assert env["KERAS_DIST_NUM_WORKERS"] == str(num_workers)
        assert env["KERAS_DIST_WORKER_INDEX"] == str(i)
        assert env["KERAS_DIST_RESTART"] == "0"
        assert env["KERAS_BACKEND"] == os.environ.get("KERAS_BACKEND")  # inherited
        # whole lines, prefixed, on the stream the worker wrote to
        assert f"[worker {i}] hello from {i} ['--flag', '-n', '7']\n" in result.stdout
        assert f"[worker {i}] unterminated\n" in result.stdout
        assert f"[worker {i}] complaint from {i}\n" in result.stderr
    assert not [l for l in result.stdout.splitlines() if not l.startswith("[worker ")]
    _assert_all_gone(tmp_path)


def test_backend_option_sets_keras_backend(tmp_path, worker):
    other = "tensorflow" if os.environ.get("KERAS_BACKEND") == "jax" else "jax"
    result, _ = _run("launch", "-n", 1, "--backend", other, worker, tmp_path, "env")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads((tmp_path / "env-0.json").read_text())["KERAS_BACKEND"] == other
    _assert_all_gone(tmp_path)


def test_failing_worker_stops_the_job(tmp_path, worker):
    result, elapsed = _run("-n", 2, worker, tmp_path, "fail", timeout=60)
    assert result.returncode == 3, result.stdout + result.stderr
    assert elapsed < 20  # the other worker sleeps 60 s: it was stopped
    assert "[worker 1] failing now" in result.stdout
    assert "worker 1 exited with code 3" in result.stderr
    assert "restarting" not in result.stderr
    _assert_all_gone(tmp_path)  # the failing worker's child too


def test_a_raising_worker_is_reported_with_its_traceback(tmp_path, worker):
    """torchrun's shape: which task failed first, its exception and the
    end of its traceback, then how every other task ended."""
    result, elapsed = _run("-n", 2, worker, tmp_path, "raise", timeout=60)
    err = result.stderr
    assert result.returncode == 1, result.stdout + err
    assert elapsed < 20
    assert "keras-dist launch: root cause (the first exception): worker 1 raised ValueError: " \
        "bad row 7 in the input (exit code 1)" in err, err
    report = [line for line in err.splitlines() if line.startswith("keras-dist launch:   | ")]
    assert report[-1] == "keras-dist launch:   | ValueError: bad row 7 in the input", err
    assert any("in read_rows" in line for line in report), err
    assert "keras-dist launch: when the launcher stopped the job: worker 0: running (stopped by the " \
        "launcher); worker 1: exit code 1" in err, err
    assert "keras-dist launch: worker 1 exited with code 1; stopped all workers, the job failed" in err
    assert re.search(r"keras-dist launch: the job failed: exit code 1 after \d+\.\d s$", err.strip()), err
    _assert_all_gone(tmp_path)


def test_local_ranks_filter_shows_only_those_workers_and_still_reports_a_hidden_failure(tmp_path, worker):
    """torchrun's `--local-ranks-filter`: the console shows the named
    workers' output; `--log-dir` keeps every worker's; a hidden worker
    that fails is still the root cause, with its traceback."""
    logs = tmp_path / "logs"
    result, _ = _run("-n", 2, "--local-ranks-filter", 1, "--log-dir", logs, worker, tmp_path, "env")
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[worker 1] hello from 1" in result.stdout and "[worker 1] complaint from 1" in result.stderr
    assert "[worker 0]" not in result.stdout + result.stderr
    assert "hello from 0" in (logs / "worker0.log").read_text()

    result, _ = _run("-n", 2, "--local-ranks-filter", 0, worker, tmp_path, "raise", timeout=60)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "[worker 1]" not in result.stdout
    assert "root cause (the first exception): worker 1 raised ValueError: bad row 7" in result.stderr
    assert "keras-dist launch:   | ValueError: bad row 7 in the input" in result.stderr
    _assert_all_gone(tmp_path)


def _launcher_line_kinds(text):
    """The launcher's own lines, reduced to their wording (no numbers,
    addresses, paths, exception texts or traceback lines)."""
    kinds = set()
    for line in text.splitlines():
        if line.startswith("keras-dist launch: ") and not line.startswith("keras-dist launch:   "):
            line = re.sub(r"raised .*? \(exit code", "raised X (exit code", line)
            line = re.sub(r"worker [\d.:, ]+;", "worker ADDRESSES;", line)
            kinds.add(re.sub(r"\d+(\.\d+)?", "N", line))
    return kinds


def test_the_guide_shows_the_launcher_s_real_failure_output(tmp_path, worker):
    """guides/multi_worker.md's failure sample has the lines the launcher
    prints for a failed job, word for word but for numbers and names."""
    guide = open(os.path.join(ROOT, "guides", "multi_worker.md")).read()
    sample = guide.split("<!-- launcher-failure-output -->\n```text\n", 1)[1].split("```", 1)[0]
    result, _ = _run("-n", 2, "--backend", "jax", worker, tmp_path, "raise", timeout=60)
    assert result.returncode == 1
    real = _launcher_line_kinds(result.stderr)
    real.discard(next(k for k in real if k.startswith("keras-dist launch: when the launcher stopped")))
    shown = _launcher_line_kinds(sample)
    shown.discard(next(k for k in shown if k.startswith("keras-dist launch: when the launcher stopped")))
    # This worker makes no strategy, so it joins no cluster: the sample's
    # join line is checked against a real job's in test_multi_worker.py
    # (test_example_through_the_launcher).
    shown.discard(JOINED_KIND)
    assert shown == real, (shown ^ real)


JOINED_KIND = "keras-dist launch: every worker joined the cluster after N s"


def test_the_launcher_names_the_workers_still_joining(tmp_path, worker, monkeypatch, capfd):
    """While some workers are joining the cluster, the launcher says whom
    it waits for (every JOIN_NOTICE_SECONDS), then that every worker joined;
    a script that never joins gets neither line."""
    from keras_dist import launch as launcher

    monkeypatch.setattr(launcher, "JOIN_NOTICE_SECONDS", 0.5)
    monkeypatch.setenv("PYTHONPATH", _env()["PYTHONPATH"])
    code = launcher.launch(worker, [tmp_path, "join"], num_workers=2)
    err = capfd.readouterr().err
    assert code == 0, err
    waiting = [line for line in err.splitlines() if "joining the cluster:" in line]
    assert waiting and all(
        re.fullmatch(r"keras-dist launch: joining the cluster: 1 of 2 workers joined after \d+ s; "
                     r"waiting for worker 1 \((joining|not started joining)\)", line) for line in waiting
    ), err
    assert "waiting for worker 1 (joining)" in err, err
    (joined,) = [line for line in err.splitlines() if "every worker joined" in line]
    assert _launcher_line_kinds(joined) == {JOINED_KIND}
    assert err.index(waiting[-1]) < err.index(joined)

    code = launcher.launch(worker, [tmp_path, "talk"], num_workers=2)
    err = capfd.readouterr().err
    assert code == 0 and "join" not in err, err


def test_start_line_and_end_summary(tmp_path, worker):
    result, _ = _run("-n", 2, "--backend", "jax", worker, tmp_path, "env")
    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert re.fullmatch(
        r"keras-dist launch: starting 2 workers \(backend jax\): worker 127\.0\.0\.1:\d+, "
        r"127\.0\.0\.1:\d+; coordinator 127\.0\.0\.1:\d+", lines[0]
    ), lines
    assert re.fullmatch(
        r"keras-dist launch: the job finished, every process exited 0: exit code 0 after \d+\.\d s", lines[-1]
    ), lines


def test_the_progress_bar_streams_and_log_dir_keeps_each_worker_s_output(tmp_path, worker):
    """Keras redraws its bar with "\\r" and no newline until the end: the
    launcher forwards each redraw to a terminal as it comes (here a
    pseudo-terminal), not the whole bar at the end; into a pipe, only the
    finished line, as plain text."""
    import pty

    logs = tmp_path / "logs"
    controller, terminal = pty.openpty()
    process = subprocess.Popen(
        _launcher("-n", 1, "--log-dir", logs, worker, tmp_path, "progress"),
        cwd=ROOT, env=_env(), stdout=terminal, stderr=subprocess.PIPE,
    )
    os.close(terminal)
    arrivals = []  # (time, bytes so far)
    received = b""
    try:
        while True:
            try:
                chunk = os.read(controller, 65536)
            except OSError:  # the launcher closed the terminal
                break
            if not chunk:
                break
            received += chunk
            arrivals.append((time.monotonic(), received))
        assert process.wait(timeout=60) == 0, process.stderr.read()
    finally:
        os.close(controller)
        if process.poll() is None:
            process.kill()
            process.wait()
    received = received.replace(b"\r\n", b"\n")  # the terminal's own line endings
    done_at = next(t for t, so_far in arrivals if b"DONE" in so_far)
    first_bar_at = next(t for t, so_far in arrivals if b"/6" in so_far)
    assert done_at - first_bar_at > 1.0, received  # 4 of 6 updates came before the end
    assert b"[worker 0] \x1b[1m2/6\x1b[0m" in received and b"\r" in received, received
    assert b"\b" not in received, received
    assert b"[worker 0] DONE\n" in received
    log = (logs / "worker0.log").read_bytes()  # unprefixed, as the worker wrote it
    assert log.endswith(b"DONE\n") and b"\b" in log and b"[worker 0]" not in log, log
    piped = subprocess.run(_launcher("-n", 1, worker, tmp_path, "progress"), cwd=ROOT, env=_env(),
                           capture_output=True, timeout=60)
    assert piped.returncode == 0, piped.stderr
    assert b"\x1b" not in piped.stdout and b"\r" not in piped.stdout, piped.stdout
    assert b"[worker 0] 6/6" in piped.stdout and b"[worker 0] DONE\n" in piped.stdout, piped.stdout


def test_a_parameter_server_job_s_failing_script_is_called_the_chief(tmp_path):
    """The script of a parameter-server job runs as the `chief` task: the
    launcher names it so (it said "worker 0"). On JAX the job has no server
    processes, so this costs one small process."""
    script = tmp_path / "chief.py"
    script.write_text("import json, os, sys\n"
                      "assert json.loads(os.environ['TF_CONFIG'])['task']['type'] == 'chief'\n"
                      "sys.exit(3)\n")
    result, _ = _run("--workers", 2, "--ps", 1, "--backend", "jax", script)
    assert result.returncode == 3, result.stderr
    assert "keras-dist launch: chief exited with code 3; stopped all workers, the job failed" in result.stderr
    assert "worker 0" not in result.stderr
    assert re.match(r"keras-dist launch: starting 1 chief, 2 workers, 1 ps \(backend jax; the worker and ps "
                    r"tasks are the strategy's Ray actors, no process here\): chief "
                    r"127\.0\.0\.1:\d+; worker 127\.0\.0\.1:\d+, 127\.0\.0\.1:\d+; ps 127\.0\.0\.1:\d+; "
                    r"coordinator", result.stderr), result.stderr


def test_engine_notices_are_dropped_from_the_console_but_kept_in_the_logs(tmp_path, worker):
    logs = tmp_path / "logs"
    result, _ = _run("-n", 1, "--log-dir", logs, worker, tmp_path, "noise")
    assert result.returncode == 0, result.stderr
    assert "absl::InitializeLog" not in result.stderr and "oneDNN" not in result.stderr
    assert "Barrier passed" not in result.stderr and "ABORTED: Cleanup" not in result.stderr
    assert "[worker 0] W0000 00:00:1795699295.000001   18676 local_rendezvous.cc:412] Local rendezvous is " \
           "aborting with status: CANCELLED: worker 1 is gone" in result.stderr
    assert "[worker 0] W1126 10:28:50.000001   19099 collective_ops.cc:12] a warning that matters" in result.stderr
    assert "[worker 0] work done" in result.stdout
    kept = (logs / "worker0.log").read_text()
    assert "oneDNN custom operations are on" in kept and "absl::InitializeLog" in kept and "ABORTED: Cleanup" in kept


def test_restart_after_failure(tmp_path, worker):
    result, elapsed = _run("-n", 2, "--max-restarts", 1, worker, tmp_path, "fail-first")
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed < 30
    assert (
        "keras-dist launch: worker 0 exited with code 5; restarting the job (attempt 1/1)"
        in result.stderr
    )
    assert "[worker 0] attempt 1 ok" in result.stdout
    assert "[worker 1] attempt 1 ok" in result.stdout
    assert "attempt 0 ok" not in result.stdout
    assert {p.name for p in tmp_path.glob("pid-*")} == {"pid-0-0", "pid-1-0", "pid-0-1", "pid-1-1"}
    _assert_all_gone(tmp_path)


def test_timeout_stops_a_job_that_makes_no_progress(tmp_path, worker):
    result, elapsed = _run("-n", 2, "--timeout", 3, worker, tmp_path, "sleep", timeout=60)
    assert result.returncode == 124, result.stdout + result.stderr
    assert elapsed < 15
    assert "no worker made progress" in result.stderr
    assert "worker 0: silent 3 s" in result.stderr and "worker 1: silent 3 s" in result.stderr
    _assert_all_gone(tmp_path)


def test_timeout_names_a_stopped_worker(tmp_path, worker):
    result, elapsed = _run("-n", 2, "--timeout", 3, worker, tmp_path, "freeze", timeout=60)
    assert result.returncode == 124, result.stdout + result.stderr
    assert "worker 0: silent 3 s, process stopped" in result.stderr, result.stderr
    assert "worker 1: silent 3 s, process waiting" in result.stderr, result.stderr
    _assert_all_gone(tmp_path)


@pytest.mark.parametrize("mode", ["talk", "beat"])
def test_output_or_heartbeats_keep_a_job_alive_past_the_timeout(tmp_path, worker, mode):
    result, elapsed = _run("-n", 2, "--timeout", 2, worker, tmp_path, mode, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    assert elapsed > 4
    _assert_all_gone(tmp_path)


def test_max_time_stops_a_job_that_makes_progress(tmp_path, worker):
    result, elapsed = _run("-n", 2, "--timeout", 2, "--max-time", 2, worker, tmp_path, "talk", timeout=60)
    assert result.returncode == 124, result.stdout + result.stderr
    assert elapsed < 4 + launch_module.GRACE_SECONDS
    assert "ran past --max-time 2 s" in result.stderr
    _assert_all_gone(tmp_path)


def test_sigterm_to_launcher_stops_workers(tmp_path, worker):
    process = subprocess.Popen(
        _launcher("-n", 2, worker, tmp_path, "sleep"),
        cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )
    try:
        end = time.monotonic() + 30
        while time.monotonic() < end and len(list(tmp_path.glob("pid-*"))) < 2:
            time.sleep(0.05)
        assert len(list(tmp_path.glob("pid-*"))) == 2
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=10)
    assert process.returncode == 128 + signal.SIGTERM
    assert "received SIGTERM" in err
    _assert_all_gone(tmp_path)


@pytest.mark.parametrize(
    "argv, message",
    [
        (["-n", "0", "{worker}"], "number of workers"),
        (["-n", "2", "{missing}"], "script not found"),
        (["-n", "2", "--max-restarts", "-1", "{worker}"], "max_restarts"),
        (["-n", "2", "--max-time", "0", "{worker}"], "--max-time"),
        (["-n", "2", "--backend", "mxnet", "{worker}"], "invalid choice"),
        (["launch", "{worker}"], "-n"),
        ([], "usage"),
        (["-n", "2", "--local-ranks-filter", "2", "{worker}"], "--local-ranks-filter must name worker indices from 0 to 1"),
        (["-n", "2", "--local-ranks-filter", "0,x", "{worker}"], "not comma-separated worker indices"),
    ],
)
def test_argument_errors_exit_2(tmp_path, worker, capsys, argv, message):
    argv = [a.format(worker=worker, missing=tmp_path / "missing.py") for a in argv]
    assert launch_module.main(argv) == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.glob("pid-*"))  # nothing started


def test_argument_error_from_command_line(tmp_path, worker):
    result, _ = _run("-n", 0, worker, tmp_path, "env", timeout=60)
    assert result.returncode == 2
    assert "usage:" in result.stderr and "number of workers" in result.stderr
    assert not list(tmp_path.glob("pid-*"))


def test_help_lists_launch(capsys):
    assert launch_module.main(["--help"]) == 0
    assert "launch" in capsys.readouterr().out
    assert launch_module.main(["launch", "--help"]) == 0
    assert "--max-restarts" in capsys.readouterr().out


def test_python_api_returns_exit_code(tmp_path, worker, capfd):
    env = _env()
    ok, failing = tmp_path / "ok", tmp_path / "failing"
    ok.mkdir(), failing.mkdir()
    assert launch_module.launch(worker, [ok, "env"], num_workers=2, env=env) == 0
    assert "[worker 1] hello from 1" in capfd.readouterr().out
    assert launch_module.launch(worker, [failing, "fail"], num_workers=2, env=env) == 3
    assert "worker 1 exited with code 3" in capfd.readouterr().err
    _assert_all_gone(ok)
    _assert_all_gone(failing)
    with pytest.raises(ValueError, match="number of workers"):
        launch_module.launch(worker, num_workers=0)
    with pytest.raises(ValueError, match="script not found"):
        launch_module.launch(tmp_path / "missing.py")


def test_free_ports():
    ports = launch_module.free_ports(4, "127.0.0.1")
    assert len(set(ports)) == 4 and all(0 < p < 65536 for p in ports)


def _without(tmp_path, package):
    """An environment in which `import <package>` fails as on an install
    without it (a stand-in package that raises ModuleNotFoundError shadows
    the real one), and KERAS_BACKEND is unset (Keras would default to
    TensorFlow)."""
    shadow = tmp_path / "shadow" / package
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text(f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / "shadow"), ROOT]))
    env.pop("KERAS_BACKEND", None)
    return env


@pytest.mark.parametrize("missing", ["tensorflow", "jax"])
def test_the_command_line_runs_without_the_other_backend(tmp_path, worker, missing):
    """`keras-dist --help` and `launch` import neither Keras nor a backend,
    so they run on a JAX-only or a TensorFlow-only install with
    KERAS_BACKEND unset."""
    env = _without(tmp_path, missing)
    cli = [sys.executable, "-m", "keras_dist.launch"]
    shown = subprocess.run([*cli, "--help"], env=env, capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0 and "launch" in shown.stdout, shown.stderr[-2000:]
    out = tmp_path / "out"
    out.mkdir()
    backend = "jax" if missing == "tensorflow" else "tensorflow"
    ran = subprocess.run(
        [*cli, "launch", "-n", "2", "--backend", backend, "--timeout", "60", str(worker), str(out), "env"],
        env=env, capture_output=True, text=True, timeout=120,
    )
    assert ran.returncode == 0, ran.stdout[-2000:] + ran.stderr[-2000:]
    assert json.loads((out / "env-1.json").read_text())["KERAS_BACKEND"] == backend
    _assert_all_gone(out)
    probe = "import sys, keras_dist; keras_dist.__version__; print('keras' in sys.modules)"
    imported = subprocess.run([sys.executable, "-c", probe], env=env, capture_output=True, text=True, timeout=60)
    assert imported.stdout.strip() == "False", imported.stderr[-2000:]


@pytest.mark.parametrize("spelling", [["--nproc-per-node", "2"], ["--nproc_per_node=2"], ["--standalone", "--nnodes", "1", "--nproc-per-node", "2"]])
def test_torchrun_s_one_host_spellings_are_taken(tmp_path, spelling):
    """A torchrun user's habits: the worker count as --nproc-per-node (or
    --nproc_per_node=N), --standalone and --nnodes 1 (one host: what
    keras-dist launch does)."""
    script = tmp_path / "count.py"
    script.write_text("import os; print('workers', os.environ['KERAS_DIST_NUM_WORKERS'])\n")
    done = subprocess.run([sys.executable, "-m", "keras_dist.launch", *spelling, "--timeout", "60", str(script)],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    assert done.stdout.count("workers 2") == 2, done.stdout


@pytest.mark.parametrize("spelling, named", [
    (["--nnodes", "2"], "--nnodes 2"),
    (["--master-port=29500"], "--master-port"),
    (["--rdzv_endpoint", "host:29400"], "--rdzv_endpoint"),
])
def test_torchrun_s_multi_host_options_are_one_usage_error(spelling, named, capsys):
    assert launch_module.main(["launch", "-n", "2", *spelling, "train.py"]) == 2
    error = capsys.readouterr().err
    assert named in error and "torchrun itself" in error
