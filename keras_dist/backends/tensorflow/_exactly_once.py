"""Writes to parameter servers applied exactly once (TensorFlow).

tf's `ClusterCoordinator` runs a function again on another worker when its
worker fails, so a function whose writes reached the ps just before its
worker died was applied twice (tf's at-least-once; `iterations` ended at 61
of 60 scheduled steps). Here every write a scheduled function makes to a
variable on a ps is a *gate*, applied once per function however often the
function runs:

- `schedule` gives each function an id (a tensor argument of the traced
  function, so a re-run carries the same id) and traces it under
  `closure_writes`, which numbers the function's writes in program order
  (a counter on the worker, reset when the function starts): a write's
  key is ``id * 2**24 + its number``, the same on every run.
- A gate is one `If` op on the variable's device, kept whole (not lowered
  to Switch/Merge): it starts only once every input (gradient, value) is on
  that ps, and then, with no remote input left, claims the key in the
  ps's table (a `MutableHashTable`, the claim exclusive under a
  `CriticalSection`) and writes, or skips a key already claimed.
- What goes through a gate: each variable update of an optimizer (tf's
  `extended.update`, which Keras' optimizer uses), and Keras
  `assign`/`assign_add`/`assign_sub` of a ps variable (`iterations`,
  metrics, BatchNorm statistics, counters). In `optimizer.apply`,
  `iterations` and the learning rate are read once before the updates
  (`SnapshotScope`), so no gate reads another task's variable, and
  `iterations` moves by one gated increment.
- `forget` drops the keys of functions already done (at `join`).

Limits: a raw `tf.Variable` written by the user's own code is tf's
at-least-once; a re-run must make the same writes in the same order (a
branch on a value that another worker changed in between could make
different ones).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Optional

import tensorflow as tf
from keras.src.backend.common import stateless_scope as keras_stateless
from tensorflow.core.framework import attr_value_pb2

#: writes one function may make (a key is id * _WRITES + number)
_WRITES = 2**24
#: a key's value in a claim table: applied by the run that claimed it; a
#: later run of the same function found it so
_APPLIED, _SKIPPED = 1, 2
_COUNTER = "keras_dist_closure_writes"
#: the graph of each scheduled function being traced -> its `_Closure`.
#: Keyed by graph, not thread: tf.distribute builds a replica's ops in a
#: thread of its own, and optimizer updates back in the tracing thread.
_closures: dict = {}


class ClosureGates:
    """One coordinator's function ids and the claim table on each ps device."""

    def __init__(self):
        self._next_id = 0
        self._claims: dict = {}  # device -> (MutableHashTable, CriticalSection)
        self._functions: dict = {}  # id(fn) -> (fn, traced closure)
        #: writes a function's second run found applied (counted at forget)
        self.skipped_writes = 0

    def next_id(self) -> tf.Tensor:
        closure_id = self._next_id
        self._next_id += 1
        return tf.constant(closure_id, tf.int64)

    def claims(self, device: str):
        entry = self._claims.get(device)
        if entry is None:
            with tf.init_scope(), tf.device(device):
                table = tf.lookup.experimental.MutableHashTable(tf.int64, tf.int64, default_value=0)
                entry = (table, tf.CriticalSection(name="keras_dist_claims"))
            self._claims[device] = entry
        return entry

    def claimed(self) -> int:
        """How many keys the ps tables hold (functions not yet forgotten)."""
        return sum(int(table.size().numpy()) for table, _ in self._claims.values())

    def forget(self) -> None:
        """Drops every key: call when no function is in flight (after join).
        Counts the writes a re-run skipped (`skipped_writes`) first."""
        for table, _ in self._claims.values():
            keys, values = table.export()
            self.skipped_writes += int(tf.reduce_sum(tf.cast(values == _SKIPPED, tf.int64)).numpy())
            table.remove(keys)

    def closure_function(self, fn: Callable) -> Any:
        """`fn` as the tf.function the coordinator runs: its first argument
        is the function's id, its writes to ps variables gated."""
        entry = self._functions.get(id(fn))
        if entry is not None and entry[0] is fn:
            return entry[1]
        if getattr(fn, "_jit_compile", False):
            raise ValueError(
                "ClusterCoordinator.schedule got a tf.function(jit_compile=True): its "
                "writes go to the parameter servers, which XLA cannot compile. Compile "
                "the computation inside it instead (e.g. the replica function passed to "
                "strategy.run), or drop jit_compile."
            )
        python_function = getattr(fn, "python_function", fn)

        def closure(closure_id, *args, **kwargs):
            with closure_writes(self, closure_id):
                return python_function(*args, **kwargs)

        traced = tf.function(closure)
        self._functions[id(fn)] = (fn, traced)
        return traced


