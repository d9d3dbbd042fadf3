"""ParameterServerStrategy on JAX: the coordinator, in the user's process,
over Ray actors (`_ray_actors`: `ParameterServer`, `Worker`).

- Variables are created in `strategy.scope()` here (the engine's Keras
  distribution records them: `owns_variable`). When a scheduled function
  first refers to a model (or `fit`'s step does), the model is registered:
  its variables get ids and go to the ps actors, round-robin by variable
  (or, with a `variable_partitioner`, in row blocks along axis 0, block `k`
  on the next ps); its optimizer's config and state go to every ps.
- A scheduled function is pickled here (cloudpickle) with references to
  the strategy's models, optimizers, variables, the strategy itself and
  per-worker iterators replaced by tokens, which the worker resolves to its
  own copies; the worker pulls the models' current values before the
  function and pushes gradients (`optimizer.apply_gradients`) and writes.
- Each `apply_gradients` is pushed to every ps (one key per push); each ps
  applies its shard and counts the step in its optimizer's `iterations`
  (so every ps counts every step once; ps 0's count is the optimizer's).
- `join()` waits for every function, raises the first error, then pulls
  every registered variable (and optimizer state) into the coordinator's
  Keras variables: reading `model.get_weights()` or `optimizer.iterations`
  after `join()` gives the ps values.
- The queue of scheduled functions and the dispatchers that run them on the
  worker actors are `_ps_scheduler.Scheduler`'s: a worker lost (its actor
  died) re-queues its function and the slot starts a new worker actor (up to
  `MAX_WORKER_RESTARTS` times). A ps lost, or not answering within
  `PS_TIMEOUT_S`, is fatal: `join()`/`fetch()` raise `ParameterServerError`,
  queued functions are cancelled.
"""

from __future__ import annotations

import itertools
import os
import sys
import threading
import time
import weakref

import numpy as np

from keras_dist import _heartbeat
from keras_dist.backends.jax import _ps_pickling
from keras_dist.backends.jax._ps_scheduler import Closure, Scheduler
from keras_dist.backends.jax._ps_step import TrainStep
from keras_dist.backends.jax._ray_runtime import (
    _LIVE_CLUSTERS,
    _RAY_DOWN,
    _actors,
    _quiet_ray_start,
    _ray,
    _ray_is_up,
    _register_exit_hook,
)

#: Seconds a worker or the coordinator waits for a parameter server
#: (KERAS_DIST_PS_TIMEOUT when the coordinator starts).
PS_TIMEOUT_S = 60.0
#: Seconds the coordinator waits for the ps actors to start.
STARTUP_TIMEOUT_S = 300.0
_LOCAL_HOSTS = ("localhost", "127.0.0.1", "::1", "[::1]")


# -- checks made when the engine is created (before any variable) -----------


def check_local_cluster(resolver) -> None:
    """TF_CONFIG's worker/ps tasks become Ray actors on this machine: their
    addresses must be this machine's (loopback), not silently ignored."""
    spec = resolver.cluster_spec()
    for job in ("chief", "worker", "ps"):
        if job not in spec.jobs:
            continue
        for index, address in enumerate(spec.job_tasks(job)):
            if address is None:
                continue
            host = address.rsplit(":", 1)[0] if address.count(":") == 1 or address.startswith("[") else address
            if host not in _LOCAL_HOSTS:
                raise ValueError(
                    "ParameterServerStrategy on JAX starts the cluster's 'worker' and 'ps' tasks "
                    "as Ray actors on this machine (a local Ray); it does not connect to the "
                    f"addresses in the cluster spec, and {job} {index} is {address!r}. Give "
                    "localhost addresses (e.g. 'localhost:2222'): only the number of tasks per job "
                    "is used. Remote Ray clusters are not supported yet."
                )


# -- variables created in the scope --------------------------------------------


class VariableRecord:
    """The variables created in a ParameterServerStrategy's scope."""

    def __init__(self):
        self._refs: dict = {}
        self._layouts: dict = {}

    def add(self, variable, layout=None) -> None:
        self._refs[id(variable)] = weakref.ref(variable)
        if layout is not None:
            self._layouts[id(layout)] = layout

    def __contains__(self, variable) -> bool:
        ref = self._refs.get(id(variable))
        if ref is not None and ref() is variable:
            return True
        # Keras gives an optimizer's slot the layout of its model variable
        # without asking the distribution: a slot of a variable made here.
        layout = getattr(variable, "_layout", None)
        return layout is not None and self._layouts.get(id(layout)) is layout


