"""XLA's CPU client with simulated devices, pushed the way Keras' `fit`
pushes it: a jitted step with an all-reduce over 4 devices, its argument
donated, a new batch put on the devices each step, results read by other
threads (Keras' async callbacks) and bursts of small eager ops (metric
results), never waiting for the device.

    python tests/workers/xla_cpu_pool.py STEPS           # keras_dist.simulate_cpu_devices(4)
    python tests/workers/xla_cpu_pool.py STEPS --threads N   # XLA's pools forced to N threads

Under CPU load, with the pools at 4 threads (what XLA picks for 4 devices on
2 cores) it deadlocks (XLA aborts after 40 s: "Termination timeout for all
reduce"); `tests/test_stress.py` runs it with keras_dist's sizing. Prints
"done" and the seconds taken.
"""

import argparse
import os
import queue
import threading
import time

import numpy as np

parser = argparse.ArgumentParser()
parser.add_argument("steps", type=int)
parser.add_argument("--threads", type=int, default=None)
args = parser.parse_args()
if args.threads is not None:
    os.environ["NPROC"] = str(args.threads)
os.environ.setdefault("KERAS_BACKEND", "jax")

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
from jax.sharding import Mesh, NamedSharding, PartitionSpec  # noqa: E402

import keras_dist  # noqa: E402

keras_dist.simulate_cpu_devices(4)
mesh = Mesh(jax.devices(), ("batch",))
rows = NamedSharding(mesh, PartitionSpec("batch"))
w = jax.device_put(jnp.ones((64, 64)), NamedSharding(mesh, PartitionSpec()))


def step(w, x):
    g = jnp.mean(x @ w, axis=0)  # a mean over the split rows: an all-reduce
    return w - 0.001 * g[None, :], jnp.sum(g)


step = jax.jit(step, donate_argnums=0)
losses = queue.Queue()


def read():
    while (loss := losses.get()) is not None:
        np.asarray(loss)


readers = [threading.Thread(target=read) for _ in range(4)]
for reader in readers:
    reader.start()
start = time.time()
for i in range(args.steps):
    w, loss = step(w, jax.device_put(np.ones((64, 64), np.float32), rows))
    losses.put(loss)
    if i % 20 == 0:
        for _ in range(40):
            small = w[0] * 2 + 1
for reader in readers:
    losses.put(None)
for reader in readers:
    reader.join()
print(f"done {float(small[0]):.1f} in {time.time() - start:.1f} s, "
      f"NPROC={os.environ.get('NPROC')}")
