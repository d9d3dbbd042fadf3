"""guides/porting_from_tf_distribute.md's tables are true of this tree.

The guide has three tables with the columns
`tf name | keras_dist name | JAX | TensorFlow | notes`: every public name of
tf.distribute (first column "tf.distribute name"), the methods of
Strategy / StrategyExtended / ReplicaContext ("tf method"), and names from
elsewhere in tf ("tf name"). A support cell is `yes`, `no (issue #14)` /
`no (issue #15)`, or `error: <ExceptionType> "<message>"`. For the column of
the running backend:

* `yes`: the keras_dist name resolves (a module attribute, a submodule, or
  an attribute of a strategy instance, its `extended`, a replica context or
  a class);
* `no (issue ...)`: no keras_dist spelling of the tf name resolves (the tf
  path renamed, at the top level, under `keras_dist.experimental`), so a row
  must be updated when its name lands; issue #14 is parameter-server
  training, #15 the rest;
* `error: ...`: the name resolves, and using it (`TRIGGERS`) raises that
  exception with that message.

On TensorFlow, every public name of `dir(tf.distribute)` and of its
submodules (walked recursively), and every public attribute of tf's
Strategy, StrategyExtended and ReplicaContext, must have exactly one row.
The JAX test venv has no tensorflow: there only the JAX column is checked.
Every `keras_dist.<name>` the guide mentions anywhere must resolve too.
"""

from __future__ import annotations

import dataclasses
import importlib
import re
import types
from pathlib import Path
from typing import Any, Optional

import pytest

import keras_dist
from conftest import BACKEND, NUM_DEVICES

GUIDE = Path(__file__).resolve().parents[1] / "guides" / "porting_from_tf_distribute.md"
COLUMNS = ["keras_dist name", "JAX", "TensorFlow", "torch", "notes"]
#: table kind -> the header of its first column
KINDS = {"names": "tf.distribute name", "methods": "tf method", "others": "tf name"}
BACKEND_COLUMN = {"jax": "JAX", "tensorflow": "TensorFlow", "torch": "torch"}
BACKEND_COLUMNS = ("JAX", "TensorFlow", "torch")
#: Methods the guide must document whatever tf's dir() lists: three are not in
#: it (tf.compat.v1's `broadcast_to` and `call_for_each_replica`, which TF2's
#: strategies keep; `experimental_enable_get_next_as_optional`, an attribute
#: tf's strategies set on their extended).
REQUIRED_METHODS = {
    "Strategy.run",
    "Strategy.reduce",
    "Strategy.gather",
    "Strategy.experimental_local_results",
    "Strategy.experimental_distribute_dataset",
    "Strategy.distribute_datasets_from_function",
    "Strategy.experimental_distribute_values_from_function",
    "Strategy.experimental_distribute_datasets_from_function",
    "Strategy.scope",
    "Strategy.num_replicas_in_sync",
    "StrategyExtended.reduce_to",
    "StrategyExtended.batch_reduce_to",
    "StrategyExtended.update",
    "StrategyExtended.value_container",
    "StrategyExtended.colocate_vars_with",
    "StrategyExtended.broadcast_to",
    "StrategyExtended.call_for_each_replica",
    "StrategyExtended.experimental_enable_get_next_as_optional",
    "StrategyExtended.experimental_require_static_shapes",
    "ReplicaContext.all_reduce",
    "ReplicaContext.all_gather",
    "ReplicaContext.merge_call",
    "ReplicaContext.devices",
    "ReplicaContext.replica_id_in_sync_group",
    "ReplicaContext.num_replicas_in_sync",
}
NOT_IN_TF_DIR = {
    "StrategyExtended.broadcast_to",
    "StrategyExtended.call_for_each_replica",
    "StrategyExtended.experimental_enable_get_next_as_optional",
}
#: tf names that belong to parameter-server training (issue #14).
PARAMETER_SERVER = re.compile(r"ParameterServer|ClusterCoordinator|DatasetCreator|\.coordinator\b|\.partitioners\b")
STRATEGY_CLASSES = (
    "Strategy",
    "MirroredStrategy",
    "OneDeviceStrategy",
    "MultiWorkerMirroredStrategy",
    "CentralStorageStrategy",
    "TPUStrategy",
)

_NAME_CELL = re.compile(r"`([A-Za-z_][\w.]*)`\Z")
_SUPPORT = re.compile(r'(?P<yes>yes)\Z|no \(issue #(?P<issue>1[45])\)\Z|error: (?P<type>\w+) "(?P<message>[^"]+)"\Z')
MISSING = object()


