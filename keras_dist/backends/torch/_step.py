"""PyTorch: the steps behind `fit`, `evaluate` and `predict` in a job of
several processes (one replica each).

Every process receives the whole global batch and runs Keras' own step on
its contiguous rows (`keras_dist._split`), checking that every process
holds the same global batch inside the step's gradient sum, or its metric
sum where it has none (`_batch_check`): the loss hooks scale its loss by
its share of the global batch, BatchNormalization takes the global batch's
moments, and the optimizer's gradients are summed over the processes
(bucketed all-reduces launched as backward produces them, `_reducer`, and
taken by `sum_gradients_for_apply`) before Keras clips and applies them,
so every process applies the update one device would. Metric
variables are then combined over the processes by their aggregation, so
each holds the global batch's, and the logs are computed from them.
`predict` gathers every process's rows, in order.

With one replica (OneDevice, Mirrored or CentralStorage of one device)
Keras' own step is the one-device math: `make_trainer_function` is None.
"""

from __future__ import annotations

import contextlib
import types

import keras
import torch

from keras_dist import _heartbeat as heartbeat
from keras_dist import _metric_state, _moments, _shard
from keras_dist._engine_kind import EngineKind
from keras_dist.backends.torch import _batch_check, _cluster, _collectives, _reducer, _replica


def _local_rows(engine, data):
    start, stop, rows, local = _replica.replica_rows(engine, data)
    return _shard.Shard(stop - start, rows, start, replicas=engine.num_replicas), data if local is None else local


def check_same_global_batch(batch, kind: str) -> None:
    """Every process must hold the same global batch (each takes its rows of
    it): a clear error where they differ, as when each worker shuffles its
    input its own way, never a mixed batch trained in silence. One
    collective of its own; `fit` and `evaluate` steps send the check with
    the gradients' or the metrics' sum instead (`_batch_check`)."""
    _batch_check.BatchCheck(batch, kind, _collectives.world_size()).verify_alone(
        _collectives.all_reduce_sum, torch.device("cpu")
    )


def _mean_over_replicas(value):
    (mean,) = _collectives.all_reduce([torch.as_tensor(value)], "MEAN")
    return mean


@contextlib.contextmanager
def _unscaled_loss_tracker(model):
    """Keras' torch steps give the loss tracker the loss as scaled for the
    gradient (this replica's share of the global batch's); it takes the
    replica's own mean back (TensorFlow's trainer unscales it likewise), so
    the tracker's combined total is the global batch's."""
    tracker = getattr(model, "_loss_tracker", None)
    if tracker is None:
        yield
        return
    update = tracker.update_state

    def update_state(values, sample_weight=None):
        factor = _shard.unscale_factor(keras.backend.standardize_dtype(values.dtype))
        return update(values if factor is None else values * factor, sample_weight=sample_weight)

    object.__setattr__(tracker, "update_state", update_state)
    try:
        yield
    finally:
        object.__delattr__(tracker, "update_state")


def _draws_random_numbers(model) -> bool:
    return any(getattr(layer, "_seed_generators", None) for layer in model._flatten_layers())


class TorchStep:
    """Keras' ``{train,test}_function(data)`` for one replica of several:
    `data` is Keras' list of one global batch."""

    def __init__(self, model, engine, kind: str, bytes_per_pack: int = 0):
        self.model, self.engine, self.kind = model, engine, kind
        self.bytes_per_pack = bytes_per_pack

    def __call__(self, data):
        heartbeat.beat()
        (batch,) = data
        model = self.model
        # the same-batch check travels with the gradients' sum (before the
        # optimizer applies it) or, in a step without one, the metrics' sum
        check = _batch_check.BatchCheck(batch, self.kind, _collectives.world_size())
        if self.kind == "train" and _draws_random_numbers(model):
            _cluster.random_state_from_chief()
        shard, local = _local_rows(self.engine, batch)
        variables = list(model.metrics_variables)
        starts = [torch.clone(v.value.detach()) for v in variables]
        reducer = _reducer.reducer_for(model, self.bytes_per_pack) if self.kind == "train" else None
        with _shard.shard_scope(shard), _unscaled_loss_tracker(model):
            if self.kind == "train":
                with _reducer.training_step(reducer, check):
                    logs = model.train_step(local)
            else:
                with torch.no_grad():
                    logs = model.test_step(local)
        device = self.engine.torch_device  # where the scope put the metric variables
        with torch.no_grad():
            combined = _metric_state.combine_by_aggregation(
                variables,
                [v.value for v in variables],
                lambda parts: check.fold(parts, _collectives.all_reduce_sum, device),
                torch.tensor(self.engine.replica_id == 0),
                self.engine.num_replicas,
                starts=starts,
            )
            check.verify_alone(_collectives.all_reduce_sum, device)
            for variable, value in zip(variables, combined):
                variable.assign(value)
            return _metric_state.global_logs(
                logs, variables, lambda: combined, model.get_metrics_result, _mean_over_replicas
            )


