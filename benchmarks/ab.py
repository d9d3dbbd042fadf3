"""A/B: the same benchmark configurations on two checkouts, alternated.

    python benchmarks/ab.py OLD_CHECKOUT [--rounds 3] [--models mlp,text]

For each configuration and round, runs OLD's `benchmarks/_worker.py` (with
OLD's keras_dist) and then this checkout's, each in its own process, so
drift in machine load hits both alike. Prints one row per configuration:
median step time of each and new/old. Used for before/after figures of a
change (e.g. a refactor that must not cost speed).
"""

from __future__ import annotations

import argparse
import pathlib
import statistics
import sys

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from run import configurations, run_one  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("old", type=pathlib.Path)
    parser.add_argument("--backends", default="jax,tensorflow")
    parser.add_argument("--models", default="mlp,cnn,text")
    parser.add_argument("--max-devices", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--timeout", type=float, default=300)
    options = parser.parse_args(argv)
    roots = {"old": options.old.resolve(), "new": HERE.parent}
    configs = list(configurations(options.backends.split(","), options.models.split(","), options.max_devices))
    times = {}
    for round_index in range(options.rounds):
        for config in configs:
            key = (config["model"], config["backend"], config["impl"], config["devices"])
            for side, root in roots.items():
                result = run_one(config, options.steps, options.repeats, options.timeout, root=root)
                if "error" not in result:
                    times.setdefault(key, {}).setdefault(side, []).append(result["step_s_median"])
            print(f"[{round_index}] {key}: {times.get(key)}", file=sys.stderr, flush=True)
    print("| model | backend | implementation | devices | old step (ms) | new step (ms) | new / old |")
    print("|---|---|---|---|---|---|---|")
    for key, sides in sorted(times.items()):
        if len(sides) < 2:
            print(f"| {' | '.join(map(str, key))} | {'failed' if 'old' not in sides else '-'} | {'failed' if 'new' not in sides else '-'} | - |")
            continue
        old, new = statistics.median(sides["old"]), statistics.median(sides["new"])
        print(f"| {' | '.join(map(str, key))} | {old * 1e3:.2f} | {new * 1e3:.2f} | {new / old:.3f} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
