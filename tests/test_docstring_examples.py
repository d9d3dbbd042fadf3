"""Every fenced example in a public docstring runs (a docstring example that
raises NameError is a bug), and every result it states holds: a line
`expression  # value`, with a Python literal as the value, is checked as
`assert expression == value`. Each runs in a fresh namespace holding what
the examples take as given: `x`, `y`, a compiled `model`, `np`, `keras`."""

import ast
import inspect
import re

import keras
import numpy as np
import pytest

import keras_dist
import keras_dist.callbacks
import keras_dist.cluster_resolver
import keras_dist.coordinator
import keras_dist.experimental

#: The modules whose public names the API reference documents (docs/gen_api.py).
PUBLIC_MODULES = (keras_dist, keras_dist.experimental, keras_dist.cluster_resolver, keras_dist.coordinator,
                  keras_dist.callbacks)


def _public_objects():
    seen = set()
    for module in PUBLIC_MODULES:
        if module is keras_dist.coordinator:  # its examples need a parameter-server cluster (NEEDS_A_CLUSTER)
            continue
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


_STATED = re.compile(r"^(?P<indent>\s*)(?P<expression>\S.*?)\s+#\s*(?P<value>.+?)\s*$")


def _stated_results(block: str) -> tuple[str, int]:
    """`block` with each `expression  # literal` line made an assertion of
    that literal, and how many there were."""
    lines, count = [], 0
    for line in block.splitlines():
        match = _STATED.match(line)
        if match:
            expression, value = match["expression"], match["value"]
            try:
                is_expression = isinstance(ast.parse(expression).body[0], ast.Expr)
                ast.literal_eval(value)
            except (SyntaxError, ValueError, IndexError):
                is_expression = False
            if is_expression:
                count += 1
                line = (
                    f"{match['indent']}assert ({expression}) == {value}, "
                    f"{expression!r} + ' is ' + repr({expression}) + ', the example says ' + {value!r}"
                )
        lines.append(line)
    return "\n".join(lines) + "\n", count


def test_the_examples_are_found():
    names = {name.rsplit("[", 1)[0] for name, _ in EXAMPLES}
    assert {"keras_dist.Strategy.run", "keras_dist.experimental_set_strategy", "keras_dist.ReplicaContext"} <= names
    # the results examples state, checked as they run
    assert sum(_stated_results(block)[1] for _, block in EXAMPLES) >= 3


#: Public names whose example needs a parameter-server cluster (servers or
#: Ray actors), which this runner does not start (it does not run
#: keras_dist.coordinator's examples either): guides/parameter_server.md runs
#: the same code on one. The list may only shrink.
NEEDS_A_CLUSTER = {"keras_dist.ParameterServerStrategy", "keras_dist.Server", "keras_dist.coordinator.PerWorkerValues",
                   "keras_dist.coordinator.RemoteValue"}


def test_every_public_name_has_an_example():
    """Every class and function the API reference lists (docs/gen_api.py)
    shows a runnable example in its docstring (a ```python block, run above,
    or a doctest, run by its module's test)."""
    import inspect as inspect_module

    without, seen = set(), set()
    for module in PUBLIC_MODULES:
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect_module.ismodule(obj) or id(obj) in seen:
                continue
            seen.add(id(obj))
            doc = inspect_module.getdoc(obj) or ""
            if "```python" not in doc and ">>>" not in doc:
                without.add(f"{module.__name__}.{name}")
    assert without == NEEDS_A_CLUSTER


def test_a_stated_result_that_does_not_hold_fails():
    checked, count = _stated_results("n = 2\nn + 1  # 4\nprint(n)  # a comment, not a value\n")
    assert count == 1
    with pytest.raises(AssertionError, match="n \\+ 1 is 3, the example says 4"):
        exec(checked, {})


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
    exec(compile(_stated_results(block)[0], "<docstring example>", "exec"), namespace)
