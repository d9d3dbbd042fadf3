"""Keras variables read and written inside `strategy.run` (JAX).

JAX traces `run`'s function into one pure program, where a variable cannot
be used in place: a read would bake today's value into the compiled
program (stale at the next call) and a write would leak a tracer into the
variable, leaving it unusable. So `run` traces the function under a
`VariableAccess` (Keras' public `StatelessScope` protocol: `Variable.value`
asks the scope, `assign` reports to it): every variable read becomes an
input of the program, every write a value the program returns, and `run`
assigns those values only after the program has run. A failed trace or call
assigns nothing.

Writes follow tf.distribute's replica-context semantics (checked against
tf.distribute itself in tests/test_run_variables.py):

- a mirrored variable (``synchronization`` "auto"/"on_write") is updated
  with its ``aggregation`` applied to the replicas' values, and every
  replica reads the result at once: "sum" (``assign(x)`` -> the sum of the
  replicas' x; ``assign_add(x)`` -> v + that sum), "mean", and
  "only_first_replica" (replica 0's x). With "none", a value that is the
  same on every replica (JAX proves it) is taken as is; one that differs
  raises, naming the fix (tf would let the copies silently diverge).
- a sync-on-read variable (``synchronization="on_read"``, as every Keras
  metric's) keeps one value per replica; read outside `run` it is the
  aggregate over replicas ("sum", "mean", "only_first_replica"). A value
  assigned outside `run` is split as tf splits a cross-replica assign: a
  "sum" variable's replicas hold value / replicas, others the value.
"""

from __future__ import annotations

import contextlib

import jax
import jax.numpy as jnp
import keras
from jax.sharding import NamedSharding, PartitionSpec as P

from keras_dist._values import differs_across_replicas_message
from keras_dist.backends.jax._engine import BATCH_AXIS, replicated_sharding

ON_READ = "on_read"
_AGGREGATIONS = ("sum", "mean", "only_first_replica")

#: Attribute of an on-read variable: (per-replica values (replicas, *shape),
#: the variable's `_value` they aggregate to); stale once the variable is
#: assigned outside run.
_REPLICA_VALUES = "_keras_dist_replica_values"


def varying(x) -> bool:
    """Whether `x` (inside the mapped function) may differ across replicas."""
    aval = jax.typeof(x)
    vma = getattr(aval, "vma", None)
    if vma is None:
        vma = aval.manual_axis_type.varying
    return BATCH_AXIS in vma


def make_varying(x):
    """`x` typed as varying over the replicas (its value unchanged)."""
    if varying(x):
        return x
    if hasattr(jax.lax, "pcast"):
        return jax.lax.pcast(x, BATCH_AXIS, to="varying")
    return jax.lax.pvary(x, BATCH_AXIS)


def active_access():
    """The `VariableAccess` Keras variables report to now (the innermost
    stateless scope, if it is one), else None."""
    from keras.src.backend.common.stateless_scope import get_stateless_scope

    scope = get_stateless_scope()
    return scope if isinstance(scope, VariableAccess) else None


def is_on_read(variable) -> bool:
    return variable.synchronization == ON_READ