class _Closure:
    def __init__(self, gates: ClosureGates, closure_id: tf.Tensor):
        self.gates = gates
        self.closure_id = closure_id
        # a counter on the worker running the function (one function at a
        # time per worker), reset as the function starts
        self.counter = tf.raw_ops.VarHandleOp(dtype=tf.int64, shape=[], shared_name=_COUNTER)
        tf.raw_ops.AssignVariableOp(resource=self.counter, value=tf.constant(0, tf.int64))
        #: the `SnapshotScope` of the optimizer.apply being traced, if any
        self.snapshot_scope = None

    def next_key(self) -> tf.Tensor:
        with tf.device(None):
            tf.raw_ops.AssignAddVariableOp(resource=self.counter, value=tf.constant(1, tf.int64))
            number = tf.raw_ops.ReadVariableOp(resource=self.counter, dtype=tf.int64)
            return self.closure_id * _WRITES + number


@contextlib.contextmanager
def closure_writes(gates: ClosureGates, closure_id: tf.Tensor):
    """While tracing a scheduled function: its ps writes go through gates."""
    graph = tf.compat.v1.get_default_graph()
    _closures[graph] = _Closure(gates, closure_id)
    try:
        yield
    finally:
        del _closures[graph]


def _current() -> Optional[_Closure]:
    graph = tf.compat.v1.get_default_graph()
    while graph is not None:
        closure = _closures.get(graph)
        if closure is not None:
            return closure
        graph = getattr(graph, "outer_graph", None)
    return None


def in_closure() -> bool:
    return bool(_closures) and _current() is not None


def once(device: str, write: Callable[[], Any]) -> tf.Tensor:
    """Runs `write` (ops on `device`) in a gate: once per scheduled function.
    Returns whether this run applied it (False: an earlier run had)."""
    closure = _current()
    key = closure.next_key()
    table, section = closure.gates.claims(device)

    def claim():
        first = tf.equal(table.lookup(key), 0)
        with tf.control_dependencies([first]):
            mark = tf.where(first, tf.constant(_APPLIED, tf.int64), tf.constant(_SKIPPED, tf.int64))
            inserted = table.insert(key, mark)
        with tf.control_dependencies([inserted]):
            return tf.identity(first)

    def gate():
        def apply():
            write()
            return tf.constant(True)

        return tf.cond(section.execute(claim), apply, lambda: tf.constant(False))

    with tf.device(device):
        # the predicate is always true, but only known when it runs: the If
        # is kept (not folded away), and kept whole
        applied = tf.cond(key >= 0, gate, lambda: tf.constant(False))
    _keep_whole(applied)
    return applied


def _keep_whole(output: tf.Tensor) -> None:
    """Marks the `If` op behind `output` not to be lowered to Switch/Merge
    (lowered, its writes would each wait for their own inputs: a worker
    dying mid-way would leave some applied)."""
    op = output.op
    while op.type not in ("If", "StatelessIf"):
        op = op.inputs[0].op
    op._set_attr("_lower_using_switch_merge", attr_value_pb2.AttrValue(b=False))


# -- what goes through gates ---------------------------------------------------


