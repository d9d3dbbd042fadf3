"""keras-dist benchmark suite: step time against the native paths.

Every configuration runs in its own process (the backend and the number of
simulated devices are fixed per process). Configurations are interleaved
(A B A B ...) over `--rounds` rounds so that drift in machine load hits all
of them alike; each process reports the median of `--repeats` timed epochs
of `--steps` steps after a compiled warm-up step (the first step, with
compilation, is reported separately).

    python benchmarks/run.py                 # the full suite (make bench)
    python benchmarks/run.py --quick         # a tiny run (used by the tests)

Writes benchmarks/results/<stamp>.json, benchmarks/RESULTS.md and
benchmarks/results/step_time.png (if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import platform
import re
import statistics
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from _report import write_atomically  # noqa: E402

#: (impl, device counts) per backend; "keras" is the single-device anchor.
IMPLEMENTATIONS = {
    "jax": [("keras", [1]), ("one_device", [1]), ("mirrored", [1, 2, 4]), ("data_parallel", [2, 4])],
    "tensorflow": [("keras", [1]), ("one_device", [1]), ("mirrored", [1, 2, 4]), ("tf_mirrored", [2, 4])],
}


def configurations(backends, models, max_devices=4):
    for model in models:
        for backend in backends:
            for impl, counts in IMPLEMENTATIONS[backend]:
                for devices in counts:
                    if devices <= max_devices:
                        yield {"backend": backend, "impl": impl, "devices": devices, "model": model}


def run_one(config, steps, repeats, timeout, root=ROOT, device_kind="cpu"):
    """One configuration in its own process, with `root`'s worker and keras_dist."""
    command = [
        sys.executable,
        str(root / "benchmarks" / "_worker.py"),
        config["backend"],
        config["impl"],
        str(config["devices"]),
        config["model"],
        str(steps),
        str(repeats),
    ]
    # `root` first, the caller's PYTHONPATH after it (packages carried there)
    path = os.pathsep.join(p for p in (str(root), os.environ.get("PYTHONPATH", "")) if p)
    env = dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3", PYTHONPATH=path, KERAS_DIST_BENCH_DEVICE_KIND=device_kind)
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env)
    if done.returncode != 0:
        return dict(config, error=[error_line(done.stderr)])
    return json.loads(done.stdout.strip().splitlines()[-1])


def error_line(stderr: str) -> str:
    """The line of a failed run's stderr that says why it failed."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    for line in lines:  # an XLA/TF fatal check ("F1122 08:50:05 ... why")
        if re.match(r"F\d{4} ", line):
            return line
    for line in reversed(lines):  # else the last line that is not a stack frame
        if not line.startswith(("@", "***", "File ")):
            return line
    return "failed"


def machine():
    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "processor": platform.processor() or platform.machine(),
    }


def summarize(results):
    """Median over rounds of each configuration's step time."""
    grouped = {}
    for result in results:
        if "error" in result:
            continue
        key = (result["model"], result["backend"], result["impl"], result["devices"])
        grouped.setdefault(key, []).append(result)
    rows = []
    for (model, backend, impl, devices), runs in sorted(grouped.items()):
        step = statistics.median(r["step_s_median"] for r in runs)
        first = statistics.median(r["first_step_s"] for r in runs)
        rows.append(
            {"model": model, "backend": backend, "impl": impl, "devices": devices, "step_s": step, "first_step_s": first}
        )
    anchors = {(r["model"], r["backend"]): r["step_s"] for r in rows if r["impl"] == "keras"}
    for row in rows:
        anchor = anchors.get((row["model"], row["backend"]))
        row["vs_single_device"] = row["step_s"] / anchor if anchor else None
    return rows


