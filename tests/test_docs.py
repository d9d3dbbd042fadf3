"""The example and the guides run, on the backend of this test process.

Each one runs in its own Python subprocess (simulated devices must be set up
before the backend starts, so they cannot share this process):

* ``examples/digits_cnn.py --epochs 1`` must exit 0 and print its MATCH line;
* so must ``examples/custom_loop_<backend>.py --epochs 1``, for the backend
  of this process only (each of those examples sets its own backend);
* every ```python block of each guide in `GUIDES`, concatenated in order
  into one script, must exit 0. Blocks fenced otherwise (```text ...) are
  illustrations and are not run.

A guide's code runs on either backend and needs only that backend's package:
a JAX reader may have no TensorFlow. Code that needs tensorflow on JAX too
(tf.data input) goes in a block fenced ```python tf, placed so that the
script runs with or without it. On TensorFlow every block runs. On JAX the
guide runs twice: its ```python blocks alone, with tensorflow made
unimportable (as on a `pip install ".[jax]"`), and, marked
`needs_tensorflow`, every block (`make test-jax-with-tensorflow`).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import keras
import pytest

from conftest import BACKEND

REPO = Path(__file__).resolve().parents[1]
TIMEOUT_S = 300

EXAMPLE = "examples/digits_cnn.py"
#: The custom-loop example of each backend; only this process's backend runs.
CUSTOM_LOOP_EXAMPLE = "examples/custom_loop_{backend}.py"
#: Guides whose ```python blocks must run; add new guides here.
GUIDES = [
    "guides/distributed_training.md",
    "guides/custom_training_loops.md",
    "guides/multi_worker.md",
    "guides/performance.md",
    "guides/porting_from_tf_distribute.md",
]

_PYTHON_BLOCK = re.compile(r"^```python( tf)?[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)


def _env(hidden: Path | None = None) -> dict:
    """The backend of this process; `hidden` (a folder of stand-in packages
    that fail to import) goes first on the path."""
    env = dict(os.environ)
    env["KERAS_BACKEND"] = keras.config.backend()
    env["TF_CPP_MIN_LOG_LEVEL"] = "3"
    paths = [str(REPO)] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    if hidden is not None:
        paths.insert(0, str(hidden))
    env["PYTHONPATH"] = os.pathsep.join(paths)
    return env


def _hide(package: str, folder: Path) -> Path:
    """A stand-in for `package` in `folder` whose import fails as if it were
    not installed."""
    (folder / package).mkdir(parents=True)
    (folder / package / "__init__.py").write_text(
        f"raise ModuleNotFoundError(\"No module named '{package}'\", name='{package}')\n"
    )
    return folder


def _run(args, hidden: Path | None = None, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *map(str, args)],
        cwd=REPO,
        env=_env(hidden),
        capture_output=True,
        text=True,
        timeout=TIMEOUT_S,
        **kwargs,
    )


def _report(result: subprocess.CompletedProcess) -> str:
    return (
        f"exit code {result.returncode}\n"
        f"--- stdout (last 4000 chars) ---\n{result.stdout[-4000:]}\n"
        f"--- stderr (last 8000 chars) ---\n{result.stderr[-8000:]}"
    )


def python_blocks(markdown: str, tensorflow: bool = True) -> list[tuple[int, str]]:
    """``(line number, code)`` of every ```python block, in order, and of
    every ```python tf block too if `tensorflow`."""
    return [
        (markdown.count("\n", 0, match.start()) + 1, match.group(2))
        for match in _PYTHON_BLOCK.finditer(markdown)
        if tensorflow or not match.group(1)
    ]


def guide_script(path: Path, tensorflow: bool = True) -> str:
    """The guide's python blocks as one script, each marked with its line."""
    parts = [
        f"# --- {path.name}, python block {number} (line {line}) ---\n{code}"
        for number, (line, code) in enumerate(python_blocks(path.read_text(), tensorflow), 1)
    ]
    return "\n".join(parts)


def test_python_blocks_are_extracted():
    markdown = (
        "intro\n```python\nx = 1\n```\n\n```text\nnot run\n```\n"
        "```python tf\nimport tensorflow\n```\n"
        "```python\nprint(x)\n```\n"
    )
    assert python_blocks(markdown) == [(2, "x = 1\n"), (9, "import tensorflow\n"), (12, "print(x)\n")]
    assert python_blocks(markdown, tensorflow=False) == [(2, "x = 1\n"), (12, "print(x)\n")]


