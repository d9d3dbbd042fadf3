"""The torch backend beside the paths a torch user has: plain Keras on torch
(one process) and a hand-written `DistributedDataParallel` of the same MLP.

MLPs 784-H-H-10 (two sizes), SGD, a fixed batch per process (weak scaling),
1, 2 and 4 processes, process i pinned to core i modulo the cores (gloo on
CPU; on a 2-core machine 4 processes share them). Jobs alternate (for each
model: keras_dist and DDP at each process count, plain Keras at one) over
`--rounds`; each reports the median epoch time after a warm-up epoch.
Ratios: keras_dist / DDP at each process count (the overhead of Keras plus
keras_dist over torch alone), keras_dist / plain Keras at one process
(keras_dist's own overhead), and each path's efficiency (one process's
step time over N processes', N times the rows: 1.0 is perfect).

    python benchmarks/torch_ddp.py            # make bench (where torch is installed)
    python benchmarks/torch_ddp.py --quick    # a tiny run (tests)

Writes benchmarks/results/torch_ddp.json and benchmarks/TORCH_DDP.md.
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from _report import write_report  # noqa: E402
from weak_scaling import run_job  # noqa: E402


def _pairs(text):
    return [tuple(int(part) for part in pair.split(":")) for pair in text.split(",")]


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--models", type=_pairs, default=_pairs("256:128,512:256"),
                        help="HIDDEN:ROWS_PER_PROCESS pairs: the MLP's hidden width and each process's batch")
    parser.add_argument("--processes", type=lambda t: [int(n) for n in t.split(",")], default=[1, 2, 4])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.repeats, args.models, args.processes = 1, 3, 1, [(64, 32)], [1, 2]
    jobs = [
        (hidden, rows, mode, n)
        for hidden, rows in args.models
        for n in args.processes
        for mode in (("keras_dist", "ddp", "keras") if n == 1 else ("keras_dist", "ddp"))
    ]
    samples = {job: [] for job in jobs}
    torch_version = None
    for _ in range(args.rounds):
        for hidden, rows, mode, n in jobs:
            result = run_job(mode, n, rows, args.steps, args.repeats, timeout=600, script="_torch_worker.py",
                             extra=(hidden,))
            samples[(hidden, rows, mode, n)].append(result["step_ms"])
            torch_version = result["torch"]
            print(result, flush=True)
    ms = {job: statistics.median(values) for job, values in samples.items()}
    table = []
    for hidden, rows in args.models:
        for n in args.processes:
            ours, ddp = ms[(hidden, rows, "keras_dist", n)], ms[(hidden, rows, "ddp", n)]
            one = n == 1
            table.append({
                "model": f"784-{hidden}-{hidden}-10",
                "per_process_batch": rows,
                "processes": n,
                "keras_dist_step_ms": ours,
                "ddp_step_ms": ddp,
                "plain_keras_step_ms": ms[(hidden, rows, "keras", 1)] if one else None,
                "keras_dist_over_ddp": ours / ddp,
                "keras_dist_over_plain_keras": ours / ms[(hidden, rows, "keras", 1)] if one else None,
                # weak scaling: n times the rows in the same time would be 1.0
                "keras_dist_efficiency": None if one else ms[(hidden, rows, "keras_dist", 1)] / ours,
                "ddp_efficiency": None if one else ms[(hidden, rows, "ddp", 1)] / ddp,
                "rounds": args.rounds,
                "torch": torch_version,
            })

    def fmt(value, pattern):
        return "" if value is None else pattern.format(value)

    write_report(
        args.output, "torch_ddp", table,
        intro=[
            "# The torch backend beside plain Keras and hand-written DistributedDataParallel",
            "",
            f"MLPs 784-H-H-10, SGD, a fixed batch per process, {', '.join(map(str, args.processes))} processes "
            "(gloo, process i pinned to core i modulo the cores),",
            f"torch {torch_version}; median step time of {args.rounds} interleaved rounds, each the median of",
            f"{args.repeats} epochs of {args.steps} steps after a warm-up epoch. keras_dist and DDP sum the same",
            "gradients over the same processes (keras_dist: bucketed asynchronous all-reduces launched as backward",
            "produces the gradients, as DDP's reducer); plain Keras is one process, no strategy. Efficiency: one",
            "process's step time over N processes' (N times the rows; 1.0 is perfect).",
            "Written by `benchmarks/torch_ddp.py`.",
        ],
        columns=[
            ("model", lambda r: r["model"]),
            ("rows per process", lambda r: str(r["per_process_batch"])),
            ("processes", lambda r: str(r["processes"])),
            ("keras_dist (ms/step)", lambda r: f"{r['keras_dist_step_ms']:.2f}"),
            ("DDP (ms/step)", lambda r: f"{r['ddp_step_ms']:.2f}"),
            ("plain Keras (ms/step)", lambda r: fmt(r["plain_keras_step_ms"], "{:.2f}")),
            ("keras_dist / DDP", lambda r: f"{r['keras_dist_over_ddp']:.2f}"),
            ("keras_dist / plain Keras", lambda r: fmt(r["keras_dist_over_plain_keras"], "{:.2f}")),
            ("efficiency keras_dist / DDP", lambda r: fmt(r["keras_dist_efficiency"], "{:.2f}")
             + ("" if r["ddp_efficiency"] is None else f" / {r['ddp_efficiency']:.2f}")),
        ],
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
