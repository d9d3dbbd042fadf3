"""Cost of exactly-once parameter-server writes on TensorFlow: the same
scheduled SGD step through keras_dist's coordinator (each write to a ps
variable gated by the function's id) and through tf's own
`ClusterCoordinator.schedule` (tf's at-least-once), side by side in one
job of 2 workers and 2 ps tasks, alternating rounds.

    python benchmarks/parameter_server.py            # make bench
    python benchmarks/parameter_server.py --quick    # a tiny run (tests)

Needs tensorflow. Writes benchmarks/results/parameter_server.json and
benchmarks/PARAMETER_SERVER.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import subprocess
import sys
import tempfile

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _report import write_report  # noqa: E402


def run_job(width: int, steps: int, rounds: int, workers: int = 2, ps: int = 2) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        out = pathlib.Path(tmp) / "report.json"
        env = dict(os.environ, KERAS_BACKEND="tensorflow", TF_CPP_MIN_LOG_LEVEL="3",
                   PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
        command = [
            sys.executable, "-m", "keras_dist.launch", "--workers", str(workers), "--ps", str(ps),
            "--timeout", "120", "--max-time", "500", str(HERE / "_ps_worker.py"),
            str(out), str(steps), str(rounds), str(width),
        ]
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=560)
        if done.returncode != 0:
            raise RuntimeError(f"the job failed: {(done.stdout + done.stderr)[-2000:]}")
        return json.loads(out.read_text())


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--widths", nargs="+", type=int, default=[32, 512])
    parser.add_argument("--steps", type=int, default=100, help="scheduled steps per round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    args = parser.parse_args(argv)
    if args.quick:
        args.widths, args.steps, args.rounds = [32], 10, 1
    rows = []
    for width in args.widths:
        report = run_job(width, args.steps, args.rounds)
        print(json.dumps(report), flush=True)
        native = report["step_s"]["tf ClusterCoordinator (at least once)"]
        for path, step_s in report["step_s"].items():
            rows.append({
                "width": width, "parameters": report["parameters"], "path": path, "step_s": step_s,
                "vs_tf": step_s / native, "scheduled": report["scheduled"], "counted": report["counted"],
            })
    write_report(
        args.output, "parameter_server", rows,
        intro=[
            "# Parameter servers on TensorFlow: exactly-once writes vs tf's coordinator",
            "",
            "MLP 64-W-W-10, batch 64 per step, SGD; 2 workers + 2 ps (local processes on",
            f"this machine); {args.steps} scheduled steps per round, {args.rounds} rounds alternating the",
            "two paths, median seconds per step (scheduling to join). Both paths run the",
            "same tf.function. Written by `benchmarks/parameter_server.py`.",
        ],
        columns=[
            ("W", lambda r: f"{r['width']}"),
            ("parameters", lambda r: f"{r['parameters']}"),
            ("path", lambda r: r["path"]),
            ("step (ms)", lambda r: f"{1000 * r['step_s']:.2f}"),
            ("vs tf", lambda r: f"{r['vs_tf']:.2f}x"),
            ("steps counted / scheduled", lambda r: f"{r['counted']} / {r['scheduled']}"),
        ],
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
