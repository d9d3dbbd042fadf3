"""tensorflow.org `tutorials/distribute/multi_worker_with_keras`'s
`mnist_setup.py` as written (renamed: `tf.keras` -> `keras`), but for its
data: `tf.keras.datasets.mnist.load_data()` is `mnist_like(6000, 0)`, a
synthetic stand-in (no downloads here: uint8 28x28 images whose label
names a band of rows drawn brighter; tests/_helpers.py)."""

import os
import sys

import tensorflow as tf
import numpy as np
import keras

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/, for _helpers
from _helpers import mnist_like  # noqa: E402


def mnist_dataset(batch_size):
    (x_train, y_train), _ = mnist_like(6000, 0), None  # was tf.keras.datasets.mnist.load_data()
    # The `x` arrays are in uint8 and have values in the [0, 255] range.
    # You need to convert them to float32 with values in the [0, 1] range.
    x_train = x_train[..., 0] / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(60000).repeat().batch(batch_size)
    return train_dataset


def build_and_compile_cnn_model():
    model = keras.Sequential([
        keras.layers.InputLayer(input_shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu"),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu"),
        keras.layers.Dense(10),
    ])
    model.compile(
        loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        optimizer=keras.optimizers.SGD(learning_rate=0.001),
        metrics=["accuracy"],
    )
    return model