def _assert_match(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, _report(result)
    assert re.search(r"^MATCH: ", result.stdout, re.M), _report(result)
    assert "MISMATCH" not in result.stdout, _report(result)


@pytest.mark.slow("a fresh process trains the demo CNN for one epoch on 4 simulated devices and on one device")
@pytest.mark.starts_processes
def test_example_digits_cnn_matches_single_device():
    result = _run([EXAMPLE, "--epochs", "1"])
    _assert_match(result)
    # `make demo` runs it on JAX in a JAX-only install: no engine notices
    engine_lines = re.findall(r"^(?:[IWEF]\d{4} \d\d:\d\d|WARNING: All log messages before absl).*",
                              result.stdout + result.stderr, re.M)
    assert BACKEND != "jax" or not engine_lines, engine_lines


@pytest.mark.starts_processes
def test_example_custom_loop_matches_single_device():
    backend = keras.config.backend()
    example = CUSTOM_LOOP_EXAMPLE.format(backend=backend)
    assert (REPO / example).is_file(), f"no custom-loop example for {backend}"
    result = _run([example, "--epochs", "1"])
    _assert_match(result)
    assert f"backend {backend}" in result.stdout, _report(result)


def _guide_runs() -> list:
    """(guide, with its ```python tf blocks) of each run on this backend."""
    if BACKEND != "jax":
        return [pytest.param(guide, True, id=guide) for guide in GUIDES]
    runs = [pytest.param(guide, False, id=guide) for guide in GUIDES]
    for guide in GUIDES:
        text = (REPO / guide).read_text()
        if len(python_blocks(text)) > len(python_blocks(text, tensorflow=False)):
            second_run = pytest.mark.extended(
                "the guide again on JAX with its tf.data blocks: make test runs it on JAX without them and on "
                "TensorFlow with them"
            )
            runs.append(pytest.param(guide, True, id=f"{guide}+tf", marks=[pytest.mark.needs_tensorflow, second_run]))
    return runs


@pytest.mark.slow("each guide's python blocks run as one script in a fresh process (distributed_training.md: 25 blocks, several strategies)")
@pytest.mark.starts_processes
@pytest.mark.parametrize("guide, tensorflow", _guide_runs())
def test_guide_python_blocks_run(guide, tensorflow, tmp_path):
    path = REPO / guide
    blocks = python_blocks(path.read_text(), tensorflow)
    assert blocks, f"{guide} has no ```python blocks"
    # Every guide must run on a CPU-only machine: its first block sets up
    # simulated devices before anything is computed.
    assert "keras_dist.simulate_cpu_devices(" in blocks[0][1], (
        f"the first python block of {guide} must call "
        "keras_dist.simulate_cpu_devices(n)"
    )
    script = tmp_path / (path.stem + ".py")
    script.write_text(guide_script(path, tensorflow))
    # Without its tf blocks, the guide must not need tensorflow (nor may it
    # use tensorflow's tf.data silently where it happens to be installed).
    hidden = None if tensorflow else _hide("tensorflow", tmp_path / "hidden")
    result = _run([script], hidden=hidden)
    assert result.returncode == 0, f"{guide} failed ({script}):\n" + _report(result)


#: Import name -> the distribution that provides it, for examples/' imports.
_DISTRIBUTIONS = {"sklearn": "scikit-learn", "tensorflow": "tensorflow", "jax": "jax", "torch": "torch",
                  "keras": "keras", "numpy": "numpy", "h5py": "h5py", "ray": "ray"}


def test_the_extras_cover_the_examples_imports():
    """Every example runs with the README's install line, `pip install
    ".[BACKEND,examples]"`: each third-party module an example imports comes
    from the dependencies, the `examples` extra, or a backend's extra (the
    failure this catches: the documented torch example needed
    scikit-learn, which `[torch]` did not install)."""
    import ast
    import tomllib

    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    name = lambda requirement: re.split(r"[<>=!~\[ ;]", requirement, maxsplit=1)[0].lower()  # noqa: E731
    installed = {name(r) for r in project["dependencies"]} | {name(r) for r in project["optional-dependencies"]["examples"]}
    backends = {name(r) for b in ("jax", "tensorflow", "torch") for r in project["optional-dependencies"][b]}
    readme = (REPO / "README.md").read_text()
    assert re.search(r'pip install "\.\[(jax|tensorflow|torch),examples\]"', readme), "the README's install line"
    for example in sorted((REPO / "examples").glob("*.py")):
        modules = set()
        for node in ast.walk(ast.parse(example.read_text())):
            if isinstance(node, ast.Import):
                modules |= {alias.name.split(".")[0] for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0:
                modules.add(node.module.split(".")[0])
        third_party = {m for m in modules if m not in sys.stdlib_module_names and m != "keras_dist"}
        for module in third_party:
            assert module in _DISTRIBUTIONS, f"{example.name} imports {module}: add it to _DISTRIBUTIONS and the extras"
            distribution = _DISTRIBUTIONS[module]
            assert distribution in installed | backends, f"{example.name}: {distribution} is in no extra"


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND == "torch", reason="torch: a replica is a process; the README's launcher line runs "
                    "examples/multi_worker.py (tests/test_multi_worker.py::test_example_through_the_launcher)")
def test_the_readme_snippet_runs_as_written(tmp_path):
    """The README's python block, as a user pastes it into a file on a
    CPU-only machine (only KERAS_BACKEND set, to this run's backend)."""
    (line, code), = python_blocks((REPO / "README.md").read_text())
    script = tmp_path / "readme.py"
    script.write_text(code)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KERAS_DIST_")}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path,
                          env=dict(env, KERAS_BACKEND=BACKEND))
    assert done.returncode == 0, f"README.md line {line}:\n{done.stderr[-3000:]}"
    assert "replicas: 4" in done.stdout and "Epoch 3/3" in done.stdout, done.stdout[-2000:]


@pytest.mark.starts_processes
def test_the_api_reference_lists_every_public_name():
    """docs/pages/api (what `make docs` renders) is what docs/gen_api.py
    writes from the package's `__all__`: a name added or removed is listed."""
    done = subprocess.run([sys.executable, str(REPO / "docs" / "gen_api.py"), "--check"], capture_output=True,
                          text=True, timeout=300, env=dict(os.environ, KERAS_BACKEND=BACKEND))
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]


def test_changelog_lines_are_short():
    """CHANGELOG.md (Keep a Changelog style): one short entry per change;
    the details live in the guides, the tests and the commit messages."""
    entries = [line for line in (REPO / "CHANGELOG.md").read_text().splitlines() if line.startswith("- ")]
    assert entries
    long = [entry[:80] for entry in entries if len(entry.split()) > 85]
    assert not long, long
