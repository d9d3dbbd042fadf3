"""`fit`'s training step for a ParameterServerStrategy on JAX, as it runs on
a worker actor: the worker's side (the coordinator's is `_parameter_servers`,
which schedules it)."""

from __future__ import annotations

import numpy as np

#: The key under which fit's step returns its metric-variable changes.
METRIC_DELTAS = "_keras_dist_metric_deltas"


class TrainStep:
    """`fit`'s training step for a ParameterServerStrategy on JAX:
    ``step(per_worker_iterator) -> logs``, to be scheduled with
    `ClusterCoordinator.schedule`. On the worker, `model.steps_per_execution`
    times: it takes the next batch, computes the gradients with Keras'
    stateless API on the pulled values, and pushes them (and the new
    non-trainable values); it returns the last step's logs (the metrics of
    that batch, as NumPy) and every step's metric changes."""

    def __init__(self, model):
        self.model = model

    def __call__(self, iterator):
        from keras_dist.backends.jax import _ray_actors

        runtime = _ray_actors.current_worker()
        if runtime is None:
            raise RuntimeError(
                "This is fit's step for a ParameterServerStrategy: it runs on a worker. "
                "Schedule it: coordinator.schedule(step, args=(per_worker_iterator,))."
            )
        model = self.model
        copy = runtime.variable_owner[id(model.trainable_variables[0])] if model.trainable_variables else None
        if copy is None:
            raise ValueError("fit on a ParameterServerStrategy needs a model with trainable variables.")
        program = _worker_program(model)
        total = None
        for step in range(int(getattr(model, "steps_per_execution", 1) or 1)):
            if step:  # each step reads the variables as the ps hold them now, as tf's steps do
                runtime.pull(copy)
            data = next(iterator)
            grads, non_trainable, (logs, deltas) = program(
                [v.value for v in model.trainable_variables],
                [v.value for v in model.non_trainable_variables],
                data,
            )
            runtime.push_step(copy, grads, non_trainable)
            # the step pushed its writes itself: nothing else changed
            copy.pulled.update({copy.vid_of[id(v)]: v._value for v in copy.variables})
            deltas = [np.asarray(d) for d in deltas]
            total = deltas if total is None else [a + b for a, b in zip(total, deltas)]
        result = {k: np.asarray(v) for k, v in logs.items()}  # the last step's
        # These batches' change to every metric variable: the coordinator adds
        # them into its metrics (`Cluster._finish`), as tf's metric variables
        # on the ps get every worker's assign_add.
        result[METRIC_DELTAS] = total
        return result


def _worker_program(model):
    """The compiled gradient + metrics program of a worker's model copy."""
    program = model.__dict__.get("_keras_dist_ps_program")
    if program is not None:
        return program
    import jax
    import keras

    def metrics_state():
        return [v.value for v in model.metrics_variables]

    def step(trainable, non_trainable, data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        optimizer_variables = [v.value for v in model.optimizer.variables] if model.optimizer is not None else []
        grad_fn = jax.value_and_grad(model.compute_loss_and_updates, has_aux=True)
        (loss, aux), grads = grad_fn(
            trainable, non_trainable, initial_metrics, x, y, sample_weight, training=True, optimizer_variables=optimizer_variables
        )
        if len(aux) == 4:
            unscaled_loss, y_pred, non_trainable, metrics_variables = aux
        else:  # older Keras: (y_pred, non_trainable, metrics)
            y_pred, non_trainable, metrics_variables = aux
            unscaled_loss = loss
        logs, metrics_state_after = _metrics_logs(model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight)
        deltas = [after - before for after, before in zip(metrics_state_after, initial_metrics)]
        return grads, non_trainable, (logs, deltas)

    built = {"done": False}
    initial_metrics: list = []

    def run(trainable, non_trainable, data):
        nonlocal initial_metrics, compiled
        if not built["done"]:
            model._symbolic_build(data_batch=data)
            model.reset_metrics()
            initial_metrics = metrics_state()
            compiled = step if model.run_eagerly else jax.jit(step)
            built["done"] = True
        return compiled(trainable, non_trainable, data)

    compiled = None
    model.__dict__["_keras_dist_ps_program"] = run
    return run


def _metrics_logs(model, metrics_variables, unscaled_loss, x, y, y_pred, sample_weight):
    """Keras' metrics update of a train step (stateless), for this batch."""
    import keras
    from keras.src.backend.common.stateless_scope import StatelessScope

    with StatelessScope(state_mapping=list(zip(model.metrics_variables, metrics_variables))) as scope:
        model._loss_tracker.update_state(
            unscaled_loss, sample_weight=next(i for i in keras.tree.flatten(x) if i is not None).shape[0]
        )
        logs = model.compute_metrics(x, y, y_pred, sample_weight)
        state = [scope.get_current_value(v) for v in model.metrics_variables]
    return logs, [v if v is not None else m for v, m in zip(state, metrics_variables)]
