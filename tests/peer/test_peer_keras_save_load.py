"""tf-keras's `tf_keras/distribute/keras_save_load_test.py` (with the parts
of `saved_model_test_base.py` and `simple_models.py` it runs), ported by
renaming.

Source: keras-team/tf-keras at 6add81a96 (tf_keras/distribute/
keras_save_load_test.py, saved_model_test_base.py, simple_models.py).
Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` -> `pytest.mark.parametrize` over `_combinations`'s
  strategies (tf's names; "gpu" devices are simulated CPU devices; TPU left
  out: README.md). In `test_save_strategy_restore_strategy` the restoring
  strategy is a loop inside each case (every pair still runs); a failing
  pair is named in the assertion.
- Keras 3 spellings, where Keras 3 requires them: `model.save(saved_dir,
  save_format="tf")` -> `model.save(saved_dir + ".keras")` (Keras 3 saves
  only `.keras` files), `saving.legacy.save.load_model` ->
  `keras.saving.load_model`, the legacy `gradient_descent.SGD` ->
  `keras.optimizers.SGD`, `compile(..., cloning=False)` drops `cloning`
  (an argument of tf-keras 1's compile), `tf.constant(np.random.rand(..))`
  -> the NumPy arrays (both backends).
- `tf.data.Dataset...repeat().batch(10)` -> `_combinations.repeated_batches`
  (tf.data on TensorFlow, the same batches as a PyDataset on JAX); 100
  training steps of 10 rows read the 1000 rows once, as upstream's.
- The class's methods are module functions (`self` dropped,
  `self.get_temp_dir()` -> pytest's `tmp_path`, `assertAllClose` ->
  `np.testing.assert_allclose` at tf's tolerances, rtol=atol=1e-6; the
  `setUp` seeds -> `np.random.seed(1337)` in each test).

It runs in `make test-zoo` (1.2 CPU-min over both backends, found nothing
to fix). The subclassed model is a strict xfail, two Keras 3 differences that plain
Keras 3 shows with no strategy (`test_plain_keras_fails_the_subclass_too`):
on JAX it cannot load a subclassed model that is not registered and has no
`get_config`; on TensorFlow it cannot even train one whose class name
starts with "_" (`_SimpleModel` -> the name scope "__simple_model", which
tf refuses: "is not a valid root scope name").
"""

import os

import keras
import numpy as np
import pytest

import _combinations
from _combinations import strategies_minus_tpu

pytestmark = pytest.mark.zoo  # 91 cases, 1.2 CPU-min: make test-zoo
#: The zoo's sample: make test runs this case (tests/_suite_plugin.py), make test-zoo the rest.
ZOO_SAMPLE = 'test_save_strategy_restore_strategy[functional-mirrored_strategy_with_two_gpus-'

_RANDOM_SEED = 1337
PREDICT_STEPS = 1
_BATCH_SIZE = 10


def _get_data_for_simple_models():
    x_train = np.random.rand(1000, 3).astype("float32")
    y_train = np.random.rand(1000, 5).astype("float32")
    x_predict = np.random.rand(1000, 3).astype("float32")
    return x_train, y_train, x_predict


def simple_functional_model():
    output_name = "output_1"
    x = keras.layers.Input(shape=(3,), dtype="float32")
    y = keras.layers.Dense(5, dtype="float32", name=output_name)(x)
    model = keras.Model(inputs=x, outputs=y)
    optimizer = keras.optimizers.SGD(learning_rate=0.001)
    model.compile(loss="mse", metrics=["mae"], optimizer=optimizer)
    return model


def simple_sequential_model():
    output_name = "output_1"
    model = keras.Sequential()
    y = keras.layers.Dense(5, dtype="float32", name=output_name, input_dim=3)
    model.add(y)
    optimizer = keras.optimizers.SGD(learning_rate=0.001)
    model.compile(loss="mse", metrics=["mae"], optimizer=optimizer)
    return model


class _SimpleModel(keras.Model):
    def __init__(self):
        super().__init__()
        self._dense_layer = keras.layers.Dense(5, dtype="float32")

    def call(self, inputs):
        return self._dense_layer(inputs)


def simple_subclass_model():
    model = _SimpleModel()
    optimizer = keras.optimizers.SGD(learning_rate=0.001)
    model.compile(loss="mse", metrics=["mae"], optimizer=optimizer)
    return model


_KERAS3_CANNOT_LOAD = pytest.mark.xfail(
    strict=True,
    reason=(
        "Keras 3 differences (plain Keras too): JAX cannot load an unregistered subclassed model without "
        "get_config; TensorFlow cannot train a model whose class name starts with '_'"
    ),
)

simple_models = [
    pytest.param(simple_functional_model, id="functional"),
    pytest.param(simple_sequential_model, id="sequential"),
    pytest.param(simple_subclass_model, id="subclass", marks=_KERAS3_CANNOT_LOAD),
]


def _save_model(model, saved_dir):
    model.save(saved_dir + ".keras")


def _load_and_run_model(distribution, saved_dir, predict_dataset, output_name="output_1"):
    restored_keras_model = keras.saving.load_model(saved_dir + ".keras")
    return restored_keras_model.predict(predict_dataset, steps=PREDICT_STEPS)


