"""The layers hold: every adapter conforms to `BackendAdapter`, the core
imports no backend, no module imports itself through a circle, and
ARCHITECTURE.md names modules that exist."""

import ast
import inspect
import pathlib
import re

import pytest

import keras_dist
from keras_dist.backends import CAPABILITY_GROUPS, BackendAdapter, check_conforms, get_adapter, optional_methods, required_methods

PACKAGE = pathlib.Path(keras_dist.__file__).parent
ROOT = PACKAGE.parent
BACKEND_PACKAGES = {"jax": ("jax", "jaxlib"), "tensorflow": ("tensorflow",)}
ENGINE_MODULES = {name for names in BACKEND_PACKAGES.values() for name in names}


def _modules():
    """{dotted name: path} of every keras_dist module."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        found[".".join(parts)] = path
    return found


def _imports(path):
    """Every module `path` imports, at any depth (deferred imports too);
    `from package import submodule` counts as importing the submodule."""
    modules = _modules()
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            submodules = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            names += submodules if len(submodules) == len(node.names) else [node.module, *submodules]
    return names


def _is_engine_import(name):
    top = name.split(".")[0]
    return top in ENGINE_MODULES or name.startswith(("keras.src.backend.jax", "keras.src.backend.tensorflow"))


def _backend_of(module):
    parts = module.split(".")
    return parts[2] if len(parts) > 2 and parts[1] == "backends" and parts[2] in BACKEND_PACKAGES else None


def test_the_core_imports_no_backend():
    """Every module outside backends/jax and backends/tensorflow, found by
    walking the package (nothing to keep up to date by hand)."""
    offenders = {
        module: sorted({name for name in _imports(path) if _is_engine_import(name)})
        for module, path in _modules().items()
        if _backend_of(module) is None
    }
    offenders = {module: names for module, names in offenders.items() if names}
    # tf.data is an input format Keras reads on every backend: this module
    # builds tf's per-worker input streams, importing tensorflow inside its
    # functions, only once the user has handed over a tf.data dataset.
    assert {name.split(".")[0] for name in offenders.pop("keras_dist._tf_data")} == {"tensorflow"}
    assert not offenders, offenders
    assert "keras_dist._hooks._steps" in _modules()  # the walk sees subpackages


def test_each_backend_imports_only_its_own_engine():
    for module, path in _modules().items():
        backend = _backend_of(module)
        if backend is None:
            continue
        others = {n for b, names in BACKEND_PACKAGES.items() if b != backend for n in names}
        assert not {name.split(".")[0] for name in _imports(path)} & others, module


#: The core modules that define strategy classes (the package
#: keras_dist.strategies): an adapter that imported one would know
#: strategies by class, not by `extended.engine_kind`.
STRATEGY_MODULES = {
    "keras_dist.strategies",
    "keras_dist.strategies._base",
    "keras_dist.strategies._default",
    "keras_dist.strategies._mirrored",
    "keras_dist.strategies._multi_worker",
    "keras_dist.strategies._tpu",
    "keras_dist.strategies._parameter_server",
}


def test_adapters_know_strategies_only_by_engine_kind():
    """No module under backends/ imports a strategy class or reads a
    private name of a strategy or its `extended`: each adapter chooses its
    engine from `extended.engine_kind`, through one table."""
    modules = _modules()
    # the private attributes keras_dist's strategies set (tf's own engine
    # objects have private names of their own, which adapters may touch)
    private = {
        name
        for module in STRATEGY_MODULES
        for name in re.findall(r"\bself\.(_[a-z]\w*)\s*=", modules[module].read_text())
    }
    assert {"_strategy", "_engine", "_resolver"} <= private  # the scan sees them
    assert STRATEGY_MODULES == {m for m in modules if m.startswith("keras_dist.strategies")} - {
        "keras_dist.strategies._arguments"
    }
    read = re.compile(r"(?<!engine\.)\b(?:strategy|extended)\.(_[a-z]\w*)")
    for module, path in modules.items():
        if not module.startswith("keras_dist.backends."):
            continue
        imported = set(_imports(path)) & STRATEGY_MODULES
        assert not imported, f"{module} imports {sorted(imported)}"
        reads = sorted(set(read.findall(path.read_text())) & private)
        assert not reads, f"{module} reads {reads} of a keras_dist strategy"
    import importlib

    from keras_dist._engine_kind import EngineKind

    # this process's backend's table (each backend's suite checks its own:
    # importing the other's engine would load the other backend here)
    adapter = get_adapter()
    table = importlib.import_module(f"keras_dist.backends.{adapter.name}._engine")._ENGINES
    # a backend without the parameter-server capability refuses that strategy before any engine
    kinds = set(EngineKind) - ({EngineKind.PARAMETER_SERVER} if adapter.create_coordinator is None else set())
    assert set(table) == kinds, sorted(kinds - set(table))


def test_the_core_does_not_climb_into_the_hooks():
    """Only the package's entry (`keras_dist/__init__`, which installs them)
    and the hooks themselves import `keras_dist._hooks`: the core and the
    adapters sit below the hooks, which call them, never the other way."""
    offenders = {
        module: names
        for module, path in _modules().items()
        if module != "keras_dist" and not module.startswith("keras_dist._hooks")
        for names in [sorted(n for n in _imports(path) if n.startswith("keras_dist._hooks"))]
        if names
    }
    assert not offenders, offenders


def test_no_import_cycles():
    modules = _modules()
    graph = {}
    for module, path in modules.items():
        targets = set()
        for name in _imports(path):
            while name and name not in modules:  # `from pkg import name` of a non-module
                name = name.rpartition(".")[0]
            if name and not (module + ".").startswith(name + "."):  # not itself or its package
                targets.add(name)
        graph[module] = targets
    cycles, state = [], {}

    def visit(node, trail):
        state[node] = "open"
        for target in sorted(graph[node]):
            if state.get(target) == "open":
                cycles.append(trail[trail.index(target):] + [target])
            elif target not in state:
                visit(target, trail + [target])
        state[node] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert not cycles, "\n".join(" -> ".join(cycle) for cycle in cycles)


def test_the_adapter_conforms():
    adapter = get_adapter()
    check_conforms(adapter)  # also run by get_adapter when it loads one
    assert set(required_methods()) <= set(dir(adapter))
    # every method the adapter gives is its backend's own code (a module of
    # backends/<name>/), not a stub written in the adapter class
    for name in [*required_methods(), *optional_methods()]:
        given = inspect.getattr_static(type(adapter), name)
        if given is None:
            continue
        function = given.__func__ if isinstance(given, staticmethod) else given
        assert function.__module__.startswith(f"keras_dist.backends.{adapter.name}."), (name, function.__module__)
        assert function.__module__ != f"keras_dist.backends.{adapter.name}._adapter", name


def test_the_contract_is_one_protocol_per_concern_and_nothing_else():
    """Every adapter method is declared by exactly one concern Protocol; the
    required ones are `BackendAdapter`'s abstract methods, the optional ones
    None on it; `BackendAdapter` adds no method of its own beyond
    `check_parameter_servers_supported` (a default)."""
    from keras_dist.backends import OPTIONAL_CONCERNS, REQUIRED_CONCERNS, concern_methods, concern_of

    declared = [name for concern in REQUIRED_CONCERNS + OPTIONAL_CONCERNS for name in concern_methods(concern)]
    assert len(declared) == len(set(declared)), "a method declared by two concerns"
    required = {name for concern in REQUIRED_CONCERNS for name in concern_methods(concern)}
    # place_variable_value: a required concern's method with a default
    assert set(required_methods()) == required - {"place_variable_value"}
    assert set(optional_methods()) == set(declared) - required
    for name in optional_methods():
        assert inspect.getattr_static(BackendAdapter, name) is None, name
    own = {
        name for name, value in vars(BackendAdapter).items()
        if inspect.isfunction(value) and not name.startswith("_")
    }
    assert own == {"check_parameter_servers_supported"}
    assert set(CAPABILITY_GROUPS["parameter_servers"]) == set(concern_methods(concern_of("schedule")))
    with pytest.raises(KeyError, match="no concern declares 'spin'"):
        concern_of("spin")


def test_an_incomplete_or_misdeclared_adapter_is_refused():
    class Missing(BackendAdapter):
        name = "missing"

    with pytest.raises(TypeError, match="abstract"):
        Missing()

    implementations = {name: (lambda self, *a, **k: None) for name in required_methods()}
    Loose = type("Loose", (BackendAdapter,), {"name": "loose", **implementations})
    with pytest.raises(TypeError, match="does not conform.*visible_devices.*declared by Devices"):
        check_conforms(Loose())


def test_an_optional_capability_is_none_or_declared_exactly():
    """An adapter may leave an optional capability None (no stub), but one
    it gives is checked like a required method; a required one None is
    refused."""
    assert set(optional_methods()) == {
        "distribute_dataset_natively", "create_server", "assign_on_ps", "apply_optimizer",
        "variable_parts", "from_backend_object", *CAPABILITY_GROUPS["parameter_servers"],
    }
    assert not set(optional_methods()) & set(required_methods())
    adapter = get_adapter()
    base = {name: inspect.getattr_static(type(adapter), name) for name in required_methods()}
    Lean = type("Lean", (BackendAdapter,), {"name": "lean", **base})
    check_conforms(Lean())  # every optional capability None
    Wrong = type("Wrong", (BackendAdapter,), {"name": "wrong", **base, "create_server": staticmethod(lambda cluster: None)})
    with pytest.raises(TypeError, match="does not conform.*create_server"):
        check_conforms(Wrong())
    NoneRequired = type("NoneRequired", (Lean,), {"run": None})
    with pytest.raises(TypeError, match="run \\(CustomLoops\\) is None"):
        check_conforms(NoneRequired())
    # a group is all or none: half a parameter-server engine is refused
    group = CAPABILITY_GROUPS["parameter_servers"]

    def conforming(name):  # a function with the declared parameters (whatever this adapter gives)
        declared = optional_methods()[name]
        function = lambda *args, **kwargs: None  # noqa: E731
        function.__signature__ = declared.replace(parameters=list(declared.parameters.values())[1:])
        return staticmethod(function)

    Whole = type("Whole", (Lean,), {name: conforming(name) for name in group})
    check_conforms(Whole())
    Half = type("Half", (Whole,), {"join": None, "done": None})
    with pytest.raises(TypeError, match="parameter_servers capability gives .* but not join, done \\(all or none\\)"):
        check_conforms(Half())


def test_a_backend_without_parameter_servers_refuses_the_strategy_before_anything_starts(monkeypatch):
    """An adapter without the parameter-server group (a backend with no ps
    engine): `ParameterServerStrategy(...)` raises NotImplementedError
    naming the backend and the adapter's hint, before reading any cluster."""
    import keras_dist
    from keras_dist.strategies import _parameter_server

    adapter = get_adapter()
    base = {name: inspect.getattr_static(type(adapter), name) for name in required_methods()}
    lean = type("Lean", (BackendAdapter,), {"name": "lean", **base, "unsupported": {"parameter_servers": "use X."}})()
    monkeypatch.setattr(_parameter_server, "get_adapter", lambda: lean)
    monkeypatch.setenv("TF_CONFIG", "not JSON: never read")
    with pytest.raises(NotImplementedError, match="^ParameterServerStrategy is not supported on the lean backend: use X.$"):
        keras_dist.ParameterServerStrategy()


