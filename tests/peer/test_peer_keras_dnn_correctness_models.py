"""tf-keras's `tf_keras/distribute/keras_dnn_correctness_test.py`: its two
model-correctness classes (`TestDistributionStrategyDnnCorrectness` and its
subclassed-model variant), ported by renaming: a 4-layer MLP with an L2
regulariser, trained on 9984 rows (and on 10000, a partial last batch),
evaluated and used for prediction under each strategy against the same
model without one, from NumPy arrays and `tf.data` datasets, with and
without validation data, and with a learning rate a callback changes every
batch. (Its two metric classes: test_peer_keras_dnn_correctness.py, in
`make test`; these cost too much for it and run in `make test-zoo`.)

Source: keras-team/tf-keras at dd0a7237b, with its base class from
`keras_correctness_test_base.py` (ported in `_correctness_base.py`, which
lists its changes, `run_dynamic_lr_test` among them). Changes here, all of
them:
- `tf_keras` -> `keras`; tf's `combinations.generate(...)` ->
  `_correctness_base.parametrize` over the same combinations, eager only
  (Keras 3 has no graph mode), without TPU and multi-worker ones
  (README.md). Each method runs a rotation of its combinations (each
  strategy once), all of them with KERAS_DIST_PEER_FULL_MATRIX=1
  (`_correctness_base.select`).
- `test_dnn_with_dynamic_learning_rate`'s combinations are graph mode only
  upstream (`all_strategy_combinations_with_graph_mode`); Keras 3 has only
  eager mode, so it runs eagerly, over every strategy.
  `test_dnn_correctness_with_partial_last_batch_eval` is not ported: its
  combinations are TPU and multi-worker only.
- The classes' names gain a `Test` suffix where pytest needs one; the
  subclassed variant's branches for graph mode (tf-keras refused a
  subclassed model there) are dropped with graph mode: in eager mode
  upstream runs the correctness test itself, as here.
- `gradient_descent_keras.SGD(0.05)` (legacy) -> `keras.optimizers.SGD(0.05)`;
  `keras.layers.Dense(10, activation="relu", input_shape=(1,))` kept (Keras 3
  takes it in a Sequential model's first layer); in the subclassed model,
  where Keras 3 refuses `input_shape` outside a Sequential model, dropped:
  the model is built by `self.build(input_shapes)` as upstream.
- `distribution.extended.experimental_enable_get_next_as_optional = True`
  kept (keras_dist's partial last batch needs nothing; the attribute is
  set as upstream sets it).
- `test_utils.run_all_without_tensor_float_32` dropped (CPU devices).

Expected failures (strict): every case of the subclassed variant, a Keras 3
difference (`_subclass_built_without_weights` says why;
`test_plain_keras_builds_the_subclassed_model_without_weights` shows it);
its inherited partial-last-batch method is restated to carry the mark.
"""

import keras
import numpy as np
import pytest

import _combinations
import _correctness_base as keras_correctness_test_base

pytestmark = [pytest.mark.zoo, pytest.mark.needs_tensorflow]  # make test-zoo; tf.data input on JAX too
#: The zoo's sample: make test runs this case (tests/_suite_plugin.py), make test-zoo the rest.
ZOO_SAMPLE = 'DnnCorrectness::test_dnn_correctness_with_partial_last_batch[mirrored_strategy_with_gpu_and_cpu-'

_ALL = keras_correctness_test_base.all_strategy_and_input_config_combinations_eager()
_MINUS_TPU = keras_correctness_test_base.strategy_minus_tpu_and_input_config_combinations_eager()
_select = keras_correctness_test_base.select


def _dynamic_lr_strategies(rotation):
    """Every strategy with KERAS_DIST_PEER_FULL_MATRIX=1; else half of them,
    the other half in the other class (`rotation` 0 or 1)."""
    names = list(_combinations.all_strategies)
    if keras_correctness_test_base.FULL_MATRIX:
        return names
    return names[rotation::2]


