"""Parameter-server training with keras_dist on JAX (Ray actors).

Run it as the coordinator of a local cluster of 2 workers and 2 ps:

    KERAS_BACKEND=jax keras-dist launch --workers 2 --ps 2 examples/parameter_server_jax.py

On JAX the launcher starts no server processes: TF_CONFIG gives the
cluster's shape and the strategy starts one Ray actor per worker and ps
task on this machine (`pip install "keras-dist[jax,ray]"`). The script
trains with `model.fit` on a dataset function, then with a
`ClusterCoordinator` loop in JAX's style (gradients from
`jax.value_and_grad` over `model.stateless_call`, pushed by
`optimizer.apply_gradients`), and prints "MATCH" when every scheduled step
was applied exactly once and the accuracy is in single-device training's band.
"""

import itertools

import jax
import keras
import numpy as np

import keras_dist

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")
BATCH = 32


def dataset_fn(input_context=None):
    """Each worker's input: the batches in a seeded random order, forever."""
    order = np.random.default_rng(0).permutation(len(x))

    def batches():
        for i in itertools.count():
            rows = order[(i * BATCH) % len(x) :][:BATCH]
            yield x[rows], y[rows]

    return batches()


def make_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="tanh"), keras.layers.Dense(1, activation="sigmoid")])


strategy = keras_dist.ParameterServerStrategy(keras_dist.cluster_resolver.TFConfigClusterResolver())
with strategy.scope():
    model = make_model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
model.fit(keras_dist.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=20, verbose=2)

# A custom loop: schedule steps on the workers, then wait for them.
coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


def step(iterator):
    features, labels = next(iterator)

    def loss_fn(trainable):
        non_trainable = [v.value for v in model.non_trainable_variables]
        predictions, _ = model.stateless_call(trainable, non_trainable, features, training=True)
        return keras.ops.mean(keras.losses.binary_crossentropy(labels, predictions))

    loss, gradients = jax.value_and_grad(loss_fn)([v.value for v in model.trainable_variables])
    model.optimizer.apply_gradients(zip(gradients, model.trainable_variables))  # the push to the ps
    return loss


losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(40)]
coordinator.join()
print("last loss", float(losses[-1].fetch()))

accuracy = model.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["accuracy"]
reference = make_model()
reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
reference_batches = dataset_fn()
for _ in range(3 * 20 + 40):
    reference.train_on_batch(*next(reference_batches))
single = reference.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["accuracy"]
iterations = int(model.optimizer.iterations.numpy())
print(f"iterations {iterations} of {3 * 20 + 40}; accuracy {accuracy:.3f} (one device: {single:.3f})")
if iterations == 3 * 20 + 40 and accuracy >= single - 0.05:
    print("MATCH")