@dataclasses.dataclass(frozen=True)
class Row:
    kind: str
    line: int
    tf_name: str
    keras_name: Optional[str]
    support: dict  # "JAX" / "TensorFlow" -> the regex match of its cell
    notes: str

    def where(self) -> str:
        return f"{GUIDE.name} line {self.line} ({self.tf_name})"


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


def parse_tables(text: str) -> dict[str, list[Row]]:
    """The guide's three support tables, by kind; other tables are ignored."""
    tables: dict[str, list[Row]] = {}
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        line = lines[number]
        starts = line.startswith("|") and (number == 0 or not lines[number - 1].startswith("|"))
        header = _cells(line) if starts else []
        kind = next((k for k, first in KINDS.items() if header and header[0] == first), None)
        if kind is None:
            number += 1
            continue
        assert header[1:] == COLUMNS, f"line {number + 1}: the {kind} table's columns must be {COLUMNS}, got {header[1:]}"
        assert kind not in tables, f"line {number + 1}: a second {kind!r} table"
        assert re.fullmatch(r"\|(\s*-+\s*\|)+", lines[number + 1].strip()), f"line {number + 2}: no separator row"
        rows = tables[kind] = []
        number += 2
        while number < len(lines) and lines[number].startswith("|"):
            cells = _cells(lines[number])
            where = f"{GUIDE.name} line {number + 1}"
            assert len(cells) == 6, f"{where}: {len(cells)} cells, expected 6 (no '|' inside a cell)"
            tf_match = _NAME_CELL.match(cells[0])
            assert tf_match, f"{where}: the first cell must be one `name`, got {cells[0]!r}"
            if cells[1] == "—":
                keras_name = None
            else:
                keras_match = _NAME_CELL.match(cells[1])
                assert keras_match and keras_match.group(1).startswith("keras_dist."), (
                    f"{where}: the keras_dist cell must be `keras_dist....` or —, got {cells[1]!r}"
                )
                keras_name = keras_match.group(1)
            support = {}
            for column, cell in zip(BACKEND_COLUMNS, cells[2:5]):
                match = _SUPPORT.match(cell)
                assert match, f'{where}: {column} must be yes, no (issue #14/#15) or error: Type "message"; got {cell!r}'
                support[column] = match
            row = Row(kind, number + 1, tf_match.group(1), keras_name, support, cells[5])
            if any(m.group("yes") or m.group("type") for m in support.values()):
                assert keras_name, f"{row.where()}: a yes/error row needs its keras_dist name"
            else:
                assert keras_name is None, f"{row.where()}: a row with no keras_dist name on either backend has — there"
            rows.append(row)
            number += 1
    missing = set(KINDS) - set(tables)
    assert not missing, f"{GUIDE.name} has no table whose first column is {[KINDS[k] for k in missing]}"
    return tables


TABLES = parse_tables(GUIDE.read_text())


def _rows(kind: str) -> list:
    return [pytest.param(row, id=row.tf_name) for row in TABLES[kind]]


# -- resolving keras_dist names ------------------------------------------------


def resolve(dotted: str) -> Any:
    """`keras_dist.a.b.c` by attribute, importing submodules; MISSING if absent."""
    parts = dotted.split(".")
    assert parts[0] == "keras_dist", dotted
    value, path = keras_dist, "keras_dist"
    for part in parts[1:]:
        path = f"{path}.{part}"
        try:
            value = getattr(value, part)
            continue
        except AttributeError:
            pass
        if not isinstance(value, types.ModuleType):
            return MISSING
        try:
            value = importlib.import_module(path)
        except ImportError:
            return MISSING
    return value


_instances: dict = {}


def owner_instances(owner: str) -> list:
    """What `Owner.attr` is looked up on: a strategy, its extended and the
    default replica context are instances (attributes set in `__init__`
    count); other owners are the keras_dist class itself."""
    if not _instances:
        strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(NUM_DEVICES)])
        _instances["Strategy"] = [strategy, keras_dist.Strategy]
        _instances["StrategyExtended"] = [strategy.extended, keras_dist.StrategyExtended]
        _instances["ReplicaContext"] = [keras_dist.get_replica_context(), keras_dist.ReplicaContext]
        assert isinstance(strategy.extended, keras_dist.StrategyExtended)
        assert isinstance(keras_dist.get_replica_context(), keras_dist.ReplicaContext)
    if owner in _instances:
        return _instances[owner]
    cls = resolve(f"keras_dist.{owner}")
    return [] if cls is MISSING else [cls]


