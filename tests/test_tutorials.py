"""Real tutorials, ported by renaming (`tf.distribute` -> `keras_dist`,
`tf.keras` -> `keras`), kept working: each trains under a 4-replica
strategy and under one device (the default strategy) and must match.

- tensorflow.org `tutorials/distribute/custom_training`: tf.data input,
  `GradientTape` steps inside `tf.function`, Keras metrics updated inside
  `strategy.run`, the epoch loop iterating the distributed dataset inside a
  `tf.function`, a `tf.train.Checkpoint` restored (TensorFlow backend).
- keras-io `guides/distributed_training_with_jax.py` ported to
  `strategy.run` (JAX): state passed through a pure step with
  `stateless_call`, BatchNormalization, a Keras metric updated inside `run`
  (tests/test_custom_loops.py holds the BatchNorm equivalence).
- tensorflow.org `tutorials/distribute/parameter_server_training`
  (tests/workers/ps_tutorial.py, run as its own process: its cluster lives
  in the process): a cluster with no `chief`, a partitioner, `fit` with
  `steps_per_execution`, a custom loop whose RMSprop Keras builds inside
  the first scheduled function (both backends; the custom loop, TensorFlow
  code, on TensorFlow).
"""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import make_data
from conftest import BACKEND

GLOBAL_BATCH_SIZE = 10  # 4 replicas: uneven shards, and a partial last batch


def _model(batch_norm=False):
    keras.utils.set_random_seed(3)
    normalization = [keras.layers.BatchNormalization()] if batch_norm else []
    return keras.Sequential(
        [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), *normalization, keras.layers.Dense(2)]
    )


@pytest.mark.skipif(BACKEND != "tensorflow", reason="the tutorial's steps are tf.function/GradientTape code")
def test_tensorflow_custom_training_tutorial(tmp_path):
    import tensorflow as tf

    x, y = make_data(63)
    y = y.astype("int32").ravel()

    def tutorial(strategy, checkpoint_dir):
        train_dataset = tf.data.Dataset.from_tensor_slices((x, y)).batch(GLOBAL_BATCH_SIZE)
        test_dataset = tf.data.Dataset.from_tensor_slices((x[:25], y[:25])).batch(GLOBAL_BATCH_SIZE)
        train_dist_dataset = strategy.experimental_distribute_dataset(train_dataset)
        test_dist_dataset = strategy.experimental_distribute_dataset(test_dataset)
        with strategy.scope():
            loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

            def compute_loss(labels, predictions, model_losses):
                per_example_loss = loss_object(labels, predictions)
                loss = keras_dist.compute_average_loss(per_example_loss)
                if model_losses:
                    loss += keras_dist.scale_regularization_loss(tf.add_n(model_losses))
                return loss

            test_loss = keras.metrics.Mean(name="test_loss")
            train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")
            test_accuracy = keras.metrics.SparseCategoricalAccuracy(name="test_accuracy")
            model = _model()
            optimizer = keras.optimizers.Adam(learning_rate=0.01)
            checkpoint = tf.train.Checkpoint(optimizer=optimizer, model=model)

        def train_step(inputs):
            images, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(images, training=True)
                loss = compute_loss(labels, predictions, model.losses)
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            train_accuracy.update_state(labels, predictions)
            return loss

        def test_step(inputs):
            images, labels = inputs
            predictions = model(images, training=False)
            t_loss = loss_object(labels, predictions)
            test_loss.update_state(t_loss)
            test_accuracy.update_state(labels, predictions)

        @tf.function
        def distributed_train_epoch(dataset):  # "Iterating inside a tf.function"
            total_loss = 0.0
            num_batches = 0
            for batch in dataset:
                per_replica_losses = strategy.run(train_step, args=(batch,))
                total_loss += strategy.reduce(keras_dist.ReduceOp.SUM, per_replica_losses, axis=None)
                num_batches += 1
            return total_loss / tf.cast(num_batches, dtype=tf.float32)

        @tf.function
        def distributed_test_step(dataset_inputs):
            return strategy.run(test_step, args=(dataset_inputs,))

        history = []
        for _ in range(2):
            train_loss = distributed_train_epoch(train_dist_dataset)
            for batch in test_dist_dataset:
                distributed_test_step(batch)
            history.append(
                [float(train_loss), float(train_accuracy.result()), float(test_loss.result()), float(test_accuracy.result())]
            )
            checkpoint.save(str(checkpoint_dir / "ckpt"))
            for metric in (test_loss, train_accuracy, test_accuracy):
                metric.reset_state()

        # restore the checkpoint into a fresh model and evaluate it
        with strategy.scope():
            restored = _model()
            restored_optimizer = keras.optimizers.Adam(learning_rate=0.01)
        tf.train.Checkpoint(optimizer=restored_optimizer, model=restored).restore(
            tf.train.latest_checkpoint(str(checkpoint_dir))
        ).expect_partial()
        for a, b in zip(model.get_weights(), restored.get_weights()):
            np.testing.assert_array_equal(a, b)
        return history, model.get_weights()

    (tmp_path / "one").mkdir()
    (tmp_path / "four").mkdir()
    expected, expected_weights = tutorial(keras_dist.get_strategy(), tmp_path / "one")
    got, weights = tutorial(keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]), tmp_path / "four")
    np.testing.assert_allclose(got, expected, atol=1e-5)
    for a, b in zip(expected_weights, weights):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.skipif(BACKEND != "jax", reason="the guide's step is JAX code (jax.value_and_grad, stateless_call)")
