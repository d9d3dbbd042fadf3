"""The coordinator of `benchmarks/parameter_server.py`'s job (started by
`keras-dist launch --workers W --ps P`): times the same scheduled SGD step
through keras_dist's coordinator (each ps write gated: exactly once) and
through tf's own `ClusterCoordinator.schedule` (at least once), alternating
rounds in one process; writes the medians to OUT.

argv: OUT STEPS ROUNDS WIDTH
"""

import json
import os
import statistics
import sys
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_dist  # noqa: E402

out, steps, rounds, width = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
BATCH = 64
rng = np.random.default_rng(0)
X = rng.normal(size=(1024, 64)).astype("float32")
Y = rng.integers(0, 10, size=(1024,)).astype("int32")

strategy = keras_dist.ParameterServerStrategy(keras_dist.cluster_resolver.TFConfigClusterResolver())
coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
with strategy.scope():
    keras.utils.set_random_seed(0)
    model = keras.Sequential([
        keras.Input((64,)), keras.layers.Dense(width, activation="relu"),
        keras.layers.Dense(width, activation="relu"), keras.layers.Dense(10),
    ])
    optimizer = keras.optimizers.SGD(0.01)
    optimizer.build(model.trainable_variables)
iterator = iter(coordinator.create_per_worker_dataset(
    lambda: tf.data.Dataset.from_tensor_slices((X, Y)).batch(BATCH).repeat()
))


@tf.function
def step(iterator):
    def replica(batch):
        x, y = batch
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.sparse_categorical_crossentropy(y, model(x), from_logits=True))
        optimizer.apply(tape.gradient(loss, model.trainable_variables), model.trainable_variables)
        return loss

    return strategy.run(replica, args=(next(iterator),))


native = coordinator._engine  # tf's ClusterCoordinator itself
paths = {
    "keras_dist (exactly once)": lambda: coordinator.schedule(step, args=(iterator,)),
    "tf ClusterCoordinator (at least once)": lambda: native.schedule(step, args=(iterator,)),
}
times = {name: [] for name in paths}
for name, schedule in paths.items():  # trace and warm up
    for _ in range(5):
        schedule()
    coordinator.join()
start_iterations = int(optimizer.iterations.numpy())
for _ in range(rounds):
    for name, schedule in paths.items():
        start = time.perf_counter()
        for _ in range(steps):
            schedule()
        coordinator.join()
        times[name].append((time.perf_counter() - start) / steps)
counted = int(optimizer.iterations.numpy()) - start_iterations
report = {
    "step_s": {name: statistics.median(values) for name, values in times.items()},
    "scheduled": rounds * steps * len(paths),
    "counted": counted,
    "parameters": int(sum(np.prod(v.shape) for v in model.trainable_variables)),
}
with open(out, "w") as f:
    json.dump(report, f)