def resolves(row: Row, name: str) -> bool:
    if row.kind != "methods":
        return resolve(name) is not MISSING
    owner, _, attr = name[len("keras_dist.") :].rpartition(".")
    assert owner and "." not in owner, f"{row.where()}: a method's keras_dist name is keras_dist.Class.attr, got {name}"
    objects = owner_instances(owner)
    return bool(objects) and hasattr(objects[0], attr)


def spellings(row: Row) -> set:
    """Every keras_dist spelling a `no` row's tf name could land under."""
    if row.kind == "methods":
        return set()
    parts = row.tf_name.split(".")
    last = parts[-1]
    found = {f"keras_dist.{last}", f"keras_dist.experimental.{last}"}
    if row.tf_name.startswith("tf.distribute."):
        rest = parts[2:]
        found.add(".".join(["keras_dist", *rest]))
        if rest[0] == "experimental":
            found.add(".".join(["keras_dist", *rest[1:]]))
        else:
            found.add(".".join(["keras_dist", "experimental", *rest]))
    return found


#: spellings that name a different tf object than the row's (same last name)
NOT_THE_SAME = {
    "tf.distribute.experimental.rpc.Server": {"keras_dist.Server"},  # that is tf.distribute.Server
}


def method_exists_anywhere(row: Row) -> list:
    """Where a `no` method row's tf attribute is found on keras_dist."""
    owner, _, attr = row.tf_name.rpartition(".")
    places = list(owner_instances(owner))
    if owner == "Strategy":
        places += [resolve(f"keras_dist.{name}") for name in STRATEGY_CLASSES]
    return [place for place in places if place is not MISSING and hasattr(place, attr)]


# -- what `error:` rows claim ----------------------------------------------------


def _devices_inside_run():
    strategy = keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(NUM_DEVICES)])
    strategy.run(lambda: keras_dist.get_replica_context().devices)


#: (tf name, backend column) -> a call that must raise the row's error.
def _server_on_jax():
    keras_dist.Server({"ps": ["127.0.0.1:1"]}, job_name="ps", task_index=0, start=False)


def _parameter_servers():
    resolver = keras_dist.cluster_resolver.SimpleClusterResolver(
        {"chief": ["127.0.0.1:1"], "worker": ["127.0.0.1:2"], "ps": ["127.0.0.1:3"]}, task_type="chief", task_id=0
    )
    return keras_dist.ParameterServerStrategy(resolver)


def _tpu_strategy():
    keras_dist.TPUStrategy(keras_dist.cluster_resolver.TPUClusterResolver(tpu="local"))


TRIGGERS = {
    ("ReplicaContext.devices", "JAX"): _devices_inside_run,
    ("tf.distribute.Server", "JAX"): _server_on_jax,
    ("tf.distribute.Server", "torch"): _server_on_jax,
    ("tf.distribute.ParameterServerStrategy", "torch"): _parameter_servers,
    ("tf.distribute.experimental.ParameterServerStrategy", "torch"): _parameter_servers,
    ("tf.distribute.coordinator.ClusterCoordinator", "torch"): lambda: keras_dist.coordinator.ClusterCoordinator(
        _parameter_servers()
    ),
    ("tf.distribute.experimental.coordinator.ClusterCoordinator", "torch"): lambda: keras_dist.coordinator.ClusterCoordinator(
        _parameter_servers()
    ),
    ("tf.distribute.TPUStrategy", "torch"): _tpu_strategy,
    ("tf.distribute.experimental.TPUStrategy", "torch"): _tpu_strategy,
    ("tf.tpu.experimental.initialize_tpu_system", "torch"): lambda: keras_dist.tpu.experimental.initialize_tpu_system(),
}


# -- the tests -------------------------------------------------------------------

COLUMN = BACKEND_COLUMN[BACKEND]


@pytest.mark.parametrize("row", _rows("names") + _rows("methods") + _rows("others"))
def test_row_is_true_on_this_backend(row):
    match = row.support[COLUMN]
    if match.group("yes") or match.group("type"):
        assert resolves(row, row.keras_name), (
            f"{row.where()} says {match.group(0)!r} on {COLUMN} for {row.keras_name}, which does not resolve"
        )
    if match.group("issue"):
        if row.keras_name:
            assert not resolves(row, row.keras_name), (
                f"{row.where()}: {row.keras_name} exists now; change {COLUMN}'s 'no' to yes (and the notes)"
            )
        others = NOT_THE_SAME.get(row.tf_name, set())
        landed = sorted(name for name in spellings(row) - others if resolve(name) is not MISSING)
        if row.kind == "methods":
            landed = method_exists_anywhere(row)
        assert not landed, f"{row.where()} says {match.group(0)!r} on {COLUMN}, but keras_dist has {landed}: update the row"
    if match.group("type"):
        trigger = TRIGGERS.get((row.tf_name, COLUMN))
        assert trigger, f"{row.where()}: add a trigger for its {COLUMN} error to TRIGGERS"
        with pytest.raises(Exception) as info:
            trigger()
        assert type(info.value).__name__ == match.group("type"), f"{row.where()}: raised {info.value!r}"
        assert match.group("message") in str(info.value), f"{row.where()}: raised {info.value!r}"


