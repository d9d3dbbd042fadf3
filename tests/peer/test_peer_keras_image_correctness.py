"""tf-keras's `tf_keras/distribute/keras_image_model_correctness_test.py`,
ported by renaming: a CNN (a strided Conv2D with an L2 regulariser, max
pooling, a softmax head), alone, with a BatchNormalization and with two
synchronized ones side by side, trained, evaluated and used for prediction
under every strategy against the same model without one, from NumPy arrays
and `tf.data` datasets, with and without validation data.

Source: keras-team/tf-keras at dd0a7237b, with its base class from
`keras_correctness_test_base.py` (ported in `_correctness_base.py`, which
lists its changes). Changes here, all of them:
- `tf_keras` -> `keras`; tf's `combinations.generate(...)` ->
  `_correctness_base.parametrize` over the same combinations (every
  strategy; the graph-mode halves dropped, Keras 3 has none; the
  multi-worker and TPU ones left out: README.md).
- The class is named with a `Test` prefix so pytest collects it
  (`TestDistributionStrategyCnnCorrectnessTest`); `distribution` is the
  strategy's tf name, made into the keras_dist strategy at the start of
  each method; `gradient_descent.SGD(learning_rate=0.1)` (legacy) ->
  `keras.optimizers.SGD(learning_rate=0.1)`.
- Each method runs a rotation of its combinations (6 of 24: each strategy
  once), all 24 with KERAS_DIST_PEER_FULL_MATRIX=1 (`_correctness_base.select`).
- `test_utils.run_all_without_tensor_float_32` and `run_v2_only` dropped
  (CPU devices; Keras 3 is TF2 only). `test_cnn_correctness` skips
  CentralStorage upstream (b/183958183, a tf bug); here it runs, and passes.

Expected failures (strict), each a difference of keras_dist or Keras 3:
- The two `with_batch_norm="regular"` methods assert that on several
  replicas the results differ from one device's (tf's BatchNormalization
  normalised each replica's rows alone). keras_dist's BatchNormalization
  uses the global batch's statistics, so the distributed run equals one
  device's and the method's `assertRaises(AssertionError)` fails.
- On JAX, `BatchNormalization(synchronized=True)` is refused by plain Keras
  3 outside a strategy ("only supported with the TensorFlow backend"), and
  the method builds its reference model outside one. Under a keras_dist
  strategy it is accepted (tests/test_hooks.py).
"""

import keras
import numpy as np
import pytest

import _combinations
import _correctness_base as keras_correctness_test_base

pytestmark = [pytest.mark.zoo, pytest.mark.needs_tensorflow]  # make test-zoo; tf.data input on JAX too
#: The zoo's sample: make test runs this case (tests/_suite_plugin.py), make test-zoo the rest.
ZOO_SAMPLE = 'test_cnn_correctness[mirrored_strategy_with_two_gpus-'

BACKEND = _combinations.BACKEND
_ALL = keras_correctness_test_base.all_strategy_and_input_config_combinations_eager()
_select = keras_correctness_test_base.select

_global_statistics = pytest.mark.xfail(
    strict=True,
    raises=pytest.fail.Exception,
    reason=(
        "keras_dist difference: its BatchNormalization uses the global batch's statistics on every replica, so the "
        "distributed run matches one device's; the method asserts they differ (tf's per-replica statistics)"
    ),
)
_synchronized_refused_on_jax = pytest.mark.xfail(
    BACKEND == "jax",
    strict=True,
    raises=ValueError,
    reason=(
        "Keras 3 difference: plain Keras on JAX refuses BatchNormalization(synchronized=True) outside a strategy "
        "(the method's reference model); keras_dist accepts it under a strategy"
    ),
)


#: Regular BatchNormalization on several replicas: global statistics.
_SEVERAL_REPLICAS = {
    name: _global_statistics
    for name in [*_combinations.multidevice_strategies, "central_storage_strategy_with_gpu_and_cpu"]
}


