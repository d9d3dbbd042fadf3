"""Shared helpers: data, models, and the single-device comparison."""

from __future__ import annotations

import numpy as np
import keras

FEATURES = 8


def make_data(num_samples: int, seed: int = 0, classes: int = 2):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(num_samples, FEATURES)).astype("float32")
    logits = x[:, :1] + 0.5 * x[:, 1:2] - 0.25 * x[:, 2:3]
    y = (logits > 0).astype("float32")
    return x, y


class SumAbsError(keras.metrics.Metric):
    """A custom metric made with `add_weight`: mean absolute error."""

    def __init__(self, name="sum_abs_error", **kwargs):
        super().__init__(name=name, **kwargs)
        self.total = self.add_weight(shape=(), initializer="zeros", name="total")
        self.count = self.add_weight(shape=(), initializer="zeros", name="count")

    def update_state(self, y_true, y_pred, sample_weight=None):
        y_true = keras.ops.cast(y_true, "float32")
        error = keras.ops.sum(keras.ops.abs(y_true - y_pred))
        self.total.assign_add(error)
        self.count.assign_add(
            keras.ops.cast(keras.ops.size(y_true), "float32")
        )

    def result(self):
        return self.total / self.count



def mnist_like(num_examples, seed):
    """Stand-in for tfds' MNIST (no downloads here): uint8 28x28x1 images
    whose label names the band of rows drawn brighter (ten bands: rows
    3k..3k+2, and row 27 alone), so a small CNN learns it."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, num_examples)
    images = rng.integers(0, 120, (num_examples, 28, 28, 1))
    rows = np.arange(28)[None, :] // 3
    images = images + 40 * (np.minimum(rows, 9)[:, :, None, None] == labels[:, None, None, None]).transpose(0, 1, 3, 2)
    return images.astype("uint8"), labels.astype("int64")


def make_metrics():
    return [
        "accuracy",
        keras.metrics.AUC(name="auc"),
        keras.metrics.MeanMetricWrapper(
            lambda t, p: keras.ops.abs(t - p), name="mean_abs"
        ),
        SumAbsError(),
    ]


def mlp(batch_norm: bool = False, seed: int = 1, regularizer=None):
    keras.utils.set_random_seed(seed)
    layers = [
        keras.Input((FEATURES,)),
        keras.layers.Dense(16, activation="relu", kernel_regularizer=regularizer),
    ]
    if batch_norm:
        layers.append(keras.layers.BatchNormalization())
    layers.append(keras.layers.Dense(1, activation="sigmoid"))
    return keras.Sequential(layers)


def two_heads(seed: int = 1):
    """A model with two outputs, "a" and "b" (Keras logs a loss per output)."""
    keras.utils.set_random_seed(seed)
    inputs = keras.Input((FEATURES,))
    hidden = keras.layers.Dense(8, activation="relu")(inputs)
    a = keras.layers.Dense(1, activation="sigmoid", name="a")(hidden)
    b = keras.layers.Dense(1, name="b")(hidden)
    return keras.Model(inputs, {"a": a, "b": b})


def make_optimizer(name: str):
    if name == "sgd":
        return keras.optimizers.SGD(learning_rate=0.1, momentum=0.9)
    return keras.optimizers.Adam(learning_rate=0.01)


def compile_model(model, optimizer="adam", **kwargs):
    model.compile(
        optimizer=make_optimizer(optimizer),
        loss="binary_crossentropy",
        metrics=make_metrics(),
        **kwargs,
    )
    return model


def twin(strategy, build=mlp, optimizer="adam", compile_kwargs=None, **build_kwargs):
    """A single-device model and a distributed copy with the same weights."""
    reference = compile_model(build(**build_kwargs), optimizer, **(compile_kwargs or {}))
    with strategy.scope():
        distributed = build(**build_kwargs)
        distributed.set_weights(reference.get_weights())
        compile_model(distributed, optimizer, **(compile_kwargs or {}))
    return reference, distributed


def max_weight_diff(a, b) -> float:
    wa, wb = a.get_weights(), b.get_weights()
    assert len(wa) == len(wb)
    return max(float(np.max(np.abs(x - y))) for x, y in zip(wa, wb))


def assert_same_weights(a, b, atol=1e-5):
    diff = max_weight_diff(a, b)
    assert diff <= atol, f"weights differ by {diff} > {atol}"


def assert_same_logs(expected: dict, actual: dict, atol=1e-6):
    assert set(expected) == set(actual), (expected, actual)
    for key in expected:
        assert abs(expected[key] - actual[key]) <= atol * max(1.0, abs(expected[key])), (
            key,
            expected[key],
            actual[key],
        )


def assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size, epochs=1):
    """The equivalence contract: `fit` the single-device `reference` and the
    `distributed` copy on the same global batches, then compare weights
    (1e-5), the last epoch's logs (1e-5), `evaluate` (1e-6) and `predict` (1e-5)."""
    history_ref = reference.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    history = distributed.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=False, verbose=0)
    assert_same_weights(reference, distributed, atol=1e-5)
    assert_same_logs(
        {k: v[-1] for k, v in history_ref.history.items()},
        {k: v[-1] for k, v in history.history.items()},
        atol=1e-5,
    )
    assert_same_logs(
        reference.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
        distributed.evaluate(x, y, batch_size=batch_size, verbose=0, return_dict=True),
        atol=1e-6,
    )
    expected = reference.predict(x, batch_size=batch_size, verbose=0)
    predicted = distributed.predict(x, batch_size=batch_size, verbose=0)
    assert predicted.shape == expected.shape == (len(x), 1)
    np.testing.assert_allclose(predicted, expected, atol=1e-5, rtol=0)


def sharded_dense():
    """TensorFlow: a built Dense(2) on 6 features whose kernel is split in two
    shards, as a ParameterServerStrategy's partitioner splits it, and the
    kernel's values."""
    import tensorflow as tf

    from keras_dist.backends.tensorflow._parameter_servers import _KerasShardedVariable

    layer = keras.layers.Dense(2)
    layer.build((None, 6))
    kernel = layer.kernel.numpy()
    layer.kernel._value = _KerasShardedVariable([tf.Variable(kernel[:3]), tf.Variable(kernel[3:])], True, "kernel")
    return layer, kernel


def orbax_checkpoint(directory):
    """`keras.callbacks.OrbaxCheckpoint(directory)`; where orbax-checkpoint
    is not installed (it brings jax: TensorFlow- and torch-only venvs), an
    instance made without Keras' `__init__` (which needs orbax), enough for
    keras_dist's refusal, which reads only its class and directory."""
    try:
        import orbax.checkpoint  # noqa: F401
    except ImportError:
        checkpoint = keras.callbacks.OrbaxCheckpoint.__new__(keras.callbacks.OrbaxCheckpoint)
        checkpoint.directory = directory
        return checkpoint
    return keras.callbacks.OrbaxCheckpoint(directory)