def test_this_backend_s_optional_capabilities():
    """JAX has no dataset engine, no tf objects and no server processes (its
    ps are Ray actors); TensorFlow has every capability."""
    adapter = get_adapter()
    lacking = {name for name in optional_methods() if getattr(adapter, name) is None}
    expected = {
        "jax": {"distribute_dataset_natively", "create_server", "assign_on_ps", "variable_parts", "from_backend_object"},
        "tensorflow": set(),
        # torch: no parameter servers, no dataset engine, no objects of its own to translate
        "torch": {"distribute_dataset_natively", "create_server", "assign_on_ps", "variable_parts", "from_backend_object",
                  *CAPABILITY_GROUPS["parameter_servers"]},
    }[adapter.name]
    assert lacking == expected
    assert set(adapter.unsupported) <= lacking | set(CAPABILITY_GROUPS)


def test_replica_ops_of_this_backend_implement_the_interface():
    import importlib

    from keras_dist._replica_ops import ReplicaOps

    module = importlib.import_module(f"keras_dist.backends.{get_adapter().name}._replica")
    assert issubclass(module._ReplicaOps, ReplicaOps)


def test_architecture_page_names_real_modules():
    text = (PACKAGE / "ARCHITECTURE.md").read_text()
    named = set(re.findall(r"`(keras_dist/[\w/]+\.(?:py|md))`", text))
    assert len(named) >= 20, named
    missing = sorted(path for path in named if not (ROOT / path).exists())
    assert not missing, missing
    for method in [*required_methods(), *optional_methods()]:  # the adapter method set, listed in full
        assert f"`{method}`" in text, method
    from keras_dist.backends import OPTIONAL_CONCERNS, REQUIRED_CONCERNS

    for concern in REQUIRED_CONCERNS + OPTIONAL_CONCERNS:  # and its concerns
        assert f"`{concern.__name__}`" in text, concern.__name__


