"""ParameterServerStrategy on JAX: the Ray actors (imports ray: optional).

- `ParameterServer`: holds a shard of the variables (whole variables, or
  row blocks of partitioned ones), keyed ``(variable id, shard)``, and for
  each optimizer a Keras optimizer built on stand-ins for its shard, applied
  with `optimizer.stateless_apply`. An actor runs one method at a time, so
  no update is lost; every push carries a key (closure id, push number) and
  a key seen before is not applied again (a function re-run after its worker
  was lost applies its update exactly once).
- `Worker`: runs scheduled functions. It holds a copy of each model (sent
  once), pulls the current values before a function, and pushes what the
  function wrote: gradients given to `optimizer.apply_gradients` / `apply`,
  and variables it assigned.

`_parameter_servers` is the coordinator's side.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import pickle
import threading
import traceback
from typing import Optional

import numpy as np

try:
    import ray
except ImportError as error:  # pragma: no cover - the message is the point
    raise ImportError(
        "ParameterServerStrategy on the JAX backend runs its workers and "
        "parameter servers as Ray actors, and Ray is not installed: "
        'pip install "keras-dist[ray]"'
    ) from error


class ParameterServerError(RuntimeError):
    """A parameter server was lost or did not answer in time: the variables
    it held are gone, training cannot go on (restore from a checkpoint)."""


class WorkerInputExhausted(RuntimeError):
    """A worker's dataset ran out inside a scheduled function (tf raises
    OutOfRangeError): repeat the dataset, and bound the steps instead."""


# -- the parameter server -------------------------------------------------


def _stand_in_name(key) -> str:
    return f"psvar{key[0]}s{key[1]}"


class _ShardOptimizer:
    """One optimizer's state on one parameter server: a Keras optimizer
    built on stand-ins for the shard's variables, applied statelessly."""

    def __init__(self, config, keys, values, start):
        import jax
        import keras

        self.keys = list(keys)
        self.optimizer = keras.optimizers.deserialize(config)
        stand_ins = [keras.Variable(np.asarray(values[k]), name=_stand_in_name(k)) for k in self.keys]
        self.optimizer.build(stand_ins)
        by_name = {v.name: v for v in self.optimizer.variables}
        self.optimizer.iterations.assign(start.get("iterations", 0))
        for name, value in start.get("extras", {}).items():
            if name in by_name:
                by_name[name].assign(value)
        for (key, suffix), value in start.get("slots", {}).items():
            name = f"{_stand_in_name(key)}_{suffix}"
            if key in self.keys and name in by_name:
                by_name[name].assign(value)
        self.variables = [v.value for v in self.optimizer.variables]
        self._iterations_index = next(i for i, v in enumerate(self.optimizer.variables) if v is self.optimizer.iterations)
        self._empty_count = int(start.get("iterations", 0))
        self._apply = jax.jit(self.optimizer.stateless_apply)

    def apply(self, values, grads):
        if not self.keys:  # a ps holding none of this optimizer's variables counts the step
            self._empty_count += 1
            return
        trainable = [values[k] for k in self.keys]
        new_trainable, self.variables = self._apply(self.variables, [grads[k] for k in self.keys], trainable)
        for key, value in zip(self.keys, new_trainable):
            values[key] = value

    @property
    def iterations(self) -> int:
        if not self.keys:
            return self._empty_count
        return int(self.variables[self._iterations_index])

    def slots(self) -> dict:
        out = {}
        names = {_stand_in_name(k): k for k in self.keys}
        for variable, value in zip(self.optimizer.variables, self.variables):
            for prefix, key in names.items():
                if variable.name.startswith(prefix + "_"):
                    out[(key, variable.name[len(prefix) + 1 :])] = np.asarray(value)
        return out