def write_markdown(rows, results, meta, path):
    lines = [
        "# Benchmark results",
        "",
        f"Measured {meta['date']} on {meta['machine']['cpus']} CPU cores "
        f"({meta['machine']['processor']}, {meta['machine']['platform']}), "
        f"{'simulated CPU devices' if meta.get('device_kind', 'cpu') == 'cpu' else 'GPUs'}, "
        f"{meta['steps']} steps x {meta['repeats']} timed epochs per process, {meta['rounds']} interleaved rounds. "
        f"`vs 1 device` = step time / plain Keras on one device, same backend, same run.",
        "",
        "| model | backend | implementation | devices | step (ms) | vs 1 device | first step incl. compile (s) |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        ratio = f"{row['vs_single_device']:.2f}x" if row["vs_single_device"] else "-"
        lines.append(
            f"| {row['model']} | {row['backend']} | {row['impl']} | {row['devices']} | "
            f"{row['step_s'] * 1e3:.2f} | {ratio} | {row['first_step_s']:.2f} |"
        )
    errors = [r for r in results if "error" in r]
    if errors:
        lines += ["", "Failed runs (left out of the medians above; the failing process's own message):", ""]
        failures = {}
        for r in errors:
            key = (r["model"], r["backend"], r["impl"], r["devices"])
            failures.setdefault(key, []).append(r["error"][-1])
        for (model, backend, impl, devices), messages in sorted(failures.items()):
            lines.append(
                f"- {model} {backend} {impl} x{devices}, {len(messages)} of {meta['rounds']} rounds: "
                f"`{messages[-1][:240]}`"
            )
    if meta.get("device_kind", "cpu") == "cpu":
        lines += [
            "",
            "Simulated devices share the same cores, so more replicas cannot be faster here than one device; "
            "the ratios compare keras-dist's overhead against the native anchors measured in the same run.",
        ]
    write_atomically(path, "\n".join(lines) + "\n")


def write_plot(rows, path):
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    models = sorted({r["model"] for r in rows})
    if not models:  # every configuration failed: nothing to plot
        return False
    figure, axes = plt.subplots(1, len(models), figsize=(5 * len(models), 4), squeeze=False)
    for axis, model in zip(axes[0], models):
        for backend in ("jax", "tensorflow"):
            for impl in ("mirrored", "data_parallel", "tf_mirrored"):
                points = sorted(
                    (r["devices"], r["vs_single_device"])
                    for r in rows
                    if r["model"] == model and r["backend"] == backend and r["impl"] == impl and r["vs_single_device"]
                )
                if points:
                    axis.plot(*zip(*points), marker="o", label=f"{backend} {impl}")
        axis.axhline(1.0, color="gray", linestyle="--", linewidth=1)
        axis.set_title(model)
        axis.set_xlabel("replicas")
        axis.set_ylabel("step time / single device")
        axis.legend(fontsize=7)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    return True


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backends", default="jax,tensorflow")
    parser.add_argument("--models", default="mlp,cnn,text")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--max-devices", type=int, default=4)
    parser.add_argument("--quick", action="store_true", help="tiny run: mlp, few steps, 1 round, <= 2 devices")
    parser.add_argument("--output", type=pathlib.Path, default=HERE)
    parser.add_argument(
        "--device-kind",
        choices=["cpu", "gpu"],
        default="cpu",
        help="cpu: simulated CPU devices (default); gpu: every implementation on the GPUs (a GPU machine)",
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.models, args.steps, args.repeats, args.rounds = "mlp", 3, 1, 1
        args.max_devices = 2
    backends = args.backends.split(",")
    models = args.models.split(",")
    configs = list(configurations(backends, models, args.max_devices))
    results = []
    for round_index in range(args.rounds):
        for config in configs:  # interleaved: every configuration once per round
            result = run_one(config, args.steps, args.repeats, args.timeout, device_kind=args.device_kind)
            result["round"] = round_index
            results.append(result)
            status = result.get("error") or f"{result['step_s_median'] * 1e3:.2f} ms/step"
            print(f"[{round_index}] {config['model']:5} {config['backend']:10} {config['impl']:13} x{config['devices']}: {status}", flush=True)
    rows = summarize(results)
    meta = {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "steps": args.steps,
        "repeats": args.repeats,
        "rounds": args.rounds,
        "device_kind": args.device_kind,
    }
    results_dir = args.output / "results"
    results_dir.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y%m%dT%H%M%S")
    name = "quick" if args.quick else stamp
    write_atomically(results_dir / f"{name}.json", json.dumps({"meta": meta, "rows": rows, "raw": results}, indent=1))
    markdown = args.output / ("RESULTS.quick.md" if args.quick else "RESULTS.md")
    write_markdown(rows, results, meta, markdown)
    plotted = write_plot(rows, results_dir / ("step_time.quick.png" if args.quick else "step_time.png"))
    print(markdown.read_text())
    if not plotted:
        print("(no plot written: matplotlib is not installed or no configuration ran)")
    failed = [r for r in results if "error" in r]
    return 1 if failed and len(failed) == len(results) else 0


if __name__ == "__main__":
    sys.exit(main())