class TestDistributionStrategyCnnCorrectnessTest(keras_correctness_test_base.TestDistributionStrategyCorrectnessBase):
    def get_model(self, initial_weights=None, distribution=None, input_shapes=None):
        del input_shapes
        with keras_correctness_test_base.MaybeDistributionScope(distribution):
            image = keras.layers.Input(shape=(28, 28, 3), name="image")
            c1 = keras.layers.Conv2D(
                name="conv1",
                filters=16,
                kernel_size=(3, 3),
                strides=(4, 4),
                kernel_regularizer=keras.regularizers.l2(1e-4),
            )(image)
            if self.with_batch_norm == "regular":
                c1 = keras.layers.BatchNormalization(name="bn1")(c1)
            elif self.with_batch_norm == "sync":
                # Test with parallel batch norms to verify all-reduce works OK.
                bn1 = keras.layers.BatchNormalization(name="bn1", synchronized=True)(c1)
                bn2 = keras.layers.BatchNormalization(name="bn2", synchronized=True)(c1)
                c1 = keras.layers.Add()([bn1, bn2])
            c1 = keras.layers.MaxPooling2D(pool_size=(2, 2))(c1)
            logits = keras.layers.Dense(10, activation="softmax", name="pred")(keras.layers.Flatten()(c1))
            model = keras.Model(inputs=[image], outputs=[logits])

            if initial_weights:
                model.set_weights(initial_weights)

            model.compile(
                optimizer=keras.optimizers.SGD(learning_rate=0.1),
                loss="sparse_categorical_crossentropy",
                metrics=["sparse_categorical_accuracy"],
            )

        return model

    def _get_data(self, count, shape=(28, 28, 3), num_classes=10):
        centers = np.random.randn(num_classes, *shape)

        features = []
        labels = []
        for _ in range(count):
            label = np.random.randint(0, num_classes, size=1)[0]
            offset = np.random.normal(loc=0, scale=0.1, size=np.prod(shape))
            offset = offset.reshape(shape)
            labels.append(label)
            features.append(centers[label] + offset)

        x = np.asarray(features, dtype=np.float32)
        y = np.asarray(labels, dtype=np.float32).reshape((count, 1))
        return x, y

    def get_data(self):
        x_train, y_train = self._get_data(
            count=keras_correctness_test_base._GLOBAL_BATCH_SIZE * keras_correctness_test_base._EVAL_STEPS
        )
        x_predict = x_train
        return x_train, y_train, x_predict

    def get_data_with_partial_last_batch_eval(self):
        x_train, y_train = self._get_data(count=1280)
        x_eval, y_eval = self._get_data(count=1000)
        return x_train, y_train, x_eval, y_eval, x_eval

    @keras_correctness_test_base.parametrize(_select(_ALL, 0))
    def test_cnn_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data)

    @keras_correctness_test_base.parametrize(_select(_ALL, 1), marks=_SEVERAL_REPLICAS)
    def test_cnn_with_batch_norm_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data, with_batch_norm="regular")

    @_synchronized_refused_on_jax
    @keras_correctness_test_base.parametrize(_select(_ALL, 2))
    def test_cnn_with_sync_batch_norm_correctness(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(distribution, use_numpy, use_validation_data, with_batch_norm="sync")

    @keras_correctness_test_base.parametrize(_select(_ALL, 3))
    def test_cnn_correctness_with_partial_last_batch_eval(self, distribution, use_numpy, use_validation_data):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(
            distribution,
            use_numpy,
            use_validation_data,
            partial_last_batch=True,
            training_epochs=1,
        )

    @keras_correctness_test_base.parametrize(_select(_ALL, 4), marks=_SEVERAL_REPLICAS)
    def test_cnn_with_batch_norm_correctness_and_partial_last_batch_eval(
        self, distribution, use_numpy, use_validation_data
    ):
        distribution = _combinations.strategy(distribution)
        self.run_correctness_test(
            distribution,
            use_numpy,
            use_validation_data,
            with_batch_norm="regular",
            partial_last_batch=True,
        )