class ParameterServerActor:
    def __init__(self, index: int):
        self.index = index
        self.values: dict = {}
        self.optimizer_specs: dict = {}
        self.optimizers: dict = {}
        self.applied: set = set()
        self.duplicates = 0

    def ping(self) -> int:
        return self.index

    def put(self, values: dict) -> int:
        self.values.update(values)
        return len(values)

    def pull(self, keys) -> dict:
        return {k: np.asarray(self.values[k]) for k in keys}

    def add_optimizer(self, oid, config, start) -> None:
        self.optimizer_specs[oid] = (config, start)

    def push(self, key, oid, grads: dict, assigns: dict) -> bool:
        """Applies one push unless `key` was applied before; True if applied."""
        if key in self.applied:
            self.duplicates += 1
            return False
        missing = [k for k in list(grads) + list(assigns) if k not in self.values]
        if missing:
            raise ParameterServerError(f"ps {self.index} holds no variable {missing}")
        if oid is not None:
            optimizer = self.optimizers.get(oid)
            if optimizer is None:
                config, start = self.optimizer_specs[oid]
                optimizer = self.optimizers[oid] = _ShardOptimizer(config, sorted(grads), self.values, start)
            elif sorted(grads) != optimizer.keys:
                raise ValueError(
                    "apply_gradients was given other variables than in its first call "
                    f"(ps {self.index}: {sorted(grads)} vs {optimizer.keys}); on JAX a "
                    "ParameterServerStrategy optimizer updates one fixed set of variables."
                )
            optimizer.apply(self.values, grads)
        self.values.update(assigns)
        self.applied.add(key)
        return True

    def forget(self, closure_ids) -> int:
        """Drops the keys of these closures' pushes (they finished before
        the coordinator's previous `join`: none of their pushes can come
        again), so the keys kept stay bounded; returns how many are kept."""
        ids = set(closure_ids)
        self.applied = {key for key in self.applied if key[0] not in ids}
        return len(self.applied)

    def optimizer_state(self, oid) -> Optional[dict]:
        optimizer = self.optimizers.get(oid)
        if optimizer is None:
            return None
        return {"iterations": optimizer.iterations, "keys": optimizer.keys, "slots": optimizer.slots()}

    def report(self) -> dict:
        """What this ps holds and has applied (tests read it)."""
        return {
            "keys": sorted(self.values),
            "iterations": {oid: o.iterations for oid, o in self.optimizers.items()},
            "applied": len(self.applied),
            "duplicates": self.duplicates,
        }


# -- the worker -------------------------------------------------------------

_current = threading.local()


def current_worker() -> Optional["_WorkerRuntime"]:
    """The worker runtime running a scheduled function in this process."""
    return getattr(_current, "runtime", None)


class _WorkerStrategy:
    """What a scheduled function sees of the strategy on a worker: one
    replica (`run` calls the function, `reduce` of one replica is itself)."""

    num_replicas_in_sync = 1

    def run(self, fn, args=(), kwargs=None, options=None):
        return fn(*args, **(kwargs or {}))

    def reduce(self, reduce_op, value, axis=None):
        if axis is None:
            return value
        import keras

        op = str(getattr(reduce_op, "value", reduce_op)).upper()
        if op.endswith("MEAN"):
            return keras.tree.map_structure(lambda v: np.mean(np.asarray(v), axis=axis), value)
        return keras.tree.map_structure(lambda v: np.sum(np.asarray(v), axis=axis), value)

    def experimental_local_results(self, value):
        return (value,)

    @contextlib.contextmanager
    def scope(self):
        yield self


class _PushingOptimizer:
    """A coordinator optimizer as a scheduled function sees it on a worker:
    `apply_gradients`/`apply` push the gradients to the parameter servers,
    which apply them with the optimizer's state there."""

    def __init__(self, oid):
        self._oid = oid

    def apply_gradients(self, grads_and_vars):
        grads, variables = zip(*grads_and_vars)
        current_worker().push_gradients(self._oid, grads, variables)

    def apply(self, grads, trainable_variables=None):
        if trainable_variables is None:
            raise ValueError("On a parameter-server worker, optimizer.apply needs trainable_variables.")
        current_worker().push_gradients(self._oid, list(grads), list(trainable_variables))

    def scale_loss(self, loss):
        return loss

    def __getattr__(self, name):
        raise AttributeError(
            f"optimizer.{name} is not available inside a scheduled function on JAX: "
            "its state lives on the parameter servers. Call apply_gradients() there; "
            "read the optimizer (iterations, variables) in the coordinator after join()."
        )


class _Unpickler(pickle.Unpickler):
    def __init__(self, file, runtime):
        super().__init__(file)
        self.runtime = runtime

    def persistent_load(self, pid):
        return self.runtime.resolve(pid)


class _Model:
    """A worker's copy of one coordinator model, and where its variables live."""

    def __init__(self, model, layout, oid):
        self.model = model
        self.variables = list(model.trainable_variables) + list(model.non_trainable_variables)
        self.layout = layout  # [(vid, [(ps, key, (start, stop) | None)])], same order
        self.vid_of = {id(v): vid for v, (vid, _) in zip(self.variables, layout)}
        self.oid = oid
        self.pulled: dict = {}


