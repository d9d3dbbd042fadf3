"""Runs `make` targets side by side, at most N at a time, longest first.

    python tests/run_parts.py --jobs 5 --logs .test-logs PART [PART ...]

`make test`'s parts (one pytest run each, in the venv of its backend) are
given longest first (tests/DURATIONS.md); each starts as soon as one of the
N slots is free, so the slots end together instead of each working through
a fixed list (the parts' lengths change with every new test and with the
load, which a fixed list cannot follow). Each part writes into
LOGS/PART.log, which ends with the part's wall time and exit code; when all
are done the logs are printed in the order given, then one line per part.
Every part runs even if another failed; the exit code is 1 if any failed.

With `--nice N`, every part but the first runs N steps nicer: the first
(longest) part is the critical path, a single pytest process that the
others' many worker processes and threads would otherwise outnumber for
the two cores (Linux shares CPU per thread); it gets the CPU it can use,
and the others take the rest.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import os
import pathlib
import subprocess
import sys
import time


def _run(part: str, logs: pathlib.Path, start: float, nice: int = 0) -> tuple[str, float, float, int]:
    began = time.monotonic()
    log = logs / f"{part}.log"
    with open(log, "w") as out:
        code = subprocess.run(
            ["make", "--no-print-directory", part],
            stdout=out,
            stderr=subprocess.STDOUT,
            preexec_fn=(lambda: os.nice(nice)) if nice else None,
        ).returncode
        ended = time.monotonic()
        out.write(f"== part {part}: {ended - began:.0f} s (from {began - start:.0f} s to {ended - start:.0f} s), exit {code}\n")
    return part, began - start, ended - start, code


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--jobs", type=int, required=True, help="parts run at once")
    parser.add_argument("--logs", type=pathlib.Path, required=True, help="folder for PART.log")
    parser.add_argument("--nice", type=int, default=0, help="niceness added to every part but the first")
    parser.add_argument("parts", nargs="+", help="make targets, longest first")
    args = parser.parse_args(argv)
    if args.jobs < 1:
        parser.error("--jobs must be 1 or more")
    if not 0 <= args.nice <= 19:
        parser.error("--nice must be from 0 to 19")
    if len(set(args.parts)) != len(args.parts):
        parser.error("a part is named twice")
    args.logs.mkdir(parents=True, exist_ok=True)
    start = time.monotonic()
    with concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
        futures = [
            pool.submit(_run, part, args.logs, start, 0 if index == 0 else args.nice)
            for index, part in enumerate(args.parts)
        ]
        results = {}
        for future in concurrent.futures.as_completed(futures):
            part, began, ended, code = future.result()
            results[part] = (began, ended, code)
            print(f"== part {part}: done after {ended:.0f} s, exit {code}", flush=True)
    for part in args.parts:
        print(f"===== part {part} ({args.logs / (part + '.log')})")
        sys.stdout.write((args.logs / f"{part}.log").read_text())
    print(f"===== parts: when each ran, {args.jobs} at a time")
    for part in args.parts:
        began, ended, code = results[part]
        print(f"== part {part}: {ended - began:.0f} s (from {began:.0f} s to {ended:.0f} s), exit {code}")
    failed = [part for part in args.parts if results[part][2] != 0]
    if failed:
        print(f"== failed: {' '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
