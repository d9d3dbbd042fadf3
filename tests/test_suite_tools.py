"""The suite's own tools: the durations record and report, and --quick's
guard that keeps the `starts_processes` marker true."""

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

#: The suite's own tools (durations, run_parts, the zoo's sample) import no
#: backend: make test runs these once, in its JAX parts.
pytestmark = pytest.mark.skipif(
    os.environ.get("KERAS_BACKEND", "jax") != "jax", reason="backend-free tools: make test runs them once, on JAX"
)

import durations

TESTS = Path(__file__).resolve().parent

_PROBE_TESTS = textwrap.dedent(
    """
    import subprocess, sys
    import pytest

    def test_in_process():
        assert 1 + 1 == 2

    @pytest.mark.starts_processes
    def test_marked_and_starts_one():  # its child burns about 0.3 s of CPU
        code = "import time\\nwhile time.process_time() < 0.3: pass"
        subprocess.run([sys.executable, "-c", code], check=True)

    @pytest.mark.slow("it says why")
    def test_unmarked_but_starts_one():
        subprocess.run([sys.executable, "-c", "pass"], check=True)
    """
)


def _run_probe(tmp_path, *options, **env):
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_suite_plugin"]\n')
    (tmp_path / "test_probe.py").write_text(_PROBE_TESTS)
    (tmp_path / "pytest.ini").write_text(
        "[pytest]\nmarkers =\n    starts_processes: x\n    slow(why): x\naddopts = -p no:cacheprovider\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rA", *options, str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")]), **env),
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.starts_processes
def test_quick_leaves_marked_tests_out_and_fails_an_unmarked_one_that_starts_a_process(tmp_path):
    done = _run_probe(tmp_path, "--quick")
    output = done.stdout + done.stderr
    assert done.returncode == 1, output
    assert "1 failed, 1 passed, 1 deselected" in output, output
    assert "test_unmarked_but_starts_one started a process: mark it @pytest.mark.starts_processes" in output, output


@pytest.mark.starts_processes
def test_without_quick_everything_runs_and_the_record_has_every_test(tmp_path):
    record = tmp_path / "record.json"
    done = _run_probe(tmp_path, KERAS_DIST_DURATIONS=str(record))
    assert done.returncode == 0, done.stdout + done.stderr
    data = json.loads(record.read_text())
    assert data["run"] == "record" and data["wall_seconds"] > 0
    tests = {t["id"].split("::")[1]: t for t in data["tests"]}
    assert sorted(tests) == ["test_in_process", "test_marked_and_starts_one", "test_unmarked_but_starts_one"]
    assert all(t["outcome"] == "passed" and t["seconds"] >= 0 for t in tests.values())
    # CPU time counts the process a test started and reaped
    assert tests["test_marked_and_starts_one"]["cpu_seconds"] >= 0.25, tests  # os.times ticks: 0.29 seen
    assert tests["test_in_process"]["cpu_seconds"] < 0.1, tests
    assert tests["test_marked_and_starts_one"]["markers"] == {"starts_processes": ""}
    assert tests["test_unmarked_but_starts_one"]["markers"] == {"slow": "it says why"}
    assert not (tmp_path / "record.json.tmp").exists()


def _test(nodeid, seconds, outcome="passed", cpu=None, **markers):
    return {"id": nodeid, "seconds": seconds, "cpu_seconds": seconds / 2 if cpu is None else cpu, "outcome": outcome,
            "markers": markers}


def test_report_totals_files_and_tests_over_a_minute_with_their_reasons():
    runs = [
        {"run": "jax", "wall_seconds": 150.0, "tests": [
            _test("tests/test_a.py::test_one", 90.0, slow="starts a job"),
            _test("tests/test_a.py::test_two", 0.5),
            _test("tests/test_b.py::test_three", 61.0, starts_processes=""),
            _test("tests/test_c.py::test_starved", 70.0, cpu=5.0),
            _test("tests/test_b.py::test_four", 0.0, outcome="skipped"),
        ]},
    ]
    text = durations.report(runs)
    assert "| jax | 5 | 4 | 1 | 2.5 | 3.7 | 1.3 |" in text
    assert "| 90 | 45 | jax | `tests/test_a.py::test_one` | starts a job |" in text
    assert "| 61 | 30 | jax | `tests/test_b.py::test_three` | **no reason given" in text
    assert "| 70 | 5 | jax | `tests/test_c.py::test_starved` | waiting for a core: 5 s of CPU in 70 s" in text
    assert "| tests/test_a.py | 2 | 90 | 45 |" in text and "| tests/test_b.py | 2 | 61 | 30 |" in text
    assert "| 61.0 | 30.5 | `tests/test_b.py::test_three` | yes |" in text
    assert "test_two" not in text  # under a second: counted, not listed


def test_a_reason_is_read_from_the_test_s_source_when_the_record_has_none():
    root = str(TESTS.parent)
    assert "fresh process" in durations._reason_in_source(
        "tests/test_benchmarks.py::test_quick_benchmark_run", root
    )
    assert "shared job" in durations._reason_in_source(
        "tests/test_multi_worker.py::test_two_workers_match_single_device[2]", root
    )
    assert durations._reason_in_source("tests/test_suite_tools.py::test_report_totals_files_and_tests_over_a_minute_with_their_reasons", root) == ""
    assert durations._reason_in_source("tests/no_such_file.py::test_x", root) == ""


_STARTUP_PROBE = textwrap.dedent(
    """
    import sys
    import keras
    kept_from_keras = "sklearn" not in sys.modules and "matplotlib" not in sys.modules
    from keras.src.wrappers import fixes
    from sklearn.datasets import load_digits  # anyone else still gets them
    import matplotlib.figure
    print(kept_from_keras, fixes.sklearn is None, load_digits().data.shape == (1797, 64))
    """
)


@pytest.mark.starts_processes
@pytest.mark.parametrize("lean", [True, False], ids=["with-tests-startup", "without"])
def test_startup_keeps_sklearn_and_matplotlib_from_keras_only(lean):
    """tests/startup/sitecustomize.py (on make test's PYTHONPATH): Keras'
    eager imports of scikit-learn and matplotlib are refused, anyone else's
    import works; without it on the path, Keras imports both (so the hook
    still has something to save: if a Keras release stops, drop it)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if lean:
        env["PYTHONPATH"] = str(TESTS / "startup")
    done = subprocess.run([sys.executable, "-c", _STARTUP_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == (["True", "True", "True"] if lean else ["False", "False", "True"]), done.stdout


_GRAPPLER_PROBE = textwrap.dedent(
    """
    import tensorflow as tf
    off = tf.config.optimizer.get_experimental_options().get("disable_meta_optimizer", False)
    square = tf.function(lambda v: v * v)
    print(off, float(square(tf.constant(3.0))), type(tf.__spec__.loader).__name__)
    """
)


@pytest.mark.starts_processes
@pytest.mark.parametrize("setting", ["off", None], ids=["grappler-off", "unset"])
def test_startup_turns_tensorflow_s_graph_optimizer_off_only_when_asked(setting):
    """tests/startup/sitecustomize.py with KERAS_DIST_TEST_TF_GRAPPLER=off
    (make test, make test-quick): a process that imports tensorflow has
    grappler off, and tf.functions run; without the variable, TensorFlow's
    defaults (grappler on) and its own loader."""
    pytest.importorskip("tensorflow", reason="the TensorFlow venvs run it (tensorflow not installed here)")
    env = {k: v for k, v in os.environ.items() if k != "KERAS_DIST_TEST_TF_GRAPPLER"}
    env.update(PYTHONPATH=str(TESTS / "startup"), TF_CPP_MIN_LOG_LEVEL="3")
    if setting:
        env["KERAS_DIST_TEST_TF_GRAPPLER"] = setting
    done = subprocess.run([sys.executable, "-c", _GRAPPLER_PROBE], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    off, value, loader = done.stdout.split()
    assert (off, value) == (str(setting == "off"), "9.0"), done.stdout
    assert (loader == "_OptimizerOffLoader") == (setting == "off"), done.stdout


@pytest.mark.starts_processes
def test_run_parts_runs_every_part_and_only_the_first_at_full_priority(tmp_path):
    """tests/run_parts.py (make test's scheduler): every part runs even if
    one fails, each log ends with its exit code, and with --nice every part
    but the first (the critical path) runs that much nicer."""
    (tmp_path / "Makefile").write_text(
        "first second:\n\t@python3 -c 'import os; print(\"niceness\", os.nice(0))'\n"
        "failing:\n\t@exit 3\n"
    )
    done = subprocess.run(
        [sys.executable, str(TESTS / "run_parts.py"), "--jobs", "2", "--nice", "5", "--logs", "logs",
         "first", "failing", "second"],
        cwd=tmp_path, capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1 and "== failed: failing" in done.stdout, done.stdout
    own = os.nice(0)
    logs = {part: (tmp_path / "logs" / f"{part}.log").read_text() for part in ("first", "second", "failing")}
    assert f"niceness {own}\n" in logs["first"], logs
    assert f"niceness {min(own + 5, 19)}\n" in logs["second"], logs
    assert logs["failing"].rstrip().endswith("exit 2"), logs  # make's own code for a failed recipe


_ZOO_PROBE = textwrap.dedent(
    """
    import pytest

    ZOO_SAMPLE = {sample!r}

    @pytest.mark.zoo
    @pytest.mark.parametrize("case", ["one-device", "mirrored-2", "mirrored-4"])
    def test_model(case):
        pass

    def test_not_in_the_zoo():
        pass
    """
)


@pytest.mark.starts_processes
@pytest.mark.parametrize(
    "sample, part, expected",
    [
        ("mirrored-2", "sample", "2 passed, 2 deselected"),
        ("mirrored-2", "rest", "3 passed, 1 deselected"),
        (None, "sample", "1 passed, 3 deselected"),
        (None, "rest", "4 passed"),
        ({"jax": "mirrored-4", "tensorflow": "mirrored-2"}, "sample", "test_model[mirrored-4] PASSED"),
        ({"jax": None, "tensorflow": "mirrored-2"}, "sample", "1 passed, 3 deselected"),
        ("no-such-case", "sample", "ZOO_SAMPLE names no collected case in: test_zoo_probe (ZOO_SAMPLE = 'no-such-case')"),
    ],
)
def test_the_zoo_sample_takes_each_files_sample_case_and_the_rest_every_other(tmp_path, sample, part, expected):
    """`--zoo-sample`: sample and rest split a zoo file's cases, each run
    once, and leave the tests not marked zoo alone (make test runs the
    sample with them); a file with ZOO_SAMPLE = None has no sample, a dict
    names each backend's (here JAX's); a ZOO_SAMPLE that names no case (a
    renamed test) is an error, not a file silently left out of the sample."""
    (tmp_path / "conftest.py").write_text('pytest_plugins = ["_suite_plugin"]\n')
    (tmp_path / "test_zoo_probe.py").write_text(_ZOO_PROBE.format(sample=sample))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    zoo: x\naddopts = -p no:cacheprovider\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-v", f"--zoo-sample={part}", str(tmp_path)],
        cwd=tmp_path,
        env=dict(os.environ, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([str(TESTS), os.environ.get("PYTHONPATH", "")])),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert expected in done.stdout + done.stderr, done.stdout + done.stderr
