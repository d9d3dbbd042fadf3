"""`simulate_cpu_devices` on JAX gives XLA's CPU client enough threads.

XLA sizes its CPU pools max(cores, devices); with 4 simulated devices on 2
cores a collective can deadlock under load (`tests/workers/xla_cpu_pool.py`
reproduces it; `tests/test_stress.py` runs it under load). Each test starts
a fresh process: the backend of this one has already started.
"""

import os
import subprocess
import sys
import textwrap

import pytest

from conftest import BACKEND

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = [
    pytest.mark.skipif(BACKEND != "jax", reason="XLA's CPU client is JAX's engine"),
    pytest.mark.skipif(not os.path.isdir("/proc/self/task"), reason="counts threads in /proc (Linux)"),
]

_PROBE = textwrap.dedent(
    """
    import glob, os
    import keras_dist
    from keras_dist.backends.jax import _engine
    keras_dist.simulate_cpu_devices(4)
    import jax
    jax.numpy.ones(4).block_until_ready()  # the backend starts here
    names = [open(path).read().strip() for path in glob.glob("/proc/self/task/*/comm")]
    print(names.count("tf_XLAEigen"), os.environ.get("NPROC"), _engine.cpu_client_threads(4))
    """
)


def _probe(**env):
    environ = {k: v for k, v in os.environ.items() if k != "NPROC"}
    environ.update(env, KERAS_BACKEND="jax", PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", _PROBE], env=environ, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    pool, nproc, wanted = done.stdout.split()[-3:]
    return int(pool), nproc, int(wanted)


@pytest.mark.starts_processes
def test_four_simulated_devices_get_four_threads_each():
    pool, nproc, wanted = _probe()
    assert wanted >= 16
    assert pool == wanted and nproc == str(wanted)  # XLA's pool without it: max(cores, 4)


@pytest.mark.starts_processes
def test_a_thread_count_the_user_set_is_kept():
    pool, nproc, _ = _probe(NPROC="6")
    assert (pool, nproc) == (6, "6")
