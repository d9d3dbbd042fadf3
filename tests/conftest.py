"""Test set-up: one backend per pytest process, 4 simulated CPU devices.

A test that needs the *other* backend's package in this process (tf.data
input or TensorBoard's tf.summary on JAX) is marked `needs_tensorflow`.
`make test-jax` runs the JAX suite where tensorflow is not installed, as a
user's `pip install ".[jax]"`; there those tests are skipped, with the
reason naming `make test-jax-with-tensorflow`, which runs just them
(`--only-other-backend-tests`) where both packages are installed.
Likewise a test of Keras' `OrbaxCheckpoint` is marked `needs_orbax`:
orbax-checkpoint brings jax, so the TensorFlow- and torch-only venvs leave
it out; `make test-tensorflow-with-orbax` runs those tests on TensorFlow
where both are installed (the union venv). No other TensorFlow-backend
test needs jax.
"""

import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import pytest  # noqa: E402

import keras_dist  # noqa: E402

pytest_plugins = ["_suite_plugin"]  # durations file, --quick (make test-quick)
from _suite_plugin import keep_only  # noqa: E402

BACKEND = keras.config.backend()

#: Simulated CPU devices per process (torch: one; its replicas are processes).
NUM_DEVICES = 1 if BACKEND == "torch" else 4
keras_dist.simulate_cpu_devices(NUM_DEVICES)

#: `make test` gives the JAX pytest processes of each part one persistent
#: XLA compilation cache, new for each run (`.test-logs/jax-cache-<part>`),
#: used in the pytest process only:
#: an XLA program identical to one an earlier test compiled (the same model,
#: batch shapes and devices: each equivalence test's one-device reference,
#: say) is loaded instead of compiled again. Everything above XLA (Keras,
#: keras_dist, tracing and lowering) still runs in every test, and the
#: program run is the same; subprocesses (examples, workers) compile their
#: own, as a user's do.
JAX_CACHE = os.environ.get("KERAS_DIST_TEST_JAX_CACHE")
if BACKEND == "jax" and JAX_CACHE:
    import jax

    jax.config.update("jax_compilation_cache_dir", JAX_CACHE)
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0)
    jax.config.update("jax_persistent_cache_min_entry_size_bytes", 0)

#: `make test` also gives the JAX processes the tests start (examples, guide
#: blocks, workers) one XLA compilation cache shared by every part
#: (`.test-logs/jax-cache-processes`, new each run): a worker or example that
#: runs a program an earlier one compiled loads it. Several processes read and
#: write it at once, so it is set up with a size limit, which makes JAX take a
#: file lock around every read and write (without one, a process can read an
#: entry another is still writing). Only the program of process 0 of a
#: multi-process job is written, as JAX does. `make test-stress` sets one
#: of its own (tests/test_stress.py says why); `make test-faults` sets none:
#: there every process compiles its own.
JAX_PROCESS_CACHE = os.environ.get("KERAS_DIST_TEST_JAX_PROCESS_CACHE")
if BACKEND == "jax" and JAX_PROCESS_CACHE:
    os.environ["JAX_COMPILATION_CACHE_DIR"] = JAX_PROCESS_CACHE
    os.environ["JAX_COMPILATION_CACHE_MAX_SIZE"] = str(8 << 30)
    os.environ["JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS"] = "0"
    os.environ["JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES"] = "0"


#: backend -> (marker of the tests that need another backend's package,
#: that package, the make target that runs those tests).
OTHER_BACKEND = {
    "jax": ("needs_tensorflow", "tensorflow", "make test-jax-with-tensorflow"),
    "tensorflow": ("needs_orbax", "orbax.checkpoint", "make test-tensorflow-with-orbax"),
}
#: Where no target runs a marker's tests: marker -> (package, why).
UNRUN_ELSEWHERE = {
    "needs_orbax": ("orbax.checkpoint", "orbax-checkpoint brings jax, which a torch-only install leaves out; on torch "
                    "the multi-worker refusal is tested (test_first_hour.py)"),
}


def pytest_report_header(config):
    cache = f", XLA compilation cache {JAX_CACHE}" if BACKEND == "jax" and JAX_CACHE else ""
    if BACKEND == "jax" and JAX_PROCESS_CACHE:
        cache += f", for the processes it starts {JAX_PROCESS_CACHE}"
    return f"keras {keras.version()}, backend {BACKEND}, {NUM_DEVICES} simulated CPU devices{cache}"


def pytest_addoption(parser):
    parser.addoption(
        "--only-other-backend-tests",
        action="store_true",
        help="run only the tests that need the other backend's package in this process "
        "(needs_tensorflow on JAX); combines with -m",
    )


def pytest_collection_modifyitems(config, items):
    marker, package, target = OTHER_BACKEND.get(BACKEND, (None, None, None))
    needs = {item.nodeid: bool(marker and item.get_closest_marker(marker)) for item in items}
    if config.getoption("--only-other-backend-tests"):
        keep_only(config, items, lambda item: needs[item.nodeid])
    elif any(needs.values()) and not _installed(package):
        skip = pytest.mark.skip(reason=f"needs {package} in a {BACKEND} process, not installed here; `{target}` runs it")
        for item in items:
            if needs[item.nodeid]:
                item.add_marker(skip)
    for other, (package, why) in UNRUN_ELSEWHERE.items():
        if other == marker or _installed(package):
            continue
        for item in items:
            if item.get_closest_marker(other):
                item.add_marker(pytest.mark.skip(reason=f"needs {package}, not installed here: {why}"))


def _installed(package: str) -> bool:
    try:
        return importlib.util.find_spec(package) is not None
    except ModuleNotFoundError:  # its parent package is absent
        return False


@pytest.fixture
def mirrored():
    """`mirrored(n)`: a MirroredStrategy over the first n CPU devices."""

    def make(num_replicas):
        if BACKEND == "torch":  # one replica per process there: several need a job (tests/test_torch_backend.py)
            return keras_dist.MirroredStrategy(["cpu:0"])
        return keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(num_replicas)])

    return make


@pytest.fixture(autouse=True)
def _no_leaked_scope():
    yield
    from keras_dist import _context

    leaked = _context.open_scopes()
    _context.reset()
    assert not leaked, f"test left strategy scopes open: {leaked}"


@pytest.fixture
def per_replica_step(monkeypatch):
    """JAX: engines of several replicas train `fit`'s even batches per replica
    (as multi-process CPU jobs do), here in one process."""
    from keras_dist.backends.jax import _engine

    monkeypatch.setattr(
        _engine, "trains_per_replica", lambda engine: engine.num_replicas > 1 and engine.compiler_options is None
    )


def jax_train_step(model):
    """A fresh `JaxStep` for `model`'s training, built as `fit` builds it."""
    from keras_dist._hooks import model_strategy
    from keras_dist.backends.jax._step import JaxStep

    return JaxStep(model, model_strategy(model).extended.engine, "train")
