"""The torch backend beside the paths a torch user has: plain Keras on torch
(one process) and a hand-written `DistributedDataParallel` of the same MLP.

MLP 784-512-512-10, SGD, a fixed batch per process (weak scaling), 1 and 2
processes, each pinned to its own core (gloo on CPU). Jobs alternate
(keras_dist, DDP, plain Keras) over `--rounds`; each reports the median epoch
time after a warm-up epoch. Ratios: keras_dist / DDP at each process count
(the overhead of Keras plus keras_dist over torch alone), keras_dist /
plain Keras at one process (keras_dist's own overhead), and each path's
two-process efficiency.

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


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--batch", type=int, default=256, help="rows per process")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.steps, args.repeats, args.batch = 1, 3, 1, 32
    jobs = [("keras_dist", 1), ("ddp", 1), ("keras", 1), ("keras_dist", 2), ("ddp", 2)]
    samples = {job: [] for job in jobs}
    torch_version = None
    for _ in range(args.rounds):
        for mode, workers in jobs:
            result = run_job(mode, workers, args.batch, args.steps, args.repeats, timeout=600, script="_torch_worker.py")
            samples[(mode, workers)].append(result["step_ms"])
            torch_version = result["torch"]
            print(result, flush=True)
    ms = {job: statistics.median(values) for job, values in samples.items()}
    rows = []
    for workers in (1, 2):
        rows.append({
            "processes": workers,
            "keras_dist_step_ms": ms[("keras_dist", workers)],
            "ddp_step_ms": ms[("ddp", workers)],
            "plain_keras_step_ms": ms[("keras", 1)] if workers == 1 else None,
            "keras_dist_over_ddp": ms[("keras_dist", workers)] / ms[("ddp", workers)],
            "keras_dist_over_plain_keras": ms[("keras_dist", 1)] / ms[("keras", 1)] if workers == 1 else None,
            # weak scaling: twice the rows in the same time would be 1.0
            "keras_dist_efficiency": ms[("keras_dist", 1)] / ms[("keras_dist", 2)] if workers == 2 else None,
            "ddp_efficiency": ms[("ddp", 1)] / ms[("ddp", 2)] if workers == 2 else None,
            "per_process_batch": args.batch,
            "rounds": args.rounds,
            "torch": torch_version,
        })

    def fmt(value, pattern):
        return "" if value is None else pattern.format(value)

    write_report(
        args.output, "torch_ddp", rows,
        intro=[
            "# The torch backend beside plain Keras and hand-written DistributedDataParallel",
            "",
            f"MLP 784-512-512-10, SGD, {args.batch} rows per process, 1 and 2 processes (gloo, one core each),",
            f"torch {torch_version}; median step time of {args.rounds} interleaved rounds, each the median of",
            f"{args.repeats} epochs of {args.steps} steps after a warm-up epoch. keras_dist and DDP sum the same",
            "gradients over the same processes; plain Keras is one process, no strategy.",
            "Written by `benchmarks/torch_ddp.py`.",
        ],
        columns=[
            ("processes", lambda r: str(r["processes"])),
            ("keras_dist (ms/step)", lambda r: f"{r['keras_dist_step_ms']:.2f}"),
            ("DDP (ms/step)", lambda r: f"{r['ddp_step_ms']:.2f}"),
            ("plain Keras (ms/step)", lambda r: fmt(r["plain_keras_step_ms"], "{:.2f}")),
            ("keras_dist / DDP", lambda r: f"{r['keras_dist_over_ddp']:.2f}"),
            ("keras_dist / plain Keras", lambda r: fmt(r["keras_dist_over_plain_keras"], "{:.2f}")),
            ("2-process efficiency keras_dist / DDP", lambda r: fmt(r["keras_dist_efficiency"], "{:.2f}")
             + ("" if r["ddp_efficiency"] is None else f" / {r['ddp_efficiency']:.2f}")),
        ],
        quick=args.quick,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
