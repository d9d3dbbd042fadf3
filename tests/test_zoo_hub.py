"""Models nobody on the team wrote, from keras-hub: its `BertBackbone` and
`GPT2Backbone`, built from small configs (random weights, no download), as
a user fine-tunes them: a pooled regression head on the backbone, `fit`
under `MirroredStrategy` on four replicas against the same model on one
device, then `evaluate`, `predict` and a `.keras` save and load.

The layers are keras-hub's own: token and position embeddings, multi-head
attention with a padding mask (and GPT-2's causal mask), LayerNormalization
and dropout at keras-hub's default rate of 0.1, so the distributed run must
drop the rows one device drops. The batch of 10 splits unevenly over the four
replicas (3+3+2+2), and the last batch of each epoch is partial (22 rows:
10, 10, 2). SGD keeps the run well conditioned, so the weights after two
epochs match one device's to round-off.

`make test-zoo` runs it, with keras-hub from `.venv-zoo`
(requirements/zoo.txt); `-m zoo` selects it.
"""

import keras
import numpy as np
import pytest

import keras_dist

ROWS, BATCH, SEQUENCE, VOCABULARY = 22, 10, 12, 50


#: The zoo's sample (make test-zoo-sample, tests/_suite_plugin.py) takes no case here: keras-hub comes from .venv-zoo, which only make test-zoo installs.
ZOO_SAMPLE = None

def _keras_hub():
    """keras_hub, or an error naming how to get it (`make test` collects this
    file without keras-hub installed and deselects it; a zoo run without it
    is a setup error, not a skip)."""
    try:
        import keras_hub
    except ImportError as error:
        raise ImportError(
            "tests/test_zoo_hub.py needs keras-hub: run it through `make test-zoo`, which installs it into "
            ".venv-zoo (requirements/zoo.txt) and puts that on PYTHONPATH"
        ) from error
    return keras_hub


BACKBONES = {
    "bert": lambda: _keras_hub().models.BertBackbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=SEQUENCE,
        num_segments=2,
    ),
    "gpt2": lambda: _keras_hub().models.GPT2Backbone(
        vocabulary_size=VOCABULARY,
        num_layers=2,
        num_heads=2,
        hidden_dim=16,
        intermediate_dim=32,
        max_sequence_length=SEQUENCE,
    ),
}


def _regressor(name):
    """The backbone with a head, as a user fine-tunes it (keras-hub's task
    models do the same on their own heads)."""
    keras.utils.set_random_seed(7)
    backbone = BACKBONES[name]()
    inputs = {key: keras.Input((SEQUENCE,), dtype="int32", name=key) for key in backbone.input}
    features = backbone(inputs)
    if isinstance(features, dict):
        features = features["sequence_output"]
    pooled = keras.layers.GlobalAveragePooling1D()(features, mask=inputs["padding_mask"] > 0)
    model = keras.Model(inputs, keras.layers.Dense(1, name="head")(pooled))
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse", metrics=["mae"])
    return model


def _data(name):
    rng = np.random.default_rng(0)
    lengths = rng.integers(3, SEQUENCE + 1, size=ROWS)
    mask = (np.arange(SEQUENCE)[None, :] < lengths[:, None]).astype("int32")
    x = {"token_ids": rng.integers(1, VOCABULARY, size=(ROWS, SEQUENCE)).astype("int32") * mask, "padding_mask": mask}
    if name == "bert":
        x["segment_ids"] = (np.arange(SEQUENCE)[None, :] >= lengths[:, None] // 2).astype("int32") * mask
    y = rng.normal(size=(ROWS, 1)).astype("float32")
    return x, y


def _train_and_infer(model, x, y):
    history = model.fit(x, y, batch_size=BATCH, epochs=2, shuffle=False, verbose=0).history
    logs = model.evaluate(x, y, batch_size=BATCH, verbose=0, return_dict=True)
    return history, logs, model.predict(x, batch_size=BATCH, verbose=0)


@pytest.mark.zoo
@pytest.mark.parametrize("name", sorted(BACKBONES))
def test_keras_hub_backbone_fine_tunes_as_one_device(name, tmp_path):
    x, y = _data(name)
    reference = _regressor(name)
    initial = reference.get_weights()
    history_ref, logs_ref, predictions_ref = _train_and_infer(reference, x, y)

    strategy = keras_dist.MirroredStrategy()
    assert strategy.num_replicas_in_sync == 4
    with strategy.scope():
        model = _regressor(name)
    model.set_weights(initial)
    history, logs, predictions = _train_and_infer(model, x, y)

    step = max(float(np.max(np.abs(a - b))) for a, b in zip(reference.get_weights(), initial))
    assert step > 1e-3, "the run did not train: the comparison below would show nothing"
    for ref, got in zip(reference.weights, model.weights):
        np.testing.assert_allclose(np.asarray(got), np.asarray(ref), atol=1e-5, err_msg=ref.path)
    for key, values in history_ref.items():
        np.testing.assert_allclose(history[key], values, rtol=1e-5, err_msg=key)
    for key, value in logs_ref.items():
        assert logs[key] == pytest.approx(value, rel=1e-5), key
    np.testing.assert_allclose(predictions, predictions_ref, rtol=1e-5, atol=1e-6)

    # Saved from the strategy, loaded outside it and under it: the same model.
    path = tmp_path / f"{name}.keras"
    model.save(path)
    loaded = keras.saving.load_model(path)
    np.testing.assert_allclose(loaded.predict(x, batch_size=BATCH, verbose=0), predictions_ref, rtol=1e-5, atol=1e-6)
    with strategy.scope():
        restored = keras.saving.load_model(path)
    np.testing.assert_allclose(restored.predict(x, batch_size=BATCH, verbose=0), predictions_ref, rtol=1e-5, atol=1e-6)
