"""Every fenced example in a public docstring runs (a docstring example that
raises NameError is a bug). Each runs in a fresh namespace holding what the
examples take as given: `x`, `y`, a compiled `model`, `np`, `keras`."""

import inspect
import re

import keras
import numpy as np
import pytest

import keras_dist
import keras_dist.callbacks
import keras_dist.cluster_resolver


def _public_objects():
    seen = set()
    for module in (keras_dist, keras_dist.callbacks, keras_dist.cluster_resolver):
        yield module.__name__, module
        for name in module.__all__:
            obj = getattr(module, name)
            if id(obj) in seen or not (inspect.isclass(obj) or inspect.isfunction(obj)):
                continue
            seen.add(id(obj))
            yield f"{module.__name__}.{name}", obj
            if inspect.isclass(obj):
                for attribute, member in vars(obj).items():
                    member = getattr(member, "fget", member)
                    if inspect.isfunction(member) and not attribute.startswith("_") and id(member) not in seen:
                        seen.add(id(member))
                        yield f"{module.__name__}.{name}.{attribute}", member


EXAMPLES = [
    (f"{name}[{index}]", block)
    for name, obj in _public_objects()
    for index, block in enumerate(re.findall(r"```python\n(.*?)```", inspect.getdoc(obj) or "", re.S))
]


def test_the_examples_are_found():
    names = {name.rsplit("[", 1)[0] for name, _ in EXAMPLES}
    assert {"keras_dist.Strategy.run", "keras_dist.experimental_set_strategy", "keras_dist.ReplicaContext"} <= names


@pytest.mark.parametrize("block", [block for _, block in EXAMPLES], ids=[name for name, _ in EXAMPLES])
def test_docstring_example_runs(block, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples may write files (plots)
    monkeypatch.delenv("TF_CONFIG", raising=False)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(128, 8)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="sgd", loss="binary_crossentropy")
    namespace = {"keras": keras, "keras_dist": keras_dist, "np": np, "x": x, "y": y, "model": model}
    exec(compile(block, "<docstring example>", "exec"), namespace)
