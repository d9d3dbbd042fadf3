"""`keras-dist bench`: a tiny run on this process's backend, through the
command line (the training runs in a child process of its own, with its own
simulated devices), and its argument errors (nothing started)."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import BACKEND
from keras_dist import _bench, launch

ROOT = Path(__file__).resolve().parents[1]


def _env():
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(ROOT), env.get("PYTHONPATH")] if p)
    env.pop("KERAS_BACKEND", None)  # --backend decides
    return env


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND == "torch", reason="torch's replicas are processes: test_bench_on_torch_launches_a_job")
def test_bench_prints_the_scaling_report_and_writes_the_plot(tmp_path):
    plot = tmp_path / "bench.png"
    argv = ["bench", "--replicas", "2", "--backend", BACKEND, "--batch-size", "32", "--steps", "3",
            "--cross-device-ops", "hierarchical", "--num-packs", "0", "--plot", str(plot)]
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", *argv],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert f"keras-dist bench: mlp, 2 replica(s) (simulated CPU devices, strategy mirrored) on {BACKEND}" in out
    assert f"ScalingReport: 2 replica(s) on {BACKEND} (cpu:0, cpu:1, cross_device_ops=HierarchicalCopyAllReduce(num_packs=0))" in out
    assert re.search(r"global batch 32 \(16 per replica\), [23] timed steps", out), out
    assert "samples/s" in out and "one replica (measured, batch 16)" in out
    assert "Each replica gets only 16 examples per step" in out  # the small-batch hint
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--replicas", "0"], "must be >= 1"),
        (["--strategy", "none", "--replicas", "2"], "use --replicas 1"),
        (["--strategy", "one_device", "--replicas", "1", "--cross-device-ops", "nccl"], "needs --strategy mirrored"),
        (["--backend", "mxnet"], "invalid choice"),
        (["--backend", "torch", "--cross-device-ops", "nccl"], "on torch, torch.distributed reduces"),
        (["--backend", "torch", "--no-simulate"], "each replica is a process"),
        (["--num-packs", "-1"], "must be >= 0"),
    ],
)
def test_argument_errors_exit_2(argv, message, capsys, monkeypatch):
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail("started a run"))
    assert launch.main(["bench", *argv]) == 2
    assert message in capsys.readouterr().err


def test_help(capsys):
    assert launch.main(["--help"]) == 0
    assert "bench" in capsys.readouterr().out
    assert launch.main(["bench", "--help"]) == 0
    assert "--replicas" in capsys.readouterr().out


def test_child_command_carries_every_option():
    options = _bench.parser().parse_args(
        ["--replicas", "3", "--model", "cnn", "--batch-size", "12", "--steps", "4", "--plot", "p.png",
         "--no-reference", "--no-simulate", "--cross-device-ops", "one_device"]
    )
    again = _bench.parser().parse_args(_bench._child_argv(options))
    assert vars(again) == dict(vars(options), plot=os.path.abspath("p.png"))


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND != "torch", reason="the torch backend's bench (a launched job)")
def test_bench_on_torch_launches_a_job(tmp_path):
    """On torch a replica is a process: the one-replica reference runs in a
    child of its own (at the per-replica batch), then `keras-dist launch -n 2`
    trains under MultiWorkerMirroredStrategy and the chief prints the
    report with the speedup against it."""
    plot = tmp_path / "bench.png"
    argv = ["bench", "--replicas", "2", "--backend", "torch", "--batch-size", "32", "--steps", "3", "--plot", str(plot)]
    done = subprocess.run(
        [sys.executable, "-m", "keras_dist.launch", *argv],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    out = done.stdout
    assert "keras-dist bench: mlp, 2 replica(s) (processes, strategy mirrored) on torch" in out
    assert "[worker 0] ScalingReport: 2 replica(s) on torch (2 workers; this one: cpu:0)" in out
    assert "[worker 1] ScalingReport" not in out  # the chief reports
    assert re.search(r"global batch 32 \(16 per replica\), [23] timed steps", out), out
    assert re.search(r"one replica \(given, batch 16\): [\d,]+ samples/s -> speedup", out), out
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
