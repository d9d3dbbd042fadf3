"""The benchmark suite runs (a tiny configuration), so it cannot rot.

Speed itself is never asserted here: timings on a shared CI machine are
noise. `make bench` produces the numbers (benchmarks/RESULTS.md). The quick
runs (marker `bench`: each starts the benchmark's own processes, 2.2 CPU-min
on both backends) run in `make test-bench` (CI), not in `make test`.
"""

import json
import os
import subprocess
import sys

import pytest

from conftest import BACKEND

NATIVE = {"jax": "data_parallel", "tensorflow": "tf_mirrored"}


def _run_quick(script, output, *options, timeout=300):
    """`benchmarks/<script> --quick ... --output <output>`, which must succeed."""
    done = subprocess.run(
        [sys.executable, f"benchmarks/{script}", "--quick", *options, "--output", str(output)],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
    )
    assert done.returncode == 0, done.stderr[-3000:]


@pytest.mark.slow("five benchmark configurations, each in a fresh process as `make bench` runs them (plain Keras, one device, Mirrored x1 and x2, the backend's native path)")
@pytest.mark.starts_processes
@pytest.mark.bench
def test_quick_benchmark_run(tmp_path):
    _run_quick("run.py", tmp_path, "--backends", BACKEND, timeout=600)
    report = json.loads((tmp_path / "results" / "quick.json").read_text())
    rows = {(r["impl"], r["devices"]): r for r in report["rows"]}
    expected = {("keras", 1), ("one_device", 1), ("mirrored", 1), ("mirrored", 2), (NATIVE[BACKEND], 2)}
    assert expected <= set(rows), sorted(rows)
    anchor = rows[("keras", 1)]["step_s"]  # plain Keras on one device, same run
    for row in rows.values():
        assert row["step_s"] > 0 and row["first_step_s"] > 0
        assert row["vs_single_device"] == row["step_s"] / anchor, row
    markdown = (tmp_path / "RESULTS.quick.md").read_text()
    assert "| mlp | " + BACKEND + " | mirrored | 2 |" in markdown
    assert (tmp_path / "results" / "step_time.quick.png").stat().st_size > 0


@pytest.mark.slow("a 1-worker and a 2-worker job, each worker pinned to one core")
@pytest.mark.starts_processes
@pytest.mark.bench
def test_quick_weak_scaling_run(tmp_path):
    """P3's harness: a one-worker and a two-worker job, each pinned to a core."""
    _run_quick("weak_scaling.py", tmp_path, "--backends", BACKEND)
    (row,) = json.loads((tmp_path / "results" / "weak_scaling.quick.json").read_text())
    assert row["backend"] == BACKEND
    assert row["one_worker_samples_per_second"] > 0 and row["two_workers_samples_per_second"] > 0
    if BACKEND == "jax":  # one core per worker: gloo's busy event loop yields it
        assert row["gloo_event_loops_idle"] and all(row["gloo_event_loops_idle"])
    assert f"| {BACKEND} |" in (tmp_path / "WEAK_SCALING.quick.md").read_text()


@pytest.mark.slow("2-worker jobs for the DATA, FILE and OFF policies and plain Keras, each worker importing JAX and TensorFlow")
@pytest.mark.starts_processes
@pytest.mark.needs_tensorflow
@pytest.mark.bench
def test_quick_per_worker_input_run(tmp_path):
    """The per-worker tf.data input benchmark: one 2-worker job timing DATA,
    FILE and OFF input and plain Keras, side by side."""
    _run_quick("per_worker_input.py", tmp_path, "--backends", BACKEND)
    rows = json.loads((tmp_path / "results" / "per_worker_input.quick.json").read_text())
    by_input = {row["input"]: row for row in rows}
    assert set(by_input) == {"DATA", "FILE", "OFF", "plain Keras, one device"}
    assert all(row["step_s"] > 0 for row in rows)
    # FILE: every example once (4 global batches); OFF: every worker every file
    assert by_input["FILE"]["steps_per_epoch"] == by_input["DATA"]["steps_per_epoch"] == 4
    assert by_input["OFF"]["steps_per_epoch"] == 8
    assert f"| {BACKEND} | FILE |" in (tmp_path / "PER_WORKER_INPUT.quick.md").read_text()


def test_a_failed_run_is_reported_by_its_reason():
    sys.path.insert(0, "benchmarks")
    try:
        import run
    finally:
        sys.path.remove("benchmarks")
    xla_abort = (
        "I0000 starting\n"
        "F1122 08:50:05.532686 26969 rendezvous.cc:161] Termination timeout for `all reduce` exceeded.\n"
        "*** Check failure stack trace: ***\n"
        "    @     0x7ff56d8a71f5  (unknown)\n"
    )
    assert run.error_line(xla_abort).startswith("F1122 08:50:05.532686 26969 rendezvous.cc:161] Termination")
    traceback = 'Traceback (most recent call last):\n  File "x.py", line 1\nValueError: bad input\n'
    assert run.error_line(traceback) == "ValueError: bad input"
    assert run.error_line("") == "failed"


def test_a_report_is_written_whole_or_not_at_all(tmp_path):
    """Every benchmark writes its JSON rows and markdown table through
    `_report.write_report`: both texts are made before either file is
    touched, and each file is replaced by a rename."""
    sys.path.insert(0, "benchmarks")
    try:
        import _report
    finally:
        sys.path.remove("benchmarks")
    columns = [("name", lambda r: r["name"]), ("ratio", lambda r: f"{r['ratio']:.2f}x")]
    _report.write_report(tmp_path, "demo", [{"name": "a", "ratio": 0.5}], ["# Demo", "text"], columns, quick=True)
    markdown = tmp_path / "DEMO.quick.md"
    rows = tmp_path / "results" / "demo.quick.json"
    assert markdown.read_text() == "# Demo\ntext\n\n| name | ratio |\n|---|---|\n| a | 0.50x |\n"
    assert json.loads(rows.read_text()) == [{"name": "a", "ratio": 0.5}]
    before = (markdown.read_text(), rows.read_text())
    with pytest.raises(KeyError, match="ratio"):  # a row the table cannot show
        _report.write_report(tmp_path, "demo", [{"name": "b"}], ["# Demo"], columns, quick=True)
    assert (markdown.read_text(), rows.read_text()) == before
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["DEMO.quick.md", "demo.quick.json", "results"]


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND != "tensorflow", reason="times tf's ClusterCoordinator (the TensorFlow engine)")
@pytest.mark.bench
def test_quick_parameter_server_run(tmp_path):
    """The exactly-once cost benchmark: one 2-worker 2-ps job timing the same
    step through keras_dist's coordinator and tf's own, every step counted."""
    _run_quick("parameter_server.py", tmp_path)
    rows = json.loads((tmp_path / "results" / "parameter_server.quick.json").read_text())
    assert {row["path"] for row in rows} == {"keras_dist (exactly once)", "tf ClusterCoordinator (at least once)"}
    assert all(row["step_s"] > 0 and row["counted"] == row["scheduled"] for row in rows), rows
    assert "| keras_dist (exactly once) |" in (tmp_path / "PARAMETER_SERVER.quick.md").read_text()
