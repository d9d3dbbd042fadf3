"""A JAX ParameterServerStrategy program that ends: Ray must be started
once and stopped once, whatever the exit order of atexit hooks.

argv: MODE
  exit           the program just ends (the strategy's exit hook stops the
                 actors, then Ray's own hook stops Ray)
  user-shutdown  the program calls ray.shutdown() itself first

A finalizer is made before `ray` is imported (as tempfile does), so a
`weakref.finalize` of the strategy runs after Ray's atexit shutdown. Each
ray.init is printed: a second one is a new Ray started at exit.
"""

import sys
import tempfile
import weakref

_scratch = tempfile.TemporaryDirectory()
assert weakref.finalize._registered_with_atexit

import ray  # noqa: E402

_init = ray.init


def _counted_init(*args, **kwargs):
    print("ray.init called", flush=True)
    return _init(*args, **kwargs)


ray.init = _counted_init

import keras  # noqa: E402
import numpy as np  # noqa: E402

import keras_dist  # noqa: E402

mode = sys.argv[1]
resolver = keras_dist.cluster_resolver.SimpleClusterResolver(
    {"chief": ["localhost:2000"], "worker": ["localhost:2100"], "ps": ["localhost:2200"]},
    task_type="chief", task_id=0,
)
strategy = keras_dist.ParameterServerStrategy(resolver)
with strategy.scope():
    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1, bias_initializer="zeros")])
coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)


def write():
    model.layers[0].bias.assign(np.full((1,), 3.0, "float32"))


coordinator.schedule(write)
coordinator.join()
print("bias", float(model.layers[0].bias.numpy()[0]), flush=True)
if mode == "user-shutdown":
    ray.shutdown()
    for name, call in [("schedule", lambda: coordinator.schedule(write)), ("join", coordinator.join)]:
        try:
            call()
        except RuntimeError as error:
            print(f"{name} refused:", error, flush=True)