def test_every_trigger_has_its_error_row():
    rows = {
        (row.tf_name, column): match
        for rows in TABLES.values()
        for row in rows
        for column, match in row.support.items()
    }
    for key in TRIGGERS:
        assert key in rows and rows[key].group("type"), f"TRIGGERS has {key}, whose row does not say error:"


def test_issue_numbers():
    """#14 is parameter-server training, #15 everything else."""
    for row in [row for rows in TABLES.values() for row in rows]:
        want = "14" if PARAMETER_SERVER.search(row.tf_name) else "15"
        for column, match in row.support.items():
            if match.group("issue"):
                assert match.group("issue") == want, f"{row.where()}: {column} should cite issue #{want}"


def test_each_name_once_and_required_methods_listed():
    for kind, rows in TABLES.items():
        names = [row.tf_name for row in rows]
        duplicates = sorted({name for name in names if names.count(name) > 1})
        assert not duplicates, f"{kind} table lists {duplicates} more than once"
    assert all(row.tf_name.startswith("tf.distribute.") for row in TABLES["names"])
    assert not any(row.tf_name.startswith("tf.distribute.") for row in TABLES["others"]), "tf.distribute names go in the first table"
    assert all(re.fullmatch(r"(Strategy|StrategyExtended|ReplicaContext)\.\w+", row.tf_name) for row in TABLES["methods"])
    missing = REQUIRED_METHODS - {row.tf_name for row in TABLES["methods"]}
    assert not missing, f"the methods table lacks {sorted(missing)}"


def test_every_keras_dist_name_mentioned_resolves():
    """Prose and notes included: `keras_dist.a.b` anywhere in the guide."""
    text = GUIDE.read_text()
    mentioned = sorted(set(re.findall(r"(?<![\w/.])keras_dist(?:\.[A-Za-z_]\w*)+", text)))
    assert mentioned
    missing = [name for name in mentioned if resolve(name) is MISSING]
    assert not missing, f"{GUIDE.name} mentions names keras_dist does not have: {missing}"


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute's own names: tensorflow is not installed with the JAX backend")
def test_every_tf_distribute_name_has_a_row():
    import tensorflow as tf

    expected = set()

    def walk(module, path, seen):
        for name in dir(module):
            if name.startswith("_"):
                continue
            expected.add(f"{path}.{name}")
            value = getattr(module, name)
            if isinstance(value, types.ModuleType) and id(value) not in seen:
                walk(value, f"{path}.{name}", seen | {id(value)})

    walk(tf.distribute, "tf.distribute", {id(tf.distribute)})
    listed = {row.tf_name for row in TABLES["names"]}
    assert not expected - listed, f"tf.distribute names without a row: {sorted(expected - listed)}"
    assert not listed - expected, f"rows for names tf.distribute {tf.__version__} does not have: {sorted(listed - expected)}"


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf's classes: tensorflow is not installed with the JAX backend")
def test_every_tf_method_has_a_row():
    import tensorflow as tf

    expected = set(NOT_IN_TF_DIR)
    for owner, cls in [
        ("Strategy", tf.distribute.Strategy),
        ("StrategyExtended", tf.distribute.StrategyExtended),
        ("ReplicaContext", tf.distribute.ReplicaContext),
    ]:
        expected |= {f"{owner}.{name}" for name in dir(cls) if not name.startswith("_")}
    # not in the classes' dir(): tf.compat.v1's method, and an attribute tf's
    # strategies set on their extended
    assert hasattr(tf.compat.v1.distribute.StrategyExtended, "broadcast_to")
    tf_extended = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"]).extended
    assert tf_extended.experimental_enable_get_next_as_optional is True
    listed = {row.tf_name for row in TABLES["methods"]}
    assert not expected - listed, f"tf methods without a row: {sorted(expected - listed)}"
    assert not listed - expected, f"rows for methods tf {tf.__version__} does not have: {sorted(listed - expected)}"