def test_lazy_exports_and_type_checking_imports_agree():
    """keras_dist/__init__.py names each public object twice (the lazy
    `_EXPORTS` table and the TYPE_CHECKING imports for IDEs): same names,
    same modules, and every one resolves."""
    import keras_dist

    tree = ast.parse((PACKAGE / "__init__.py").read_text())
    block = next(node for node in tree.body if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test))
    imported = {}
    for node in ast.walk(block):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                imported[alias.name] = node.module
    subpackages = {name for name, module in imported.items() if module == "keras_dist"}
    assert subpackages == set(keras_dist._SUBPACKAGES)
    assert {k: v for k, v in imported.items() if k not in subpackages} == keras_dist._EXPORTS
    for name in keras_dist.__all__:
        assert getattr(keras_dist, name) is not None, name


def _walkthrough_blocks() -> list:
    text = (PACKAGE / "ARCHITECTURE.md").read_text()
    section = text[text.index("## Adding a strategy"):]
    return re.findall(r"^```python\n(.*?)^```", section, re.M | re.S)


def test_adding_a_strategy_is_one_module_and_one_table_entry(monkeypatch):
    """ARCHITECTURE.md's walkthrough, run as written: its strategy module
    and its one `_ENGINES` entry make a strategy of a new engine kind that
    trains as one device does (fit, evaluate, predict); before the entry,
    one error naming the table, raised before anything is placed."""
    import importlib

    import numpy as np

    from _helpers import FEATURES, assert_fit_evaluate_predict_match, twin
    from keras_dist._engine_kind import EngineKind

    module_block, table_block = _walkthrough_blocks()
    namespace: dict = {}
    exec(compile(module_block, "ARCHITECTURE.md (strategy module)", "exec"), namespace)
    FirstDevicesStrategy = namespace["FirstDevicesStrategy"]

    count = 1 if get_adapter().name == "torch" else 2  # torch: one device a process
    strategy = FirstDevicesStrategy(count)
    assert strategy.num_replicas_in_sync == count
    name = get_adapter().name
    with pytest.raises(NotImplementedError, match=f"no engine of kind 'first_devices'.*backends/{name}/_engine.py"):
        with strategy.scope():
            pass

    engine = importlib.import_module(f"keras_dist.backends.{name}._engine")
    table = dict(engine._ENGINES)
    exec(compile(table_block, "ARCHITECTURE.md (table entry)", "exec"), {"_ENGINES": table, "EngineKind": EngineKind})
    assert set(table) - set(engine._ENGINES) == {"first_devices"}
    monkeypatch.setattr(engine, "_ENGINES", table)

    rng = np.random.default_rng(0)
    x = rng.normal(size=(36, FEATURES)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    reference, distributed = twin(FirstDevicesStrategy(count), optimizer="sgd")
    assert_fit_evaluate_predict_match(reference, distributed, x, y, batch_size=10, epochs=2)