# -- the coordinator's engine -------------------------------------------------


class Cluster:
    """The Ray side of one ParameterServerStrategy: actors, registrations,
    the queue of scheduled functions and one dispatcher thread per worker."""

    def __init__(self, strategy):
        self.strategy_ref = weakref.ref(strategy)
        extended = strategy.extended
        self.num_ps = extended.num_ps
        self.num_workers = extended.num_remote_workers
        self.partitioner = extended.variable_partitioner
        self.started = False
        self.started_ray = False
        self.lock = threading.RLock()
        #: The queue of scheduled functions and the worker slots that run them.
        self.scheduler = Scheduler(self.lock, self._new_worker, self._load_missing)
        # registrations
        self.variables: list = []  # vid -> coordinator keras.Variable
        self.vid_of: dict = {}  # id(variable) -> vid
        self.placement: dict = {}  # vid -> [(ps, key, rows|None)]
        self.known_values: dict = {}  # vid -> the array the ps were last given / we last pulled
        self.models: dict = {}  # id(model) -> (mid, model, layout, oid, bytes)
        self.optimizers: dict = {}  # id(optimizer) -> (oid, optimizer)
        self.datasets: dict = {}  # dsid -> fn bytes
        self._next_ps = 0
        self._ids = itertools.count()

    # -- Ray and the actors
    def start(self) -> None:
        if self.started:
            return
        ray = _ray()
        actors = _actors()
        self.ps_timeout = float(os.environ.get("KERAS_DIST_PS_TIMEOUT", PS_TIMEOUT_S))
        started = time.monotonic()
        _heartbeat.say(
            f"starting the parameter-server cluster on Ray: {self.num_workers} worker and {self.num_ps} ps "
            "actors (each a process that imports JAX and Keras)"
        )
        if not ray.is_initialized():
            with _quiet_ray_start():
                ray.init(
                    address="local",
                    include_dashboard=False,
                    log_to_driver=False,
                    logging_level="ERROR",
                    configure_logging=False,
                    # The strategy's own Ray exports no metrics (a metrics
                    # thread was running in the driver that crashed at exit;
                    # the cause was a second Ray started at exit, see
                    # _ray_is_up).
                    _system_config={"enable_metrics_collection": False},
                )
            self.started_ray = True
        runtime_env = {"env_vars": {"KERAS_BACKEND": "jax", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}}
        self.runtime_env = runtime_env
        self.ps = [actors.ParameterServer.options(runtime_env=runtime_env).remote(i) for i in range(self.num_ps)]
        self.scheduler.add_slots(self.num_workers)
        # starting a process that imports JAX and Keras: more than a step's wait
        self._get([p.ping.remote() for p in self.ps], "starting the parameter servers", max(self.ps_timeout, STARTUP_TIMEOUT_S))
        self.scheduler.start_dispatchers()
        self.started = True
        _heartbeat.say(f"the parameter-server cluster is up after {time.monotonic() - started:.1f} s")
        _register_exit_hook()
        _LIVE_CLUSTERS.add(self)
        strategy = self.strategy_ref()
        if strategy is not None:  # when collected; at exit, _stop_clusters_at_exit
            weakref.finalize(strategy, self.shutdown).atexit = False

    def _new_worker(self, index):
        actors = _actors()
        return actors.Worker.options(runtime_env=self.runtime_env).remote(index, self.num_workers, self.ps, self.ps_timeout)

    def _check_ray_up(self) -> None:
        """Before a call that reaches the actors: with Ray stopped under a
        started cluster, one clear error (Ray would start a new, empty Ray)."""
        if self.started and not _ray_is_up():
            raise RuntimeError(_RAY_DOWN)

    def _get(self, refs, what: str, timeout=None):
        ray = _ray()
        actors = _actors()
        timeout = timeout or self.ps_timeout
        try:
            return ray.get(refs, timeout=timeout)
        except ray.exceptions.GetTimeoutError as error:
            raise actors.ParameterServerError(f"{what}: a parameter server did not answer within {timeout} s") from error
        except ray.exceptions.RayActorError as error:
            raise actors.ParameterServerError(
                f"{what}: a parameter server was lost ({type(error).__name__}); the variables it held "
                "are gone and training cannot continue. Restore from a checkpoint."
            ) from error

    def shutdown(self) -> None:
        self.scheduler.stop()
        if not self.started:
            return
        ray = _ray()
        # With Ray down the actors are gone with it, and ray.kill would
        # start a new Ray (see _ray_is_up).
        if _ray_is_up():
            for handle in [s.handle for s in self.scheduler.slots] + list(self.ps):
                try:
                    ray.kill(handle)
                except Exception:
                    pass
        self.started = False
        _LIVE_CLUSTERS.discard(self)

    # -- registration
    def owns(self, variable) -> bool:
        strategy = self.strategy_ref()
        return variable in strategy.extended.engine.variables

    def _place(self, variable) -> list:
        shape = tuple(variable.shape)
        blocks = 1
        if self.partitioner is not None and len(shape) >= 1:
            parts = self.partitioner(shape, variable.dtype)
            parts = [int(p) for p in parts]
            if len(parts) != len(shape) or any(p != 1 for p in parts[1:]) or parts[0] < 1:
                raise ValueError(
                    f"variable_partitioner returned {parts} for {variable.path!r} of shape {shape}: "
                    "partitions are taken along axis 0 only (a list of one count per axis, the "
                    "others 1), as in tf."
                )
            blocks = min(parts[0], shape[0])
        if blocks == 1:
            rows = [None]
        else:
            bounds = np.cumsum([0] + [len(a) for a in np.array_split(np.arange(shape[0]), blocks)])
            rows = [(int(a), int(b)) for a, b in zip(bounds[:-1], bounds[1:])]
        vid = len(self.variables)
        placement = []
        for shard, r in enumerate(rows):
            placement.append((self._next_ps, (vid, shard), r))
            self._next_ps = (self._next_ps + 1) % self.num_ps
        return placement

    def register_model(self, model) -> int:
        with self.lock:
            known = self.models.get(id(model))
            if known is not None and known[1] is model:
                return self._reship_if_compiled(model, known)
            self.start()
            variables = list(model.trainable_variables) + list(model.non_trainable_variables)
            if not variables:
                raise ValueError(
                    f"Model {model.name!r} has no variables yet: build it in `strategy.scope()` "
                    "(give it an Input shape, or call it on a batch) before scheduling functions "
                    "that use it."
                )
            outside = [v.path for v in variables if not self.owns(v)]
            if outside:
                raise ValueError(
                    f"Model variable {outside[0]!r} was created outside the scope of the "
                    "ParameterServerStrategy, so it has no place on the parameter servers. Create "
                    "the model (every layer) inside `with strategy.scope():`."
                )
            optimizer = getattr(model, "optimizer", None)
            if optimizer is not None:
                self._check_optimizer(optimizer)
            mid = next(self._ids)
            layout = []
            puts: dict = {}
            for variable in variables:
                placement = self._place(variable)
                vid = len(self.variables)
                self.variables.append(variable)
                self.vid_of[id(variable)] = vid
                self.placement[vid] = placement
                layout.append((vid, placement))
                self.known_values[vid] = variable._value
                value = np.asarray(variable.value)
                for ps, key, rows in placement:
                    puts.setdefault(ps, {})[key] = value if rows is None else value[rows[0] : rows[1]]
            self._get([self.ps[p].put.remote(v) for p, v in puts.items()], "placing variables")
            import ray.cloudpickle as cloudpickle

            model_bytes = cloudpickle.dumps(model)
            oid = self.register_optimizer(optimizer) if optimizer is not None else None
            self.models[id(model)] = (mid, model, layout, oid, model_bytes)
            return mid

    def _reship_if_compiled(self, model, known) -> int:
        """A registered model compiled since (or with another optimizer): the
        workers get a new copy, with the optimizer's pushes; same variables."""
        import ray.cloudpickle as cloudpickle

        mid, _, layout, oid, _ = known
        optimizer = getattr(model, "optimizer", None)
        registered = self.optimizers.get(id(optimizer)) if optimizer is not None else None
        if (optimizer is None and oid is None) or (registered is not None and registered[1] is optimizer and registered[0] == oid):
            return mid
        oid = self.register_optimizer(optimizer) if optimizer is not None else None
        mid = next(self._ids)
        self.models[id(model)] = (mid, model, layout, oid, cloudpickle.dumps(model))
        return mid

    def _check_optimizer(self, optimizer) -> None:
        import keras

        if not self.owns(optimizer.iterations):
            raise ValueError(
                f"Optimizer {optimizer.name!r} was created outside the scope of the "
                "ParameterServerStrategy. Create it inside `with strategy.scope():` (or give it by "
                "name to compile())."
            )
        if isinstance(optimizer, keras.optimizers.LossScaleOptimizer):
            raise ValueError("LossScaleOptimizer is not supported by ParameterServerStrategy on JAX.")
        if getattr(optimizer, "global_clipnorm", None) and (self.num_ps > 1 or self.partitioner is not None):
            raise ValueError(
                "global_clipnorm needs every gradient in one place; with variables on several "
                "parameter servers use clipnorm or clipvalue (per variable)."
            )
        if getattr(optimizer, "use_ema", False) or (getattr(optimizer, "gradient_accumulation_steps", None) or 1) > 1:
            raise ValueError("use_ema and gradient_accumulation_steps are not supported by ParameterServerStrategy on JAX.")

    def register_optimizer(self, optimizer) -> int:
        import keras

        with self.lock:
            known = self.optimizers.get(id(optimizer))
            if known is not None and known[1] is optimizer:
                return known[0]
            self.start()
            self._check_optimizer(optimizer)
            oid = next(self._ids)
            config = keras.optimizers.serialize(optimizer)
            start = {"iterations": int(np.asarray(optimizer.iterations.value)), "extras": {}, "slots": {}}
            per_ps = [dict(start, slots={}) for _ in range(self.num_ps)]
            if optimizer.built:
                for variable in optimizer.variables:
                    if variable is optimizer.iterations:
                        continue
                    slot = self._slot_of(variable)
                    if slot is None:
                        for state in per_ps:
                            state["extras"][variable.name] = np.asarray(variable.value)
                        continue
                    vid, suffix = slot
                    value = np.asarray(variable.value)
                    for ps, key, rows in self.placement[vid]:
                        per_ps[ps]["slots"][(key, suffix)] = value if rows is None else value[rows[0] : rows[1]]
            self._get([p.add_optimizer.remote(oid, config, per_ps[i]) for i, p in enumerate(self.ps)], "sending the optimizer")
            self.optimizers[id(optimizer)] = (oid, optimizer)
            return oid

    def _slot_of(self, optimizer_variable):
        """(vid, slot suffix) of an optimizer variable made from a model variable."""
        name = optimizer_variable.name
        best = None
        for vid, variable in enumerate(self.variables):
            prefix = variable.path.replace("/", "_") + "_"
            if name.startswith(prefix) and (best is None or len(prefix) > len(best[1])):
                best = (vid, prefix)
        if best is None:
            return None
        return best[0], name[len(best[1]) :]

    def send_coordinator_writes(self) -> None:
        """Model variables assigned in the coordinator since they were sent
        or pulled (set_weights, a restored checkpoint) go to the ps."""
        puts: dict = {}
        for vid, variable in enumerate(self.variables):
            if variable._value is self.known_values.get(vid):
                continue
            value = np.asarray(variable.value)
            for ps, key, rows in self.placement[vid]:
                puts.setdefault(ps, {})[key] = value if rows is None else value[rows[0] : rows[1]]
            self.known_values[vid] = variable._value
        if puts:
            self._get([self.ps[p].put.remote(v) for p, v in puts.items()], "sending the coordinator's writes")

    # -- scheduling (the queue itself: _ps_scheduler.Scheduler)
    def schedule(self, fn, args, kwargs) -> Closure:
        with self.lock:  # as tf: an earlier function's error is raised (once) here too
            self.scheduler.raise_error()
        self._check_ray_up()
        self.start()
        with self.lock:
            self.send_coordinator_writes()
        payload, needs = _ps_pickling.pickle_call(self, fn, args, kwargs)  # the tokens: _ps_pickling
        closure = Closure(payload, needs)
        closure.metrics_model = fn.model if isinstance(fn, TrainStep) else None
        self.scheduler.submit(closure)
        return closure

    def _load_missing(self, handle, missing) -> list:
        """What a worker actor lacks to run a function (models, per-worker
        datasets), sent to it: the calls' references."""
        loads = []
        for kind, ident in missing:
            if kind == "model":
                with self.lock:  # the coordinator's thread may be registering a model
                    models = list(self.models.values())
                mid, model, layout, oid, model_bytes = next(m for m in models if m[0] == ident)
                loads.append(handle.load_model.remote(mid, model_bytes, layout, oid))
            else:
                loads.append(handle.make_dataset.remote(ident, self.datasets[ident]))
        return loads

    def done(self) -> bool:
        return self.scheduler.done()

    def join(self) -> None:
        self._check_ray_up()
        self.scheduler.wait()
        self.pull_to_coordinator()
        self.add_metric_deltas()
        self.forget_finished_pushes()

    def forget_finished_pushes(self) -> None:
        """Each ps keeps the keys of the pushes it applied, to refuse a
        re-run's second push. A closure finished before the previous join
        can push no more (one join of slack for a lost worker's push still
        on its way), so its keys are dropped: memory stays bounded."""
        forget = self.scheduler.take_forgettable()
        if forget and self.started:
            self._get([p.forget.remote(forget) for p in self.ps], "forgetting finished pushes")

    def add_metric_deltas(self) -> None:
        """Adds the finished fit steps' metric changes into the
        coordinator's metrics (Keras' metric states are sums), so
        `model.get_metrics_result()` covers every worker's batches."""
        for model, deltas in self.scheduler.take_metric_deltas():
            for variable, delta in zip(model.metrics_variables, deltas):
                variable.assign(variable.value + delta)

    def fetch(self, closure: Closure):
        return self.scheduler.fetch(closure)

    # -- the coordinator's view after join
    def pull_to_coordinator(self) -> None:
        if not self.started or not self.variables:
            return
        keys_by_ps: dict = {}
        for vid, placement in self.placement.items():
            for ps, key, _ in placement:
                keys_by_ps.setdefault(ps, []).append(key)
        order = sorted(keys_by_ps)
        answers = self._get([self.ps[p].pull.remote(keys_by_ps[p]) for p in order], "reading the variables")
        values = {}
        for answer in answers:
            values.update(answer)
        for vid, variable in enumerate(self.variables):
            parts = [values[key] for _, key, _ in self.placement[vid]]
            variable.assign(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))
            self.known_values[vid] = variable._value
        for oid, optimizer in list(self.optimizers.values()):
            states = self._get([p.optimizer_state.remote(oid) for p in self.ps], "reading the optimizer")
            if states[0] is None:
                continue  # never applied
            slots = {}
            for state in states:
                slots.update(state["slots"])
            if not optimizer.built:
                vids = sorted({key[0] for state in states for key in state["keys"]})
                strategy = self.strategy_ref()
                with strategy.scope():
                    optimizer.build([self.variables[v] for v in vids])
            optimizer.iterations.assign(states[0]["iterations"])
            for variable in optimizer.variables:
                slot = self._slot_of(variable)
                if slot is None:
                    continue
                vid, suffix = slot
                parts = [slots.get((key, suffix)) for _, key, _ in self.placement[vid]]
                if any(p is None for p in parts):
                    continue
                variable.assign(parts[0] if len(parts) == 1 else np.concatenate(parts, axis=0))

    # -- what tests read
    def where(self, variable) -> list:
        """The ps indices holding `variable` (one per shard)."""
        vid = self.vid_of.get(id(variable))
        if vid is None or self.variables[vid] is not variable:
            return []
        return [ps for ps, _, _ in self.placement[vid]]

    def ps_reports(self) -> list:
        self._check_ray_up()
        return self._get([p.report.remote() for p in self.ps], "reading the ps reports")

    def worker_reports(self) -> list:
        self._check_ray_up()
        ray = _ray()
        out = []
        for slot in self.scheduler.slots:
            try:
                out.append(ray.get(slot.handle.report.remote(), timeout=self.ps_timeout))
            except ray.exceptions.RayActorError:
                out.append(None)
        return out


