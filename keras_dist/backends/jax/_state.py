"""JAX: the model's variables in the order of Keras' step state, and giving
them back their values after a step that failed before it ran."""

from __future__ import annotations

import jax


def state_variables(model, kind: str) -> tuple:
    """The model's variable lists in the order of Keras' step state."""
    optimizer = getattr(model, "optimizer", None)
    lists = [model.trainable_variables, model.non_trainable_variables]
    if kind == "train":
        lists.append(optimizer.variables if optimizer else [])
    if kind in ("train", "test"):
        lists.append(model.metrics_variables)
    return tuple(lists)


def restore_after_failure(model, kind: str, state) -> None:
    """After a step failed before running (a tracing error: nothing was
    donated), give back the values Keras' JAX `fit` took out of the
    variables, so the model stays usable. Values already deleted are left."""
    for variables, values in zip(state_variables(model, kind), state):
        for variable, value in zip(variables, values):
            if variable._value is None and isinstance(value, jax.Array) and not value.is_deleted():
                variable._value = value
