"""P3: multi-worker weak scaling with MultiWorkerMirroredStrategy.

One worker process, then two, each pinned to its own CPU core with one
(simulated) device, the per-worker batch fixed (MLP 784-512-512-10, 256
rows per worker): the two-worker job should reach >= 0.9 x twice the
one-worker throughput. Jobs alternate (1, 2, 1, 2, ...) over `--rounds`;
each reports the median epoch time after a compiling warm-up epoch.

    python benchmarks/weak_scaling.py               # both backends (make bench)
    python benchmarks/weak_scaling.py --quick       # a tiny run (tests)

Writes benchmarks/results/weak_scaling.json and benchmarks/WEAK_SCALING.md.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from _report import write_report  # noqa: E402
from keras_dist.launch import free_ports  # noqa: E402


def run_job(backend, workers, batch, steps, repeats, timeout, script="_weak_worker.py", extra=()):
    """Starts `workers` processes of `script` (argv: BACKEND BATCH STEPS
    REPEATS *extra), worker i pinned to core i; the chief's last line."""
    ports = free_ports(workers + 1)
    cluster = {"worker": [f"127.0.0.1:{p}" for p in ports[:workers]]}
    cores = sorted(os.sched_getaffinity(0))
    processes = []
    try:
        for index in range(workers):
            env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=str(ROOT))
            env.pop("TF_CONFIG", None)
            if workers > 1:
                env["TF_CONFIG"] = json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}})
                env["KERAS_DIST_COORDINATOR"] = f"127.0.0.1:{ports[-1]}"
            core = {cores[index % len(cores)]}
            processes.append(subprocess.Popen(
                [sys.executable, str(HERE / script), backend, str(batch), str(steps), str(repeats), *map(str, extra)],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                preexec_fn=lambda core=core: os.sched_setaffinity(0, core),
            ))
        outputs = [p.communicate(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
    for p, (out, err) in zip(processes, outputs):
        if p.returncode != 0:
            raise RuntimeError(f"{backend} {workers}-worker job failed:\n{err[-3000:]}")
    return json.loads(outputs[0][0].strip().splitlines()[-1])


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "tensorflow"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="rows per worker")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.repeats, args.batch = 1, 3, 1, 32
    rows = []
    for backend in args.backends:
        samples = {1: [], 2: []}
        for _ in range(args.rounds):
            for workers in (1, 2):
                result = run_job(backend, workers, args.batch, args.steps, args.repeats, timeout=600)
                samples[workers].append(result["samples_per_second"])
                if workers == 2:
                    idle = result["gloo_event_loops_idle"]
                print(json.dumps(result), flush=True)
        one, two = statistics.median(samples[1]), statistics.median(samples[2])
        rows.append({
            "backend": backend,
            "per_worker_batch": args.batch,
            "one_worker_samples_per_second": one,
            "two_workers_samples_per_second": two,
            "efficiency": two / (2 * one),
            "rounds": args.rounds,
            "gloo_event_loops_idle": idle,
        })
    write_report(
        args.output, "weak_scaling", rows,
        intro=[
            "# Weak scaling (P3): MultiWorkerMirroredStrategy, 1 vs 2 workers",
            "",
            f"MLP 784-512-512-10, {args.batch} rows per worker, each worker one process pinned to",
            f"its own core with one device; median of {args.rounds} interleaved rounds. Target:",
            "efficiency = two-worker throughput / (2 x one-worker throughput) >= 0.9.",
            "Written by `benchmarks/weak_scaling.py`.",
        ],
        columns=[
            ("backend", lambda r: r["backend"]),
            ("1 worker (samples/s)", lambda r: f"{r['one_worker_samples_per_second']:.0f}"),
            ("2 workers (samples/s)", lambda r: f"{r['two_workers_samples_per_second']:.0f}"),
            ("efficiency", lambda r: f"{r['efficiency']:.2f}"),
        ],
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
