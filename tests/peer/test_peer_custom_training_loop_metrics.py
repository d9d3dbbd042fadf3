"""tf-keras's `tf_keras/distribute/custom_training_loop_metrics_test.py`,
ported by renaming.

Source: keras-team/tf-keras at dd0a7237b (tf_keras/distribute/
custom_training_loop_metrics_test.py). Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` -> `pytest.mark.parametrize` over `_combinations`
  (tf's names; "gpu" devices are simulated CPU devices);
  `multiworker_strategies` left out (tests/test_multi_worker.py).
- `self.assertEqual(a, b)` -> `assert a == b`; `.numpy()` ->
  `keras.ops.convert_to_numpy` (both backends).
- `tf.function` -> `_combinations.function` (tf.function on TensorFlow,
  the plain function on JAX); `tf.data.Dataset.range(n).batch(b)` ->
  `_combinations.range_batches` (NumPy batches on JAX); `tf.constant(5.0)`
  -> `keras.ops.convert_to_tensor(5.0)`, `tf.constant([0.1, 0.1])` ->
  `keras.ops.convert_to_tensor([0.1, 0.1])`.
- `disable_mlir_bridge` (a tf compiler switch) dropped.
"""

import keras
import numpy as np
import pytest

import _combinations
from _combinations import all_strategies
from keras import metrics


@pytest.mark.parametrize("distribution", all_strategies)
def test_multiple_keras_metrics_experimental_run(distribution):
    distribution = _combinations.strategy(distribution)
    with distribution.scope():
        loss_metric = metrics.Mean("loss", dtype=np.float32)
        loss_metric_2 = metrics.Mean("loss_2", dtype=np.float32)

    @_combinations.function
    def train_step():
        def step_fn():
            loss = keras.ops.convert_to_tensor(5.0, dtype=np.float32)
            loss_metric.update_state(loss)
            loss_metric_2.update_state(loss)

        distribution.run(step_fn)

    train_step()
    assert keras.ops.convert_to_numpy(loss_metric.result()) == keras.ops.convert_to_numpy(loss_metric_2.result())
    assert keras.ops.convert_to_numpy(loss_metric.result()) == 5.0


@pytest.mark.parametrize("distribution", all_strategies)
def test_update_keras_metric_declared_in_strategy_scope(distribution):
    distribution = _combinations.strategy(distribution)
    with distribution.scope():
        metric = metrics.Mean("test_metric", dtype=np.float32)

    dataset = _combinations.range_batches(10, 2)
    dataset = distribution.experimental_distribute_dataset(dataset)

    @_combinations.function
    def step_fn(i):
        metric.update_state(i)

    for i in dataset:
        distribution.run(step_fn, args=(i,))

    # This should be the mean of integers 0-9 which has a sum of 45 and a
    # count of 10 resulting in mean of 4.5.
    assert keras.ops.convert_to_numpy(metric.result()) == 4.5


@pytest.mark.parametrize("distribution", all_strategies)
def test_update_keras_metric_outside_strategy_scope_cross_replica(distribution):
    distribution = _combinations.strategy(distribution)
    metric = metrics.Mean("test_metric", dtype=np.float32)

    with distribution.scope():
        for i in range(10):
            metric.update_state(i)

    # This should be the mean of integers 0-9 which has a sum of 45 and a
    # count of 10 resulting in mean of 4.5.
    assert keras.ops.convert_to_numpy(metric.result()) == 4.5


@pytest.mark.parametrize("distribution", all_strategies)
def test_update_keras_metrics_dynamic_shape(distribution):
    distribution = _combinations.strategy(distribution)
    with distribution.scope():
        metric = metrics.Mean("test_metric", dtype=np.float32)

    dataset = _combinations.range_batches(10, 2, drop_remainder=False)

    @_combinations.function
    def train_fn(dataset):
        weights = keras.ops.convert_to_tensor([0.1, 0.1])

        def step_fn(i):
            metric.update_state(i, weights)

        for i in dataset:
            distribution.run(step_fn, args=(i,))

    train_fn(dataset)

    # This should be the mean of integers 0-9 which has a sum of 45 and a
    # count of 10 resulting in mean of 4.5.
    assert keras.ops.convert_to_numpy(metric.result()) == 4.5