class VariableAccess(keras.StatelessScope):
    """The variables one traced `run` reads and writes.

    `inputs` maps id(variable) to its value inside the program (planned
    inputs); a variable read that is not there is recorded in `reads` and
    given a placeholder of the right shape (the probe trace, which only
    discovers shapes). `writes` lists the variables written, in order.
    """

    def __init__(self, num_replicas: int, inputs: dict | None = None, discover: bool = True):
        super().__init__(collect_losses=True, initialize_variables=False)
        self.num_replicas = num_replicas
        self.inputs = dict(inputs or {})
        self.discover = discover
        self.current: dict = {}
        self.reads: list = []
        self.writes: list = []
        self._cross_replica = 0
        self._sync_on_read = 0

    @contextlib.contextmanager
    def cross_replica(self):
        """Writes inside are cross-replica updates (`merge_call`): applied
        once, as given, not aggregated over replicas."""
        self._cross_replica += 1
        try:
            yield
        finally:
            self._cross_replica -= 1

    @contextlib.contextmanager
    def sync_on_read(self):
        """Reads of on-read variables inside give the value over all
        replicas, by the variable's aggregation (tf's
        `variable_sync_on_read_context`); writes are unchanged."""
        self._sync_on_read += 1
        try:
            yield
        finally:
            self._sync_on_read -= 1

    def _over_replicas(self, variable, value):
        """An on-read variable's `value` (this replica's) over all replicas."""
        aggregation = variable.aggregation
        value = make_varying(jnp.asarray(value))
        if aggregation == "sum":
            return jax.lax.psum(value, BATCH_AXIS)
        if aggregation == "mean":
            return (jax.lax.psum(value, BATCH_AXIS) / self.num_replicas).astype(value.dtype)
        if aggregation == "only_first_replica":
            first = jax.lax.axis_index(BATCH_AXIS) == 0
            return jax.lax.psum(jnp.where(first, value, jnp.zeros_like(value)), BATCH_AXIS)
        return value  # "none": each replica's own, as in tf

    # -- Keras' StatelessScope protocol ---------------------------------

    def get_current_value(self, variable):
        value = self._replica_value(variable)
        if self._sync_on_read and is_on_read(variable):
            return self._over_replicas(variable, value)
        return value

    def _replica_value(self, variable):
        key = id(variable)
        if key in self.current:
            return self.current[key]
        if key not in self.inputs:
            if not self.discover:
                raise RuntimeError(
                    f"strategy.run's function read variable {variable.path!r} "
                    "on its second trace but not its first; a function given "
                    "to run must touch the same variables every time it is traced."
                )
            placeholder = jnp.zeros(variable.shape, variable.dtype)
            self.inputs[key] = make_varying(placeholder) if is_on_read(variable) else placeholder
            self.reads.append(variable)
        return self.inputs[key]

    def add_update(self, update):
        variable, value = update
        self.write(variable, value, "assign")

    # -- writes ----------------------------------------------------------

    def write_delta(self, variable, value, sign: int):
        """`assign_add` (sign 1) / `assign_sub` (-1), routed here by keras_dist's hook."""
        return self.write(variable, value, "add" if sign > 0 else "sub")

    def write(self, variable, value, kind: str):
        value = jnp.asarray(value, dtype=variable.dtype)
        aggregation = variable.aggregation
        if is_on_read(variable):
            if aggregation not in _AGGREGATIONS:
                raise ValueError(
                    f"Variable {variable.path!r} is synchronized on read with "
                    f"aggregation={aggregation!r}, so its per-replica values "
                    "could never be combined when it is read outside "
                    "strategy.run (tf.distribute refuses to read it). Create "
                    "it with aggregation='sum', 'mean' or 'only_first_replica'."
                )
            change = value
            if self._cross_replica and aggregation == "sum":  # tf splits it over the replicas
                change = (value / self.num_replicas).astype(value.dtype)
        elif self._cross_replica:
            if varying(value):
                raise ValueError(
                    f"Variable {variable.path!r} is updated in cross-replica "
                    "context (inside merge_call) with a value that differs "
                    "per replica; reduce it first, e.g. "
                    "strategy.reduce('SUM', value, axis=None)."
                )
            change = value
        else:
            change = self._aggregate(variable, value, aggregation)
        if kind == "assign":
            new = change
        else:
            old = self.get_current_value(variable)
            new = old + change if kind == "add" else old - change
        new = jnp.asarray(new, dtype=variable.dtype)
        if tuple(new.shape) != tuple(variable.shape):
            raise ValueError(
                f"Cannot {kind} a value of shape {tuple(value.shape)} to "
                f"variable {variable.path!r} of shape {tuple(variable.shape)}."
            )
        self.current[id(variable)] = new
        if all(w is not variable for w in self.writes):
            self.writes.append(variable)
        return new

    def _aggregate(self, variable, value, aggregation):
        """A mirrored variable's update over all replicas (tf's merge_call)."""
        num = self.num_replicas
        if num == 1 and varying(value):  # one replica: its value, whatever the aggregation
            return jax.lax.psum(value, BATCH_AXIS)  # (a sum over one replica: the value, typed as equal on all)
        if not varying(value):
            if aggregation == "sum":
                return value * num
            return value
        if aggregation == "sum":
            return jax.lax.psum(value, BATCH_AXIS)
        if aggregation == "mean":
            return (jax.lax.psum(value, BATCH_AXIS) / num).astype(value.dtype)
        if aggregation == "only_first_replica":
            first = jax.lax.axis_index(BATCH_AXIS) == 0
            return jax.lax.psum(jnp.where(first, value, jnp.zeros_like(value)), BATCH_AXIS)
        raise ValueError(differs_across_replicas_message(variable.path, aggregation, "MirroredVariable"))

    def written_values(self) -> list:
        """The written variables' new values, as the program returns them
        (on-read: this replica's, made varying so it maps to a row)."""
        values = []
        for variable in self.writes:
            value = self.current[id(variable)]
            values.append(make_varying(value) if is_on_read(variable) else value)
        return values


