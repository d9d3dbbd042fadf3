"""Cost of per-worker tf.data input (AutoShardPolicy FILE / OFF) against
sharding by data (DATA) and plain Keras on one device, in one 2-worker job.

With DATA every worker reads every global batch and keeps its replicas'
rows; with FILE each reads its own files and each step all-gathers the
workers' rows (two collectives and the rows); with OFF each reads every
file. Each worker is one process pinned to its own core with one device;
steps are timed after a compiling epoch (median over epochs).

    python benchmarks/per_worker_input.py               # both backends (make bench)
    python benchmarks/per_worker_input.py --quick       # a tiny run (tests)

Needs tensorflow (tf.data), on JAX too. Writes
benchmarks/results/per_worker_input.json and benchmarks/PER_WORKER_INPUT.md.
"""

from __future__ import annotations

import argparse
import json
import pathlib
import sys
import tempfile

import numpy as np

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import write_report  # noqa: E402
from weak_scaling import run_job  # noqa: E402


def write_parts(directory: pathlib.Path, rows: int, parts: int = 8, features: int = 64) -> None:
    rng = np.random.default_rng(0)
    for part in range(parts):
        x = rng.normal(size=(rows // parts, features))
        y = rng.integers(0, 10, size=rows // parts)
        lines = [",".join(f"{v:.4f}" for v in row) + f",{label}" for row, label in zip(x, y)]
        (directory / f"part-{part}.csv").write_text("\n".join(lines) + "\n")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", nargs="+", default=["jax", "tensorflow"])
    parser.add_argument("--steps", type=int, default=30, help="global batches per epoch (DATA)")
    parser.add_argument("--repeats", type=int, default=3, help="timed epochs")
    parser.add_argument("--batch", type=int, default=256, help="global batch")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.batch = 4, 1, 32
    rows = []
    with tempfile.TemporaryDirectory() as data_dir:
        write_parts(pathlib.Path(data_dir), args.batch * args.steps)
        for backend in args.backends:
            result = run_job(backend, 2, args.batch, args.steps, args.repeats, timeout=600, script="_input_worker.py", extra=[data_dir])
            print(json.dumps(result), flush=True)
            anchor, data = result["plain_keras"]["step_s"], result["DATA"]["step_s"]
            for policy in ("DATA", "FILE", "OFF"):
                row = result[policy]
                rows.append({
                    "backend": backend,
                    "input": policy,
                    "global_batch": args.batch,
                    "step_s": row["step_s"],
                    "steps_per_epoch": row["steps_per_epoch"],
                    "vs_data": row["step_s"] / data,
                    "vs_plain_keras": row["step_s"] / anchor,
                })
            rows.append({
                "backend": backend, "input": "plain Keras, one device", "global_batch": args.batch,
                "step_s": anchor, "steps_per_epoch": result["plain_keras"]["steps_per_epoch"],
                "vs_data": anchor / data, "vs_plain_keras": 1.0,
            })
    write_report(
        args.output, "per_worker_input", rows,
        intro=[
            "# Per-worker tf.data input: 2 workers, one device each",
            "",
            f"MLP 64-256-256-10, global batch {args.batch}, {args.steps} global batches of data in 8",
            "CSV files. Step time after a compiling epoch (median over epochs), both",
            "workers pinned to their own core; plain Keras on one device in the same",
            "processes. FILE and OFF steps all-gather the workers' rows; OFF reads",
            "every file on every worker (twice the steps). Written by",
            "`benchmarks/per_worker_input.py`.",
        ],
        columns=[
            ("backend", lambda r: r["backend"]),
            ("input", lambda r: r["input"]),
            ("step (ms)", lambda r: f"{1000 * r['step_s']:.2f}"),
            ("steps/epoch", lambda r: f"{r['steps_per_epoch']}"),
            ("vs DATA", lambda r: f"{r['vs_data']:.2f}x"),
            ("vs plain Keras", lambda r: f"{r['vs_plain_keras']:.2f}x"),
        ],
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