@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: keras_dist.OneDeviceStrategy("cpu:1"),
        lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
        lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(4)]),
    ],
    ids=["one-device", "mirrored-4", "central-storage-4"],
)
def test_keras_io_jax_guide_ported_to_strategy_run(make_strategy):
    """The guide's loop (state in, state out, BatchNorm's moving statistics
    among the state) under every strategy of one worker: under OneDevice
    `run` used to return that state as `PerReplica`, and the loop failed."""
    import jax

    x, y = make_data(63)
    y = y.astype("int32").ravel()
    batches = [(x[i : i + GLOBAL_BATCH_SIZE], y[i : i + GLOBAL_BATCH_SIZE]) for i in range(0, 63, GLOBAL_BATCH_SIZE)]

    def guide(strategy):
        with strategy.scope():
            model = _model(batch_norm=True)
            optimizer = keras.optimizers.Adam(1e-2)
            optimizer.build(model.trainable_variables)
            accuracy = keras.metrics.SparseCategoricalAccuracy()
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")

        def compute_loss(trainable_variables, non_trainable_variables, x, y):
            y_pred, non_trainable_variables = model.stateless_call(trainable_variables, non_trainable_variables, x, training=True)
            return keras_dist.compute_average_loss(loss_fn(y, y_pred)), (y_pred, non_trainable_variables)

        compute_gradients = jax.value_and_grad(compute_loss, has_aux=True)

        def train_step(state, data):
            trainable_variables, non_trainable_variables, optimizer_variables = state
            x, y = data
            (loss, (y_pred, non_trainable_variables)), grads = compute_gradients(
                trainable_variables, non_trainable_variables, x, y
            )
            trainable_variables, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable_variables)
            accuracy.update_state(y, y_pred)  # a Keras metric updated inside run
            return loss, (trainable_variables, non_trainable_variables, optimizer_variables)

        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in optimizer.variables],
        )
        losses = []
        for data in strategy.experimental_distribute_dataset(batches):
            loss, state = strategy.run(train_step, args=(state, data))
            losses.append(float(strategy.reduce("SUM", loss, axis=None)))
        for variable, value in zip(model.trainable_variables + model.non_trainable_variables, state[0] + state[1]):
            variable.assign(value)
        return losses, float(accuracy.result()), model.get_weights()

    expected = guide(keras_dist.get_strategy())
    got = guide(make_strategy())
    np.testing.assert_allclose(got[0], expected[0], atol=1e-6)
    assert got[1] == pytest.approx(expected[1], abs=1e-6)
    for a, b in zip(expected[2], got[2]):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.starts_processes
@pytest.mark.slow("one process holds the tutorial's cluster: 3 workers and 2 ps (TensorFlow servers, or Ray actors on JAX)")
def test_tensorflow_parameter_server_tutorial(tmp_path):
    """The tutorial as written (renamed; its header lists each change),
    in a fresh process. Asynchronous training has no one-device twin: the
    checks are the counts tf promises (every scheduled step applied once:
    fit's 5 x 20 steps of `steps_per_execution=10`; the loop's 4 x 5 + 1)
    and that it learns. It used to fail on TensorFlow (no `chief` in the
    cluster; the RMSprop's slots made on the coordinator) and to train a
    tenth of fit's steps on JAX, silently."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    out = tmp_path / "tutorial.json"
    env = dict(os.environ, KERAS_BACKEND=BACKEND, PYTHONPATH=os.pathsep.join([root, os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run(
        [sys.executable, os.path.join(root, "tests", "workers", "ps_tutorial.py"), str(out)],
        capture_output=True, text=True, timeout=400, env=env, cwd=tmp_path,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    report = json.loads(out.read_text())
    assert report["backend"] == BACKEND
    assert report["fit_iterations"] == 100 and report["fit_epochs"] == 5 and report["fit_loss_finite"]
    assert report["checkpoint_written"]
    if BACKEND == "tensorflow":
        assert report["fit_dataset_iterations"] == 100  # a tf.data.Dataset given to fit, as the tutorial now does
        # after the coordinator connected: this process's one CPU, not every task's
        assert report["mirrored_devices_after_coordinator"] == ["cpu:0"] and report["mirrored_fit_after_coordinator"]
    if BACKEND == "tensorflow":
        assert report["embedding_shards"] == 2  # MinSizePartitioner split it over the 2 ps
        assert report["loop_iterations"] == 21
        # It learns: every variable moved, and the trained model tells the
        # rows apart by the feature that decides their label (P("no") with
        # "avenger" well below P("no") without; untrained, the two are equal).
        # Not the printed accuracy: RMSprop's lr=0.1 on asynchronous steps
        # swings an epoch's accuracy (0.46-1.0 in runs here, 0.72 on CI
        # after four epochs), while the model after the loop separated the
        # rows (0.0 and 1.0) in every run.
        assert report["loop_variables_changed"] == [True] * 4, report["loop_variables_changed"]
        assert report["loop_p_no_without_avenger"] - report["loop_p_no_with_avenger"] > 0.25, report
        assert len(report["loop_epoch_accuracy"]) == 4
        assert np.isfinite(report["loop_final_loss"])
