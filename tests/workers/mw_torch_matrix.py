"""A worker of the torch backend's equivalence-matrix job
(tests/test_torch_backend.py::test_the_equivalence_matrix_across_processes).

Under MultiWorkerMirroredStrategy (one replica per process), for every model
(an MLP; a CNN with BatchNormalization and no bias before it; a functional
model with two inputs; a subclassed model) and every input Keras' torch
backend takes (NumPy arrays, a `keras.utils.PyDataset`, a Python generator,
a `torch.utils.data.DataLoader`), in global batches of 16 of 50 rows
(uneven over the replicas, a partial last batch of 2): fit 2 epochs with
SGD, evaluate, predict; then the same on one device from the same seed.
Also: a `compile(loss=fn)` whose function returns an already averaged
scalar, and only the chief writing ModelCheckpoint and CSVLogger files.

argv: OUT_DIR. Writes OUT_DIR/worker<i>.json: per case, the largest weight,
evaluate and predict differences from one device, and the logged losses.
"""

import json
import os
import sys

out_dir = sys.argv[1]

import numpy as np  # noqa: E402
import keras  # noqa: E402
import torch  # noqa: E402

import keras_dist  # noqa: E402

strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
index = strategy.cluster_resolver.task_id
ROWS, BATCH = 50, 16
rng = np.random.RandomState(1)
images = rng.rand(ROWS, 6, 6, 1).astype("float32")
flat = rng.randn(ROWS, 5).astype("float32")
target = (flat @ rng.randn(5, 1) + images.reshape(ROWS, -1)[:, :1]).astype("float32")


class Subclassed(keras.Model):
    def __init__(self):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="tanh")
        self.out = keras.layers.Dense(1)

    def call(self, inputs):
        return self.out(self.hidden(inputs))


def make(kind):
    keras.utils.set_random_seed(11)
    if kind == "mlp":
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="tanh"), keras.layers.Dense(1)])
    elif kind == "cnn_bn":
        model = keras.Sequential([
            keras.Input((6, 6, 1)), keras.layers.Conv2D(4, 3, use_bias=False), keras.layers.BatchNormalization(),
            keras.layers.Activation("swish"), keras.layers.Flatten(), keras.layers.Dense(1),
        ])
    elif kind == "functional":
        a, b = keras.Input((5,), name="a"), keras.Input((6, 6, 1), name="b")
        joined = keras.layers.Concatenate()([keras.layers.Dense(4, activation="tanh")(a), keras.layers.Flatten()(b)])
        model = keras.Model({"a": a, "b": b}, keras.layers.Dense(1)(joined))
    else:
        model = Subclassed()
    model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.5), loss="mse", metrics=["mae"])
    return model


def features(kind, rows=slice(None)):
    if kind == "cnn_bn":
        return images[rows]
    if kind == "functional":
        return {"a": flat[rows], "b": images[rows]}
    return flat[rows]


class Batches(keras.utils.PyDataset):
    def __init__(self, kind, with_y=True):
        super().__init__()
        self.kind, self.with_y = kind, with_y

    def __len__(self):
        return -(-ROWS // BATCH)

    def __getitem__(self, i):
        rows = slice(i * BATCH, (i + 1) * BATCH)
        return (features(self.kind, rows), target[rows]) if self.with_y else (features(self.kind, rows),)


def generator(kind, with_y=True):
    while True:
        for i in range(0, ROWS, BATCH):
            rows = slice(i, i + BATCH)
            yield (features(kind, rows), target[rows]) if with_y else (features(kind, rows),)


def run(kind, source):
    """fit, evaluate, predict of model `kind` on input `source`."""
    model = make(kind)
    steps = -(-ROWS // BATCH)
    if source == "numpy":
        history = model.fit(features(kind), target, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
        evaluated = model.evaluate(features(kind), target, batch_size=BATCH, verbose=0)
        predicted = model.predict(features(kind), batch_size=BATCH, verbose=0)
    elif source == "pydataset":
        history = model.fit(Batches(kind), epochs=2, shuffle=False, verbose=0)
        evaluated = model.evaluate(Batches(kind), verbose=0)
        predicted = model.predict(Batches(kind, with_y=False), verbose=0)
    elif source == "generator":
        history = model.fit(generator(kind), steps_per_epoch=steps, epochs=2, verbose=0)
        evaluated = model.evaluate(generator(kind), steps=steps, verbose=0)
        predicted = model.predict(generator(kind, with_y=False), steps=steps, verbose=0)
    else:
        tensors = (
            [torch.from_numpy(flat), torch.from_numpy(images)] if kind == "functional" else [torch.from_numpy(features(kind))]
        )

        class Rows(torch.utils.data.Dataset):
            def __init__(self, with_y=True):
                self.with_y = with_y

            def __len__(self):
                return ROWS

            def __getitem__(self, i):
                x = {"a": tensors[0][i], "b": tensors[1][i]} if kind == "functional" else tensors[0][i]
                return (x, torch.from_numpy(target[i])) if self.with_y else (x,)

        def loader(with_y=True):
            return torch.utils.data.DataLoader(Rows(with_y), batch_size=BATCH, shuffle=False)

        history = model.fit(loader(), epochs=2, verbose=0)
        evaluated = model.evaluate(loader(), verbose=0)
        predicted = model.predict(loader(with_y=False), verbose=0)
    return model, history.history["loss"], evaluated, np.asarray(predicted)


def largest(a, b):
    return max(float(np.max(np.abs(np.asarray(p) - np.asarray(q)))) for p, q in zip(a, b))


results = {}
for kind in ("mlp", "cnn_bn", "functional", "subclassed"):
    for source in ("numpy", "pydataset", "generator", "dataloader"):
        with strategy.scope():
            model, losses, evaluated, predicted = run(kind, source)
        reference, ref_losses, ref_evaluated, ref_predicted = run(kind, source)
        results[f"{kind}/{source}"] = {
            "weights": largest(model.get_weights(), reference.get_weights()),
            "evaluate": largest([evaluated], [ref_evaluated]),
            "predict": largest([predicted], [ref_predicted]),
            "predict_rows": int(predicted.shape[0]),
            "losses": [losses, ref_losses],
        }


def averaged_loss(y_true, y_pred):  # already a scalar: the batch's mean
    return keras.ops.mean(keras.ops.square(y_true - y_pred))


def self_averaging(distributed):
    keras.utils.set_random_seed(11)
    with strategy.scope() if distributed else keras_dist.get_strategy().scope():
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss=averaged_loss)
    model.fit(flat, target, batch_size=BATCH, epochs=2, shuffle=False, verbose=0)
    return model.get_weights()


results["self_averaging_loss"] = {"weights": largest(self_averaging(True), self_averaging(False))}

files = os.path.join(out_dir, "files")
os.makedirs(files, exist_ok=True)
with strategy.scope():
    model = make("mlp")
model.fit(
    flat, target, batch_size=BATCH, epochs=2, shuffle=False, verbose=0,
    callbacks=[
        keras.callbacks.ModelCheckpoint(os.path.join(files, "model.keras")),
        keras.callbacks.CSVLogger(os.path.join(files, "log.csv")),
    ],
)
results["written_by"] = index
os.makedirs(out_dir, exist_ok=True)
with open(os.path.join(out_dir, f"worker{index}.json"), "w") as handle:
    json.dump(results, handle)
