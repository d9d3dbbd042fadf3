"""tf-keras's `tf_keras/distribute/keras_metrics_test.py`, ported by renaming.

Source: keras-team/tf-keras at dd0a7237b (tf_keras/distribute/
keras_metrics_test.py). Changes, all of them:
- `tf.distribute` -> `keras_dist`, `tf_keras` -> `keras`; tf's test
  `combinations` -> `pytest.mark.parametrize` over `_combinations`
  (tf's names; "gpu" devices are simulated CPU devices).
- `mode=["graph", "eager"]` -> eager only: TF1 graph mode
  (`tf.Graph().as_default()`, `self.evaluate`) does not exist in Keras 3;
  so `self.evaluate([v.initializer for v in metric.variables])` (graph
  mode's variable initialisation) is dropped and `self.evaluate(updates)`
  is the call itself. `self.assertAllClose(a, b)` ->
  `np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-6)` (tf's defaults).
- Not ported (README.md says why): `testMean` (TF1's
  `make_input_fn_iterator`, which TF2's `tf.distribute.Strategy` lacks),
  `testAddMetric` (`Layer.add_metric`, removed in Keras 3; plain Keras 3
  raises the same), and the `tpu_strategy` combinations (no TPU).
"""

import keras
import numpy as np
import pytest

import _combinations
from keras import metrics

#: all_combinations(): tf's four strategies of one worker.
ALL_COMBINATIONS = [
    "default_strategy",
    "one_device_strategy",
    "mirrored_strategy_with_gpu_and_cpu",
    "mirrored_strategy_with_two_gpus",
]


def _assert_all_close(a, b):
    np.testing.assert_allclose(keras.ops.convert_to_numpy(a), b, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_precision(distribution):
    distribution = _combinations.strategy(distribution)
    # True positive is 2, false positive 1, precision is 2/3 = 0.6666667
    label_prediction = ([0, 1, 1, 1], [1, 0, 1, 1])
    with distribution.scope():
        precision = metrics.Precision()
        distribution.run(precision, args=label_prediction)
    _assert_all_close(precision.result(), 0.6666667)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_recall(distribution):
    distribution = _combinations.strategy(distribution)
    # True positive is 2, false negative 1, precision is 2/3 = 0.6666667
    label_prediction = ([0, 1, 1, 1], [1, 0, 1, 1])
    with distribution.scope():
        recall = metrics.Recall()
        distribution.run(recall, args=label_prediction)
    _assert_all_close(recall.result(), 0.6666667)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_SensitivityAtSpecificity(distribution):
    distribution = _combinations.strategy(distribution)
    label_prediction = ([0, 0, 0, 1, 1], [0, 0.3, 0.8, 0.3, 0.8])
    with distribution.scope():
        metric = metrics.SensitivityAtSpecificity(0.5)
        distribution.run(metric, args=label_prediction)
    _assert_all_close(metric.result(), 0.5)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_SpecificityAtSensitivity(distribution):
    distribution = _combinations.strategy(distribution)
    label_prediction = ([0, 0, 0, 1, 1], [0, 0.3, 0.8, 0.3, 0.8])
    with distribution.scope():
        metric = metrics.SpecificityAtSensitivity(0.5)
        distribution.run(metric, args=label_prediction)
    _assert_all_close(metric.result(), 0.66666667)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_PrecisionAtRecall(distribution):
    distribution = _combinations.strategy(distribution)
    label_prediction = ([0, 0, 0, 1, 1], [0, 0.3, 0.8, 0.3, 0.8])
    with distribution.scope():
        metric = metrics.PrecisionAtRecall(0.5)
        distribution.run(metric, args=label_prediction)
    _assert_all_close(metric.result(), 0.5)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_RecallAtPrecision(distribution):
    distribution = _combinations.strategy(distribution)
    label_prediction = ([0, 0, 1, 1], [0, 0.5, 0.3, 0.9])
    with distribution.scope():
        metric = metrics.RecallAtPrecision(0.8)
        distribution.run(metric, args=label_prediction)
    _assert_all_close(metric.result(), 0.5)


@pytest.mark.parametrize("distribution", ALL_COMBINATIONS)
def test_auc(distribution):
    distribution = _combinations.strategy(distribution)
    label_prediction = ([0, 0, 1, 1], [0, 0.5, 0.3, 0.9])
    with distribution.scope():
        metric = metrics.AUC(num_thresholds=3)
        distribution.run(metric, args=label_prediction)
    _assert_all_close(metric.result(), 0.75)