# -- the adapter's methods ------------------------------------------------------


def cluster_of(strategy) -> Cluster:
    return strategy.extended.engine.cluster


def create_coordinator(strategy) -> Cluster:
    cluster = cluster_of(strategy)
    cluster.start()
    return cluster


def schedule(coordinator: Cluster, fn, args, kwargs):
    return coordinator.schedule(fn, args, kwargs)


def fetch(coordinator: Cluster, remote_value):
    return coordinator.fetch(remote_value)


def join(coordinator: Cluster) -> None:
    coordinator.join()


def done(coordinator: Cluster) -> bool:
    return coordinator.done()


def create_per_worker_dataset(coordinator: Cluster, dataset_fn):
    return _ps_pickling.create_per_worker_dataset(coordinator, dataset_fn)


def shutdown(strategy) -> None:
    """Stops the strategy's actors (tests; also at exit)."""
    engine = strategy.extended.engine_if_made
    if engine is not None and getattr(engine, "cluster", None) is not None:
        engine.cluster.shutdown()


# -- fit's step ---------------------------------------------------------------------


def make_trainer_function(model, strategy, kind: str):
    """PS on JAX: `fit`'s train step is `TrainStep` (scheduled by the fit
    loop); evaluate/predict run in the coordinator (None: the usual steps),
    on the values pulled at the last `join()`."""
    if kind != "train":
        return None
    cluster = cluster_of(strategy)
    cluster.register_model(model)
    return TrainStep(model)
