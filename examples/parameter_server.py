"""Parameter-server training with keras_dist (the TensorFlow backend).

Run it as the coordinator of a local cluster of 2 workers and 1 ps:

    KERAS_BACKEND=tensorflow keras-dist launch --workers 2 --ps 1 examples/parameter_server.py

`keras-dist launch` starts the worker and ps tasks (`python -m
keras_dist.serve`) and this script as the `chief`, all with TF_CONFIG. It
trains with `model.fit` on a dataset function, then with a
`ClusterCoordinator` loop, and prints "MATCH" when every scheduled step
was applied exactly once and the accuracy is in single-device training's band.
"""

import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import keras  # noqa: E402
import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import keras_dist  # noqa: E402

rng = np.random.default_rng(0)
x = rng.normal(size=(512, 8)).astype("float32")
y = (x[:, :1] + 0.5 * x[:, 1:2] > 0).astype("float32")


def dataset_fn(input_context):
    batch = input_context.get_per_replica_batch_size(32)
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(512, seed=0).batch(batch).repeat()


def make_model():
    keras.utils.set_random_seed(1)
    return keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")])


strategy = keras_dist.ParameterServerStrategy(keras_dist.cluster_resolver.TFConfigClusterResolver())
with strategy.scope():
    model = make_model()
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
model.fit(keras_dist.experimental.DatasetCreator(dataset_fn), epochs=3, steps_per_epoch=20, verbose=2)

# A custom loop: schedule steps on the workers, then wait for them.
coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))


@tf.function
def step(iterator):
    def replica(batch):
        features, labels = batch
        with tf.GradientTape() as tape:
            loss = keras.ops.mean(keras.losses.binary_crossentropy(labels, model(features)))
        gradients = tape.gradient(loss, model.trainable_variables)
        model.optimizer.apply(gradients, model.trainable_variables)
        return loss

    return strategy.run(replica, args=(next(iterator),))


losses = [coordinator.schedule(step, args=(iterator,)) for _ in range(40)]
coordinator.join()
print("last loss", losses[-1].fetch())

accuracy = model.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["accuracy"]
reference = make_model()
reference.compile(optimizer=keras.optimizers.Adam(0.01), loss="binary_crossentropy", metrics=["accuracy"])
reference.fit(dataset_fn(keras_dist.InputContext()), epochs=3, steps_per_epoch=20 + 40 // 3, verbose=0)
single = reference.evaluate(x, y, batch_size=128, verbose=0, return_dict=True)["accuracy"]
iterations = int(model.optimizer.iterations.numpy())
print(f"iterations {iterations} of {3 * 20 + 40}; accuracy {accuracy:.3f} (one device: {single:.3f})")
if iterations == 3 * 20 + 40 and accuracy >= single - 0.05:
    print("MATCH")
