"""tensorflow.org `tutorials/distribute/multi_worker_with_ctl`'s `mnist.py`
as written (renamed: `tf.keras` -> `keras`), but for its data:
`tf.keras.datasets.mnist.load_data()` is `mnist_like(20000, 0)`, a synthetic
stand-in (no downloads here; tests/_helpers.py), with enough rows for the
tutorial's 70 steps an epoch of 64 rows on each of 2 workers (10000 each)."""

import os
import sys

import tensorflow as tf
import numpy as np
import keras

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))  # tests/, for _helpers
from _helpers import mnist_like  # noqa: E402


def mnist_dataset(batch_size):
    (x_train, y_train), _ = mnist_like(20000, 0), None  # was tf.keras.datasets.mnist.load_data()
    # The `x` arrays are in uint8 and have values in the range [0, 255].
    # You need to convert them to float32 with values in the range [0, 1]
    x_train = x_train[..., 0] / np.float32(255)
    y_train = y_train.astype(np.int64)
    train_dataset = tf.data.Dataset.from_tensor_slices((x_train, y_train)).shuffle(60000)
    return train_dataset


def dataset_fn(global_batch_size, input_context):
    batch_size = input_context.get_per_replica_batch_size(global_batch_size)
    dataset = mnist_dataset(batch_size)
    dataset = dataset.shard(input_context.num_input_pipelines, input_context.input_pipeline_id)
    dataset = dataset.batch(batch_size)
    return dataset


def build_cnn_model():
    regularizer = keras.regularizers.L2(1e-5)
    return keras.Sequential([
        keras.Input(shape=(28, 28)),
        keras.layers.Reshape(target_shape=(28, 28, 1)),
        keras.layers.Conv2D(32, 3, activation="relu", kernel_regularizer=regularizer),
        keras.layers.Flatten(),
        keras.layers.Dense(128, activation="relu", kernel_regularizer=regularizer),
        keras.layers.Dense(10, kernel_regularizer=regularizer),
    ])