# -- outside the program ---------------------------------------------------


def input_value(engine, variable):
    """`variable`'s value as `run`'s program takes it: mirrored, replicated
    over the mesh; on-read, one row per replica sharded over it."""
    if is_on_read(variable):
        return replica_values(engine, variable)
    value = variable.value
    if not isinstance(value, jax.Array):
        value = jnp.asarray(value)
    sharding = replicated_sharding(engine)
    if value.sharding.device_set != sharding.device_set or not value.sharding.is_fully_replicated:
        value = jax.device_put(value, sharding)
    return value


def input_spec(variable):
    return P(BATCH_AXIS) if is_on_read(variable) else P()


def replica_values(engine, variable):
    """An on-read variable's per-replica values, shape (replicas, *shape)."""
    stored = getattr(variable, _REPLICA_VALUES, None)
    num = engine.num_replicas
    if stored is not None and stored[1] is variable._value and stored[0].shape[0] == num:
        return jax.device_put(stored[0], NamedSharding(engine.mesh, P(BATCH_AXIS)))
    value = jnp.asarray(variable.value)
    if variable.aggregation == "sum":
        value = (value / num).astype(value.dtype) if jnp.issubdtype(value.dtype, jnp.floating) else value // num
    stacked = jnp.broadcast_to(value, (num,) + tuple(value.shape))
    return jax.device_put(stacked, NamedSharding(engine.mesh, P(BATCH_AXIS)))


def check_concrete(variables, values) -> None:
    """Refuses, before any assignment, values that are not concrete arrays
    (`run` called inside an outer `jax.jit`)."""
    for variable, value in zip(variables, values):
        if isinstance(value, jax.core.Tracer):
            raise RuntimeError(
                f"strategy.run updated variable {variable.path!r} while being "
                "traced by an outer jax.jit (or other transformation), where "
                "a variable cannot be assigned. Call strategy.run outside "
                "jax.jit: keras_dist compiles it already."
            )


def assign_written(variables, values) -> None:
    """Gives the variables the values the program returned (after it ran)."""
    for variable, value in zip(variables, values):
        if is_on_read(variable):
            stacked = value
            if variable.aggregation == "sum":
                total = jnp.sum(stacked, axis=0)
            elif variable.aggregation == "mean":
                total = jnp.mean(stacked, axis=0)
            else:
                total = stacked[0]
            variable.assign(total.astype(variable.dtype))
            setattr(variable, _REPLICA_VALUES, (stacked, variable._value))
        else:
            variable.assign(value)