class TorchPredict:
    """Keras' ``predict_function(data)``: every process predicts its rows,
    and each gets every row back, in order."""

    def __init__(self, model, engine):
        self.model, self.engine = model, engine

    def __call__(self, data):
        heartbeat.beat()
        (batch,) = data
        check_same_global_batch(batch, "predict")
        shard, local = _local_rows(self.engine, batch)
        with torch.no_grad(), _shard.shard_scope(shard):
            outputs = self.model.predict_step(local)
        return keras.tree.map_structure(lambda x: _collectives.all_gather_rows(x, 0), outputs)


def make_trainer_function(model, strategy, kind: str):
    """Keras' ``{kind}_function`` for `model` under `strategy`; None with one
    replica (Keras' own step is one device's)."""
    if strategy.extended.engine_kind is EngineKind.PARAMETER_SERVER:
        raise NotImplementedError("ParameterServerStrategy is not supported on the torch backend.")
    engine = strategy.extended.engine
    if engine.num_replicas == 1:
        return None
    if model.steps_per_execution > 1:
        raise ValueError(
            "`steps_per_execution` must be 1 with the PyTorch backend under a strategy of several processes: "
            "keras_dist's torch step runs one batch a call (Keras before 3.16 refuses more on torch too). "
            f"Received: steps_per_execution={model.steps_per_execution}."
        )
    if model.jit_compile:
        raise ValueError(
            "compile(jit_compile=True) under a strategy of several processes on the torch backend: keras_dist runs "
            "Keras' torch step eagerly there (torch.compile of a step with collectives is not supported). Compile "
            "with jit_compile=False (Keras' default on torch)."
        )
    if kind == "predict":
        return TorchPredict(model, engine)
    _read_metrics_once(model)
    options = strategy.extended.communication_options
    return TorchStep(model, engine, kind, options.bytes_per_pack if options is not None else 0)


def _read_metrics_once(model) -> None:
    """Keras 3.16's torch trainer sums every metric variable over the
    processes in `get_metrics_result` wherever torch.distributed is up (one
    all_reduce per variable, every step: for its own DDP). Under keras_dist's
    step the variables already hold the global batch's (combined by their
    aggregation), so that sum would count them once per process: a
    `TruePositives` or `Sum` metric N times (a mean's ratio hides it), and 12
    collectives a step more for three metrics. The model reads them as
    Keras' generic trainer does: its own `get_metrics_result`, per instance
    (the method the torch trainer's overrides, found in `keras.Model`'s MRO;
    before 3.16 there is none and nothing changes). A model class that
    defines its own keeps it."""
    owners = [klass for klass in keras.Model.__mro__ if "get_metrics_result" in vars(klass)]
    if len(owners) < 2 or type(model).get_metrics_result is not keras.Model.get_metrics_result:
        return
    object.__setattr__(model, "get_metrics_result", types.MethodType(vars(owners[1])["get_metrics_result"], model))


def global_moments(inputs, axes, mask):
    """BatchNormalization moments over the global batch (see `keras_dist._moments`)."""
    return _moments.global_moments(inputs, axes, mask, lambda values: _collectives.all_reduce_sum(values, True))


class _SumGradients(torch.autograd.Function):
    @staticmethod
    def forward(ctx, *values):
        return tuple(v.view_as(v) for v in values)

    @staticmethod
    def backward(ctx, *grads):
        return tuple(_collectives.all_reduce_sum(list(grads)))


def sum_gradients_over_replicas(values):
    """Identity on `values`; their gradients are summed over the processes
    in the backward pass (one packed all-reduce)."""
    values = list(values)
    if _collectives.world_size() == 1 or not values:
        return values
    return list(_SumGradients.apply(*values))