def _train_model(model, x_train, y_train, batch_size):
    training_dataset = _combinations.repeated_batches((x_train, y_train), 1, batch_size)
    # Train the model for 1 epoch
    model.fit(x=training_dataset, epochs=1, steps_per_epoch=100)


def _predict_with_model(distribution, model, predict_dataset):
    return model.predict(predict_dataset, steps=PREDICT_STEPS)


def _get_predict_dataset(x_predict, batch_size):
    return _combinations.repeated_batches(x_predict, 1, batch_size)


def _assert_all_close(expected, actual):
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distribution", strategies_minus_tpu)
@pytest.mark.parametrize("model_and_input", simple_models)
def test_save_no_strategy_restore_strategy(model_and_input, distribution, tmp_path):
    """Save a model without DS, and restore it with DS."""
    np.random.seed(_RANDOM_SEED)
    distribution = _combinations.strategy(distribution)
    saved_dir = os.path.join(tmp_path, "0")

    model = model_and_input()
    x_train, y_train, x_predict = _get_data_for_simple_models()
    batch_size = _BATCH_SIZE
    predict_dataset = _get_predict_dataset(x_predict, batch_size)

    _train_model(model, x_train, y_train, batch_size)
    result_before_save = _predict_with_model(None, model, predict_dataset)

    _save_model(model, saved_dir)

    with distribution.scope():
        result_after_save = _load_and_run_model(
            distribution=distribution, saved_dir=saved_dir, predict_dataset=predict_dataset
        )

    _assert_all_close(result_before_save, result_after_save)


@pytest.mark.parametrize("save_in_scope", [True, False])
@pytest.mark.parametrize("distribution", strategies_minus_tpu)
@pytest.mark.parametrize("model_and_input", simple_models)
def test_save_strategy_restore_no_strategy(model_and_input, distribution, save_in_scope, tmp_path):
    """Save a model with DS, and restore it without DS."""
    np.random.seed(_RANDOM_SEED)
    distribution = _combinations.strategy(distribution)
    saved_dir = os.path.join(tmp_path, "1")

    with distribution.scope():
        model = model_and_input()
        x_train, y_train, x_predict = _get_data_for_simple_models()
        batch_size = _BATCH_SIZE

        _train_model(model, x_train, y_train, batch_size)
        predict_dataset = _get_predict_dataset(x_predict, batch_size)
        result_before_save = _predict_with_model(distribution, model, predict_dataset)

    if save_in_scope:
        with distribution.scope():
            _save_model(model, saved_dir)
    else:
        _save_model(model, saved_dir)

    load_result = _load_and_run_model(distribution=None, saved_dir=saved_dir, predict_dataset=predict_dataset)

    _assert_all_close(result_before_save, load_result)


@pytest.mark.parametrize("save_in_scope", [True, False])
@pytest.mark.parametrize("distribution_for_saving", strategies_minus_tpu)
@pytest.mark.parametrize("model_and_input", simple_models)
def test_save_strategy_restore_strategy(model_and_input, distribution_for_saving, save_in_scope, tmp_path):
    """Save a model with DS, and restore it with potentially different DS."""
    np.random.seed(_RANDOM_SEED)
    distribution_for_saving = _combinations.strategy(distribution_for_saving)
    saved_dir = os.path.join(tmp_path, "2")

    with distribution_for_saving.scope():
        model = model_and_input()
        x_train, y_train, x_predict = _get_data_for_simple_models()
        batch_size = _BATCH_SIZE

        _train_model(model, x_train, y_train, batch_size)
        predict_dataset = _get_predict_dataset(x_predict, batch_size)
        result_before_save = _predict_with_model(distribution_for_saving, model, predict_dataset)

    if save_in_scope:
        with distribution_for_saving.scope():
            _save_model(model, saved_dir)
    else:
        _save_model(model, saved_dir)

    for name in strategies_minus_tpu:  # tf's distribution_for_restoring combinations
        distribution_for_restoring = _combinations.strategy(name)
        with distribution_for_restoring.scope():
            load_result = _load_and_run_model(
                distribution=distribution_for_restoring, saved_dir=saved_dir, predict_dataset=predict_dataset
            )

        try:
            _assert_all_close(result_before_save, load_result)
        except AssertionError as error:
            raise AssertionError(f"restored under {name}: {error}") from None


def test_plain_keras_fails_the_subclass_too(tmp_path):
    """The xfails' reason, shown with no strategy at all."""
    model = simple_subclass_model()
    x, y = np.zeros((10, 3), "float32"), np.zeros((10, 5), "float32")
    if _combinations.BACKEND == "tensorflow":
        with pytest.raises(ValueError, match=r"'__simple_model(_[0-9]+)?' is not a valid root scope name"):
            model.fit(x, y, verbose=0)
        return
    model.fit(x, y, verbose=0)
    path = os.path.join(tmp_path, "plain")
    _save_model(model, path)
    with pytest.raises(TypeError, match="_SimpleModel"):
        keras.saving.load_model(path + ".keras")