def gated_update(original: Callable) -> Callable:
    """tf's `StrategyExtended._update` (what `extended.update`, and so every
    Keras optimizer update on tf.distribute, calls): inside a scheduled
    function, `fn(var, ...)` runs in a gate on `var`'s device."""

    def _update(var, fn, args, kwargs, group):
        if not in_closure():
            return original(var, fn, args, kwargs, group)
        from tensorflow.python.distribute import distribute_lib

        extended = original.__self__
        args, kwargs = extended._select_single_value(args), extended._select_single_value(kwargs)

        snapshot_scope = _current().snapshot_scope

        def write():
            # tf.distribute runs this in the tracing thread, not the replica
            # thread that entered the optimizer's SnapshotScope: enter it here
            entered = contextlib.nullcontext() if snapshot_scope is None else _as_stateless_scope(snapshot_scope)
            with distribute_lib.UpdateContext(var.device), entered:
                fn(var, *args, **kwargs)

        applied = once(var.device, write)
        return applied if group else (applied,)

    return _update


def assign(target, value, kind: str) -> tf.Tensor:
    """`target.assign`/`assign_add`/`assign_sub(value)` in a gate; returns
    the variable's value after it."""
    value = tf.cast(tf.convert_to_tensor(value), target.dtype)
    applied = once(target.device, lambda: getattr(target, kind)(value))
    with tf.control_dependencies([applied]):
        return target.read_value()


class SnapshotScope(keras_stateless.StatelessScope):
    """Keras' stateless scope over an optimizer's own variables
    (`iterations`, the learning rate): read once, before the updates, so
    the gates read nothing from another task; their writes are kept here
    and applied after as one gated increment each. Every other write goes
    to its variable (through its own gate)."""

    def __init__(self, variables: list):
        super().__init__(state_mapping=[(v, tf.identity(v.value)) for v in variables], initialize_variables=False)
        # the values as the scope holds them (what its reads return), kept
        # as they were: `add_update` replaces them in `state_mapping`
        self.snapshots = [(v, self.state_mapping[id(v)]) for v in variables]

    def holds(self, variable) -> bool:
        # only the snapshotted variables are ever in the mapping: every other
        # write goes to its variable (`add_update`)
        return id(variable) in self.state_mapping

    def add_update(self, update) -> None:
        variable, value = update
        if self.holds(variable):
            super().add_update(update)
        else:  # a write of a variable not snapshotted: written now
            with _as_stateless_scope(self.original_scope):
                variable.assign(value)

    def apply_writes(self) -> None:
        for variable, before in self.snapshots:
            after = self.get_current_value(variable)
            if after is not before:
                assign(variable._value, after - before, "assign_add")


@contextlib.contextmanager
def _as_stateless_scope(scope):
    """`scope` (None: none) as Keras' stateless scope of this thread for the
    block; the one before it after."""
    from keras.src.backend.common import global_state

    previous = keras_stateless.get_stateless_scope()
    if previous is scope:
        yield
        return
    global_state.set_global_attribute("stateless_scope", scope)
    try:
        yield
    finally:
        global_state.set_global_attribute("stateless_scope", previous)


def current_snapshot_scope() -> Optional[SnapshotScope]:
    scope = keras_stateless.get_stateless_scope()
    return scope if isinstance(scope, SnapshotScope) else None


def apply_optimizer(own: list, build: Optional[Callable[[], None]], apply: Callable[[], Any]) -> Any:
    """`optimizer.apply` (`apply()`) inside a scheduled function: built
    first if `build` is given (Keras cannot make its slots in a stateless
    scope), then run under a `SnapshotScope` of `own` (its variables on a
    ps that the updates read: `iterations`, the learning rate), whose
    writes follow."""
    if build is not None:
        build()
    closure = _current()
    with SnapshotScope(own) as scope:
        closure.snapshot_scope = scope
        try:
            result = apply()
        finally:
            closure.snapshot_scope = None
    scope.apply_writes()
    return result
