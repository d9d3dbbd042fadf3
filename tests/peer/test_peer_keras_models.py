"""tf-keras's `tf_keras/distribute/keras_models_test.py`, ported by renaming.

Source: keras-team/tf-keras at 6add81a96 (tf_keras/distribute/
keras_models_test.py). Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` (`all_strategies`, eager) -> `pytest.mark.parametrize`
  over `_combinations.all_strategies` (tf's names; "gpu" devices are
  simulated CPU devices; TPU and multi-worker left out: README.md); the test
  class's method is a module function (`self` dropped,
  `self.assertEqual` -> `assert ==`).

One row predicted over up to two replicas: the second replica has no row.
"""

import keras
import numpy as np
import pytest

import _combinations
from _combinations import all_strategies


@pytest.mark.parametrize("distribution", all_strategies)
def test_lstm_model_with_dynamic_batch(distribution):
    distribution = _combinations.strategy(distribution)
    input_data = np.random.random([1, 32, 64, 64, 3])
    input_shape = tuple(input_data.shape[1:])

    def build_model():
        model = keras.models.Sequential()
        model.add(
            keras.layers.ConvLSTM2D(
                4,
                kernel_size=(4, 4),
                activation="sigmoid",
                padding="same",
                input_shape=input_shape,
            )
        )
        model.add(keras.layers.GlobalMaxPooling2D())
        model.add(keras.layers.Dense(2, activation="sigmoid"))
        return model

    with distribution.scope():
        model = build_model()
        model.compile(loss="binary_crossentropy", optimizer="adam")
        result = model.predict(input_data)
        assert result.shape == (1, 2)
