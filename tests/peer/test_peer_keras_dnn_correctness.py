"""tf-keras's `tf_keras/distribute/keras_dnn_correctness_test.py`: its two
metric-correctness classes, ported by renaming.

Source: keras-team/tf-keras at 6add81a96 (tf_keras/distribute/
keras_dnn_correctness_test.py), with what they use of
`keras_correctness_test_base.py` (`set_up_test_config`, `get_data`,
`get_batch_size`, `batch_wrapper`). Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` (`all_strategies`, graph and eager, plus the multi-worker
  ones) -> `pytest.mark.parametrize` over `_combinations.all_strategies`
  (tf's names; "gpu" devices are simulated CPU devices; TPU and
  multi-worker left out: README.md); eager only (Keras 3 has no graph
  mode); the test classes' methods are module functions (`self` dropped,
  `self.assertEqual` -> `assert ==`, `self.cached_session()` dropped).
- The datasets: `tf.data.Dataset.from_tensor_slices(...)` (`.repeat()`)
  then `.batch(b)` -> `_combinations.repeated_batches` (that tf.data
  dataset on TensorFlow; on JAX a `keras.utils.PyDataset` of the same
  batches; `.repeat()` forever -> 100 times, more than the steps taken).
- `get_batch_size(64, distribution)` is 64: keras_dist takes global batch
  sizes on every strategy (tf divided it only for TPUs).
- `tf.compat.v1.set_random_seed` -> `keras.utils.set_random_seed`;
  Keras 3 spellings where Keras 3 requires them:
  `gradient_descent_keras.SGD(0.05)` (legacy) and
  `tf.compat.v1.train.GradientDescentOptimizer(0.001)` ->
  `keras.optimizers.SGD(...)` with the same learning rate.
- `TestDistributionStrategyDnnCorrectness` and its subclassed variant
  (fit/evaluate/predict of 9984 rows against one device, too costly for
  `make test`): test_peer_keras_dnn_correctness_models.py (`make test-zoo`).
"""

import keras
import numpy as np
import pytest

import _combinations
from _combinations import all_strategies

_RANDOM_SEED = 1337


def set_up_test_config():
    keras.backend.set_image_data_format("channels_last")
    np.random.seed(_RANDOM_SEED)
    keras.utils.set_random_seed(_RANDOM_SEED)


def get_data():
    num_samples = 10000
    x_train = np.random.randint(0, 2, num_samples)
    x_train = np.reshape(x_train, (num_samples, 1))
    y_train = x_train
    return (x_train.astype("float32"), y_train.astype("float32"), None)


# TestDistributionStrategyDnnMetricCorrectness


def _metric_model(distribution):
    with distribution.scope():
        model = keras.Sequential()
        model.add(keras.layers.Dense(1, input_shape=(1,), kernel_initializer="ones"))
        model.compile(
            loss=keras.losses.mean_squared_error,
            optimizer=keras.optimizers.SGD(0.05),
            metrics=[keras.metrics.BinaryAccuracy()],
        )
    return model


@pytest.mark.parametrize("distribution", all_strategies)
def test_simple_dnn_metric_correctness(distribution):
    distribution = _combinations.strategy(distribution)
    set_up_test_config()

    x_train, y_train, _ = get_data()
    model = _metric_model(distribution=distribution)

    batch_size = 64
    train_dataset = _combinations.repeated_batches((x_train, y_train), repeat=1, batch_size=batch_size)

    history = model.fit(x=train_dataset, epochs=2, steps_per_epoch=10)
    assert history.history["binary_accuracy"] == [1.0, 1.0]


# TestDistributionStrategyDnnMetricEvalCorrectness


def _eval_model(distribution):
    with distribution.scope():
        model = keras.Sequential()
        model.add(keras.layers.Dense(3, activation="relu", input_dim=4, kernel_initializer="ones"))
        model.add(keras.layers.Dense(1, activation="sigmoid", kernel_initializer="ones"))
        model.compile(
            loss="mae",
            metrics=["accuracy", keras.metrics.BinaryAccuracy()],
            optimizer=keras.optimizers.SGD(0.001),
        )
    return model


@pytest.mark.parametrize("distribution", all_strategies)
def test_identity_model_metric_eval_correctness(distribution):
    distribution = _combinations.strategy(distribution)
    set_up_test_config()

    model = _eval_model(distribution=distribution)

    # verify correctness of stateful and stateless metrics.
    x = np.ones((100, 4)).astype("float32")
    y = np.ones((100, 1)).astype("float32")
    dataset = _combinations.repeated_batches((x, y), repeat=100, batch_size=4)
    outs = model.evaluate(dataset, steps=10)
    assert outs[1] == 1.0
    assert outs[2] == 1.0

    y = np.zeros((100, 1)).astype("float32")
    dataset = _combinations.repeated_batches((x, y), repeat=100, batch_size=4)
    outs = model.evaluate(dataset, steps=10)
    assert outs[1] == 0.0
    assert outs[2] == 0.0