class _WorkerRuntime:
    def __init__(self, index, num_workers, ps_handles, ps_timeout):
        self.index = index
        self.num_workers = num_workers
        self.ps = list(ps_handles)
        self.ps_timeout = ps_timeout
        self.models: dict = {}
        self.variable_owner: dict = {}  # id(worker variable) -> _Model
        self.datasets: dict = {}
        self.iterators: dict = {}
        self.closure = None
        self.push_count = 0
        self.strategy = _WorkerStrategy()

    # -- what a scheduled function's pickle refers to
    def resolve(self, pid):
        kind = pid[0]
        if kind == "model":
            return self.models[pid[1]].model
        if kind == "variable":
            return self.models[pid[1]].variables[pid[2]]
        if kind == "optimizer":
            return _PushingOptimizer(pid[1])
        if kind == "strategy":
            return self.strategy
        if kind == "iterator":
            return self.iterator(pid[1], pid[2])
        raise ValueError(f"unknown reference {pid!r}")

    def iterator(self, iterator_id, dataset_id):
        if iterator_id not in self.iterators:
            dataset = self.datasets[dataset_id]
            self.iterators[iterator_id] = _NumpyIterator(dataset)
        return self.iterators[iterator_id]

    # -- variables
    def _ps_get(self, refs):
        try:
            return ray.get(refs, timeout=self.ps_timeout)
        except ray.exceptions.GetTimeoutError as error:
            raise ParameterServerError(
                f"a parameter server did not answer within {self.ps_timeout} s"
            ) from error
        except ray.exceptions.RayActorError as error:
            raise ParameterServerError(
                f"a parameter server was lost ({type(error).__name__}): the variables it held are gone; "
                "training cannot continue. Restore from a checkpoint."
            ) from error

    def pull(self, copy: _Model):
        keys_by_ps: dict = {}
        for _, placement in copy.layout:
            for ps, key, _ in placement:
                keys_by_ps.setdefault(ps, []).append(key)
        order = sorted(keys_by_ps)
        answers = self._ps_get([self.ps[p].pull.remote(keys_by_ps[p]) for p in order])
        values = {}
        for answer in answers:
            values.update(answer)
        copy.pulled = {}
        for variable, (vid, placement) in zip(copy.variables, copy.layout):
            parts = [values[key] for _, key, _ in placement]
            value = parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0)
            variable.assign(value)
            copy.pulled[vid] = variable._value

    def _split(self, copy: _Model, vid, value) -> dict:
        """{ps: {key: block}} for one variable's value."""
        placement = dict(copy.layout)[vid]
        value = np.asarray(value)
        out: dict = {}
        for ps, key, rows in placement:
            out.setdefault(ps, {})[key] = value if rows is None else value[rows[0] : rows[1]]
        return out

    def _push(self, oid, grads_by_copy: list, assigns_by_copy: list):
        per_ps_grads = {p: {} for p in range(len(self.ps))}
        per_ps_assigns = {p: {} for p in range(len(self.ps))}
        for copy, vid, value in grads_by_copy:
            for p, blocks in self._split(copy, vid, value).items():
                per_ps_grads[p].update(blocks)
        for copy, vid, value in assigns_by_copy:
            for p, blocks in self._split(copy, vid, value).items():
                per_ps_assigns[p].update(blocks)
        key = (self.closure, self.push_count)
        self.push_count += 1
        targets = range(len(self.ps)) if oid is not None else [p for p in per_ps_assigns if per_ps_assigns[p]]
        refs = [self.ps[p].push.remote(key, oid, per_ps_grads[p], per_ps_assigns[p]) for p in targets]
        self._ps_get(refs)

    def push_gradients(self, oid, grads, variables):
        entries = []
        for grad, variable in zip(grads, variables):
            copy = self.variable_owner.get(id(variable))
            if copy is None:
                raise ValueError(
                    f"apply_gradients got variable {getattr(variable, 'path', variable)!r}, which is not a "
                    "variable of a model this scheduled function refers to; on JAX, pass the model's "
                    "own variables (model.trainable_variables)."
                )
            if grad is None:
                raise ValueError(f"apply_gradients got no gradient (None) for {variable.path!r}.")
            entries.append((copy, copy.vid_of[id(variable)], grad))
        self._push(oid, entries, [])

    def push_writes(self, copies):
        """Variables the function assigned (not through the optimizer)."""
        writes = []
        for copy in copies:
            for variable, (vid, _) in zip(copy.variables, copy.layout):
                if variable._value is not copy.pulled.get(vid):
                    writes.append((copy, vid, variable.value))
        if writes:
            self._push(None, [], writes)

    def push_step(self, copy: _Model, grads, non_trainable_values):
        """fit's step: the gradients and the new non-trainable values, in one push."""
        trainable = copy.model.trainable_variables
        entries = [(copy, copy.vid_of[id(v)], g) for v, g in zip(trainable, grads)]
        writes = [
            (copy, copy.vid_of[id(v)], value) for v, value in zip(copy.model.non_trainable_variables, non_trainable_values)
        ]
        if copy.oid is None:
            raise ValueError("fit on a ParameterServerStrategy needs a compiled model (model.compile(optimizer=...)).")
        # one push per ps: gradients and writes together
        per_ps_grads = {p: {} for p in range(len(self.ps))}
        per_ps_assigns = {p: {} for p in range(len(self.ps))}
        for c, vid, value in entries:
            for p, blocks in self._split(c, vid, value).items():
                per_ps_grads[p].update(blocks)
        for c, vid, value in writes:
            for p, blocks in self._split(c, vid, value).items():
                per_ps_assigns[p].update(blocks)
        key = (self.closure, self.push_count)
        self.push_count += 1
        self._ps_get([self.ps[p].push.remote(key, copy.oid, per_ps_grads[p], per_ps_assigns[p]) for p in range(len(self.ps))])


