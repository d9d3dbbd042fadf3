"""What each test costs, and which tests start processes.

* ``KERAS_DIST_DURATIONS=path.json``: at the end of the run, every test's
  seconds (setup + call + teardown, so a module's cluster start is charged to
  its first test), CPU seconds (this process's and its reaped children's, user
  + system: what a test costs whatever else runs beside it), outcome and
  markers are written to that file (a temp file, then a rename). `make durations` turns the files of every suite into
  ``tests/DURATIONS.md`` (``tests/durations.py``).
* ``--quick`` (`make test-quick`): tests marked ``starts_processes`` are left
  out, and any other test that starts a process fails at once, naming the
  marker, so the marker cannot drift from what a test does.
* ``--zoo-sample=sample|rest``: of the tests marked ``zoo`` (other people's
  code, too costly for `make test` in full), each file's one sample case
  (`make test`, which runs them with the rest of the suite) or every other
  case (`make test-zoo`), so both together run each case once
  (``zoo_sample``). Tests not marked ``zoo`` are left alone.
"""

from __future__ import annotations

import json
import os
import subprocess
import time

import pytest

MARKERS = ("starts_processes", "slow", "needs_tensorflow", "needs_orbax", "stress", "faults", "zoo", "extended", "ray")


def pytest_addoption(parser):
    parser.addoption(
        "--quick",
        action="store_true",
        help="leave out tests marked starts_processes; a test that starts a process anyway fails",
    )
    parser.addoption(
        "--zoo-sample",
        choices=("sample", "rest"),
        default=None,
        help="of the tests marked zoo, run only each file's sample case (make test-zoo-sample) or all but it",
    )


def _cpu_seconds() -> float:
    """CPU time of this process and of the children it has reaped so far."""
    times = os.times()
    return times.user + times.system + times.children_user + times.children_system


class _Durations:
    def __init__(self, path: str, run: str):
        self.path, self.run = path, run
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}
        self.outcome: dict[str, str] = {}
        self.markers: dict[str, dict] = {}
        self.started = time.time()

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, items):
        for item in items:
            marks = {}
            for name in MARKERS:
                mark = item.get_closest_marker(name)
                if mark is not None:
                    marks[name] = (mark.args[0] if mark.args else mark.kwargs.get("reason", "")) or ""
            self.markers[item.nodeid] = marks

    @pytest.hookimpl(hookwrapper=True)
    def pytest_runtest_protocol(self, item, nextitem):
        before = _cpu_seconds()
        yield
        self.cpu[item.nodeid] = self.cpu.get(item.nodeid, 0.0) + _cpu_seconds() - before

    def pytest_runtest_logreport(self, report):
        self.seconds[report.nodeid] = self.seconds.get(report.nodeid, 0.0) + report.duration
        if report.when == "call" or report.outcome != "passed":
            if self.outcome.get(report.nodeid) in (None, "passed"):
                self.outcome[report.nodeid] = report.outcome

    def pytest_sessionfinish(self, session):
        tests = [
            {
                "id": nodeid,
                "seconds": round(seconds, 2),
                "cpu_seconds": round(self.cpu.get(nodeid, 0.0), 2),
                "outcome": self.outcome.get(nodeid, "passed"),
                "markers": self.markers.get(nodeid, {}),
            }
            for nodeid, seconds in self.seconds.items()
        ]
        data = {"run": self.run, "wall_seconds": round(time.time() - self.started, 1), "tests": tests}
        tmp = f"{self.path}.tmp"
        with open(tmp, "w") as handle:
            json.dump(data, handle, indent=0)
        os.replace(tmp, self.path)


def pytest_configure(config):
    path = os.environ.get("KERAS_DIST_DURATIONS")
    if path:
        run = os.path.splitext(os.path.basename(path))[0]
        config.pluginmanager.register(_Durations(path, run), "keras_dist_durations")


def keep_only(config, items, keep) -> None:
    """Leave in `items` those for which `keep(item)`; report the rest deselected."""
    kept, dropped = [], []
    for item in items:
        (kept if keep(item) else dropped).append(item)
    config.hook.pytest_deselected(items=dropped)
    items[:] = kept


def zoo_sample(items) -> set:
    """The node ids of each file's sample among its tests marked `zoo`: the
    case whose id contains the module's `ZOO_SAMPLE` string, else its first;
    none for a module whose `ZOO_SAMPLE` is None (its cases cost too much,
    or need what the sample's venv lacks: the module says why). A dict
    `ZOO_SAMPLE` names each backend's (KERAS_BACKEND) string or None."""
    backend = os.environ.get("KERAS_BACKEND", "tensorflow")
    chosen, seen = {}, {}
    for item in items:
        if item.get_closest_marker("zoo") is None:
            continue
        module = item.module
        wanted = getattr(module, "ZOO_SAMPLE", "")
        if isinstance(wanted, dict):
            wanted = wanted.get(backend)
        if wanted is None:
            continue
        seen[module.__name__] = wanted
        if module.__name__ not in chosen and wanted in item.nodeid:
            chosen[module.__name__] = item.nodeid
    missing = sorted(f"{name} (ZOO_SAMPLE = {seen[name]!r})" for name in seen if name not in chosen)
    if missing:  # a renamed case must not leave a file out of the sample unnoticed
        raise pytest.UsageError(f"ZOO_SAMPLE names no collected case in: {', '.join(missing)}")
    return set(chosen.values())


@pytest.hookimpl(tryfirst=True)  # before -m deselects: the sample is chosen among every collected case
def pytest_collection_modifyitems(config, items):
    part = config.getoption("--zoo-sample")
    if part is not None:
        sample = zoo_sample(items)
        in_part = (lambda item: item.nodeid in sample) if part == "sample" else (lambda item: item.nodeid not in sample)
        keep_only(config, items, lambda item: item.get_closest_marker("zoo") is None or in_part(item))
    if config.getoption("--quick"):
        keep_only(config, items, lambda item: item.get_closest_marker("starts_processes") is None)


class ProcessStarted(RuntimeError):
    pass


@pytest.fixture(autouse=True)
def _quick_runs_start_no_process(request, monkeypatch):
    """Under --quick, a test not marked starts_processes may start none."""
    if request.config.getoption("--quick"):

        def refuse(self, *args, **kwargs):
            raise ProcessStarted(
                f"{request.node.nodeid} started a process: mark it @pytest.mark.starts_processes "
                "(make test-quick leaves those out)"
            )

        monkeypatch.setattr(subprocess.Popen, "__init__", refuse)
    yield