class TestDistributionStrategyDnnCorrectness(keras_correctness_test_base.TestDistributionStrategyCorrectnessBase):
    def get_model(self, initial_weights=None, distribution=None, input_shapes=None):
        with keras_correctness_test_base.MaybeDistributionScope(distribution):
            # We add few non-linear layers to make it non-trivial.
            model = keras.Sequential()
            model.add(keras.layers.Dense(10, activation="relu", input_shape=(1,)))
            model.add(
                keras.layers.Dense(
                    10,
                    activation="relu",
                    kernel_regularizer=keras.regularizers.l2(1e-4),
                )
            )
            model.add(keras.layers.Dense(10, activation="relu"))
            model.add(keras.layers.Dense(1))

            if initial_weights:
                model.set_weights(initial_weights)

            model.compile(
                loss=keras.losses.mean_squared_error,
                optimizer=keras.optimizers.SGD(0.05),
                metrics=["mse"],
            )
            return model

    def get_data(self):
        x_train = np.random.rand(9984, 1).astype("float32")
        y_train = 3 * x_train
        x_predict = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
        return x_train, y_train, x_predict

    def get_data_with_partial_last_batch(self):
        x_train = np.random.rand(10000, 1).astype("float32")
        y_train = 3 * x_train
        x_eval = np.random.rand(10000, 1).astype("float32")
        y_eval = 3 * x_eval
        x_predict = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
        return x_train, y_train, x_eval, y_eval, x_predict

    def get_data_with_partial_last_batch_eval(self):
        x_train = np.random.rand(9984, 1).astype("float32")
        y_train = 3 * x_train
        x_eval = np.random.rand(10000, 1).astype("float32")
        y_eval = 3 * x_eval
        x_predict = np.array([[1.0], [2.0], [3.0], [4.0]], dtype=np.float32)
        return x_train, y_train, x_eval, y_eval, x_predict

    @keras_correctness_test_base.parametrize(_select(_ALL, 0))
    def test_dnn_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data)

    @keras_correctness_test_base.parametrize(_select(_MINUS_TPU, 1))
    def test_dnn_correctness_with_partial_last_batch(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        distribution.extended.experimental_enable_get_next_as_optional = True
        self.run_correctness_test(
            distribution,
            use_numpy,
            use_validation_data,
            partial_last_batch="train_and_eval",
            training_epochs=1,
        )

    @pytest.mark.parametrize("distribution", _dynamic_lr_strategies(0))
    def test_dnn_with_dynamic_learning_rate(self, distribution):
        self.run_dynamic_lr_test(_combinations.strategy(distribution))


class SubclassedModel(keras.Model):
    def __init__(self, initial_weights, input_shapes):
        super().__init__()
        self.dense1 = keras.layers.Dense(10, activation="relu")
        self.dense2 = keras.layers.Dense(
            10,
            activation="relu",
            kernel_regularizer=keras.regularizers.l2(1e-4),
        )
        self.dense3 = keras.layers.Dense(10, activation="relu")
        self.dense4 = keras.layers.Dense(1)
        if input_shapes:
            self.build(input_shapes)
        else:
            # This covers cases when the input is DatasetV1Adapter.
            self.build((None, 1))
        if initial_weights:
            self.set_weights(initial_weights)

    def call(self, inputs):
        x = self.dense1(inputs)
        x = self.dense2(x)
        x = self.dense3(x)
        return self.dense4(x)


#: Every case of the subclassed variant, the default strategy's (plain Keras) included.
_subclass_built_without_weights = pytest.mark.xfail(
    strict=False,
    raises=AssertionError,
    reason=(
        "Keras 3 difference: `self.build(input_shapes)` of a subclassed model without a `build()` method marks it "
        "built and makes no weights (Keras warns), so `get_weights()` is empty and the two models start from their "
        "own random weights; the default strategy's case (plain Keras) fails the same "
        "(test_plain_keras_builds_the_subclassed_model_without_weights, which asserts the difference itself). Not "
        "strict: two models from independent random weights sometimes train to within tf's tolerance by chance "
        "(one case did at XLA's -O2 on an AMD EPYC CPU)"
    ),
)


def test_plain_keras_builds_the_subclassed_model_without_weights():
    """Why the subclassed variant fails with plain Keras 3 too: after its
    `__init__`'s `self.build(...)` the model has no weights to copy."""
    with pytest.warns(UserWarning, match="does not have a `build\\(\\)` method implemented"):
        model = SubclassedModel(None, (None, 1))
    assert model.built and model.get_weights() == []


class TestDistributionStrategyDnnCorrectnessWithSubclassedModel(TestDistributionStrategyDnnCorrectness):
    def get_model(self, initial_weights=None, distribution=None, input_shapes=None):
        with keras_correctness_test_base.MaybeDistributionScope(distribution):
            model = SubclassedModel(initial_weights, input_shapes)

            model.compile(
                loss=keras.losses.mean_squared_error,
                optimizer=keras.optimizers.SGD(0.05),
                metrics=["mse"],
            )
            return model

    @_subclass_built_without_weights
    @keras_correctness_test_base.parametrize(_select(_MINUS_TPU, 1))
    def test_dnn_correctness_with_partial_last_batch(self, distribution, use_numpy, use_validation_data):
        # (upstream inherits it; restated here only to mark it)
        super().test_dnn_correctness_with_partial_last_batch(distribution, use_numpy, use_validation_data)

    @_subclass_built_without_weights
    @keras_correctness_test_base.parametrize(_select(_ALL, 2))
    def test_dnn_correctness(self, distribution, use_numpy, use_validation_data):
        # (tf: in eager mode, or under the default strategy, the correctness
        # test; graph mode refused subclassed models)
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data)

    @_subclass_built_without_weights
    @pytest.mark.parametrize("distribution", _dynamic_lr_strategies(1))
    def test_dnn_with_dynamic_learning_rate(self, distribution):
        # (tf: eagerly off TPUs, or under the default strategy, the test)
        self.run_dynamic_lr_test(_combinations.strategy(distribution))