class _NumpyIterator:
    """A worker's iterator over its dataset (tf.data or any Python
    iterable), yielding NumPy values."""

    def __init__(self, dataset):
        if hasattr(dataset, "as_numpy_iterator"):
            self._iterator = dataset.as_numpy_iterator()
        else:
            self._iterator = iter(dataset)

    def __iter__(self):
        return self

    def __next__(self):
        try:
            return next(self._iterator)
        except StopIteration:
            raise WorkerInputExhausted(
                "The worker's dataset ran out inside a scheduled function. Repeat the "
                "dataset (dataset.repeat()) and bound the steps (steps_per_epoch, or the "
                "number of functions you schedule)."
            ) from None


def _to_host(value):
    import keras

    def host(v):
        if hasattr(v, "__array__") and not isinstance(v, np.ndarray):
            return np.asarray(v)
        return v

    return keras.tree.map_structure(host, value)


class WorkerActor:
    def __init__(self, index: int, num_workers: int, ps_handles, ps_timeout: float):
        self.runtime = _WorkerRuntime(index, num_workers, ps_handles, ps_timeout)
        self.executed = 0

    def ping(self) -> int:
        return self.runtime.index

    def load_model(self, mid, model_bytes, layout, oid) -> None:
        model = pickle.loads(model_bytes)
        copy = _Model(model, layout, oid)
        if len(copy.variables) != len(layout):
            raise ValueError("the worker's copy of the model has other variables than the coordinator's")
        if oid is not None and getattr(model, "optimizer", None) is not None:
            pushing = _PushingOptimizer(oid)
            model.optimizer.apply_gradients = pushing.apply_gradients
            model.optimizer.apply = pushing.apply
        self.runtime.models[mid] = copy
        for variable in copy.variables:
            self.runtime.variable_owner[id(variable)] = copy

    def make_dataset(self, dsid, fn_bytes) -> None:
        runtime = self.runtime
        dataset_fn = pickle.loads(fn_bytes)
        if _takes_an_argument(dataset_fn):
            from keras_dist._input import InputContext

            dataset = dataset_fn(InputContext(runtime.num_workers, runtime.index, 1))
        else:
            dataset = dataset_fn()
        runtime.datasets[dsid] = dataset

    def run(self, closure_id, payload: bytes, needs):
        """("missing", [tokens]) | ("ok", result) | ("error", exception, text)."""
        runtime = self.runtime
        missing = [n for n in needs if (n[1] not in (runtime.models if n[0] == "model" else runtime.datasets))]
        if missing:
            return ("missing", missing)
        runtime.closure = closure_id
        runtime.push_count = 0
        _current.runtime = runtime
        try:
            copies = [runtime.models[n[1]] for n in needs if n[0] == "model"]
            for copy in copies:
                runtime.pull(copy)
            fn, args, kwargs = _Unpickler(io.BytesIO(payload), runtime).load()
            result = fn(*args, **kwargs)
            runtime.push_writes(copies)
            self.executed += 1
            return ("ok", _to_host(result))
        except Exception as error:  # the coordinator raises it from fetch/join
            text = traceback.format_exc()
            try:
                pickle.dumps(error)
            except Exception:
                error = RuntimeError(f"{type(error).__name__}: {error}")
            return ("error", error, text)
        finally:
            _current.runtime = None

    def report(self) -> dict:
        return {"executed": self.executed}


def _takes_an_argument(fn) -> bool:
    try:
        parameters = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.VAR_POSITIONAL) for p in parameters)


# Ray actor classes over the plain ones (which stay importable by name, so
# Ray ships them by reference).
ParameterServer = ray.remote(num_cpus=0, max_restarts=0)(ParameterServerActor)
Worker = ray.remote(num_cpus=0, max_restarts=0)(WorkerActor)
