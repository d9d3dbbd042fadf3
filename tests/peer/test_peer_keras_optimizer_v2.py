"""tf-keras's `tf_keras/distribute/keras_optimizer_v2_test.py`, ported by
renaming: Adam under CentralStorageStrategy on two replicas whose losses
differ (each replica's gradient its own: the update is their sum), and a
model's fit/evaluate/predict with SGD.

Source: keras-team/tf-keras at dd0a7237b. Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` (`central_storage_strategy_with_two_gpus`, graph and eager)
  -> `pytest.mark.parametrize` over that combination
  (`_combinations.OTHER_STRATEGIES`: two simulated CPU devices, the
  variables on `cpu:0`), eager only (Keras 3 has no graph mode); the test
  class's methods are module functions (`self.assertAllClose` ->
  `np.testing.assert_allclose` at tf's tolerance, 1e-6;
  `self.cached_session()`, `self.evaluate(global_variables_initializer())`
  and `sess.make_callable` dropped: TF1 graph mode).
- `tf.Variable(2.0, aggregation=tf.VariableAggregation.SUM)` ->
  `keras.Variable(2.0, aggregation="sum")`; tf-keras's legacy `adam.Adam` and
  `gradient_descent.SGD` -> `keras.optimizers.Adam` / `SGD` (same
  arguments); `optimizer.minimize(loss_fn, var_list=[var])` (Keras 3 has no
  `minimize`) -> the gradient of `loss_fn` and `optimizer.apply_gradients`,
  with `tf.GradientTape` on TensorFlow and, the keras-io JAX way, `jax.grad`
  of the loss at the variable's value on JAX; `optimizer.get_slot(var, "m")`
  / `"v"` -> Keras 3 Adam's `_momentums[0]` / `_velocities[0]`.
- `distribution.extended.call_for_each_replica(model_fn)` kept, returning
  nothing (`distribution.group(train_op)` of TF1 ops dropped); on
  TensorFlow it runs in a `tf.function` (`_combinations.function`), as tf's
  eager mode traced it.
"""

import keras
import numpy as np
import pytest

import _combinations
import keras_dist

BACKEND = _combinations.BACKEND


def get_model():
    x = keras.layers.Input(shape=(3,), name="input")
    y = keras.layers.Dense(4, name="dense")(x)
    model = keras.Model(x, y)
    return model


def _replica_id():
    replica_id = keras_dist.get_replica_context().replica_id_in_sync_group
    return keras.ops.cast(replica_id, "float32")


def _minimize(optimizer, loss_fn, var):
    """`optimizer.minimize(loss_fn, var_list=[var])` in Keras 3."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        with tf.GradientTape() as tape:
            loss = loss_fn(var)
        gradients = tape.gradient(loss, [var])
    else:
        import jax

        gradients = [jax.grad(loss_fn)(var.value)]
    optimizer.apply_gradients(zip(gradients, [var]))


@pytest.mark.parametrize("distribution", ["central_storage_strategy_with_two_gpus"])
def test_keras_optimizer_with_unequal_input(distribution):
    distribution = _combinations.strategy(distribution)
    with distribution.scope():
        var = keras.Variable(2.0, name="var", aggregation="sum")
        optimizer = keras.optimizers.Adam(learning_rate=0.01, beta_1=0.2, beta_2=0.2)
        optimizer.build([var])
        all_vars = []

        def model_fn():
            def loss_fn(v):
                replica_id = _replica_id()
                return (replica_id + 1) * 0.5 * v

            _minimize(optimizer, loss_fn, var)

        @_combinations.function
        def train_fn():
            distribution.extended.call_for_each_replica(model_fn)

        all_vars.append(var)
        all_vars.append(optimizer._momentums[0])
        all_vars.append(optimizer._velocities[0])

        def evaluate(v):
            return float(keras.ops.convert_to_numpy(v))

        # first step.
        train_fn()
        # var(1) = var(0) - lr * m(1) * sqrt(1 - beta2) / sqrt(v(1)) / (1 -
        # beta1)
        #        = 2.0 - 0.01 * 1.2 * sqrt(0.8) / sqrt(1.8) / 0.8
        np.testing.assert_allclose(evaluate(all_vars[0]), 1.99, rtol=1e-6, atol=1e-6)
        # m(1) = beta1 * m(0) + (1-beta1) * grad = 0.2 * 0 + 0.8 * (1 + 2) /
        # 2
        np.testing.assert_allclose(evaluate(all_vars[1]), 1.2, rtol=1e-6, atol=1e-6)
        # v(1) = beta2 * v(0) + (1-beta2) * grad^2 = 0.2 * 0 + 0.8 * 2.25
        np.testing.assert_allclose(evaluate(all_vars[2]), 1.8, rtol=1e-6, atol=1e-6)

        # second step.
        train_fn()
        # var(1) = var(0) - lr * 2 = 1.98
        np.testing.assert_allclose(evaluate(all_vars[0]), 1.98, rtol=1e-6, atol=1e-6)
        # m(2) = beta1 * m(1) + (1-beta1) * grad = 0.2 * 1.2 + 0.8 * 1.5
        np.testing.assert_allclose(evaluate(all_vars[1]), 1.44, rtol=1e-6, atol=1e-6)
        # v(2) = beta2 * v(1) + (1-beta2) * grad^2 = 0.2 * 1.8 + 0.8 * 2.25
        np.testing.assert_allclose(evaluate(all_vars[2]), 2.16, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distribution", ["central_storage_strategy_with_two_gpus"])
def test_optimizer_with_keras_model_and_numpy_arrays(distribution):
    distribution = _combinations.strategy(distribution)
    with distribution.scope():
        model = get_model()
        optimizer = keras.optimizers.SGD(0.001)
        loss = "mse"
        metrics = ["mae"]
        model.compile(optimizer, loss, metrics=metrics)

    inputs = np.zeros((64, 3), dtype=np.float32)
    targets = np.zeros((64, 4), dtype=np.float32)

    model.fit(
        inputs,
        targets,
        epochs=1,
        batch_size=2,
        verbose=0,
        validation_data=(inputs, targets),
    )
    model.evaluate(inputs, targets)
    model.predict(inputs)
