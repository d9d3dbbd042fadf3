"""An unused optimizer made outside the scope, given to `compile`: adopted.

tf.keras 2 optimizers made their variables lazily, so
``model.compile(optimizer=keras.optimizers.SGD(0.1))`` outside the scope of
a model made inside it placed them under the strategy. Keras 3 optimizers
make `iterations` and the learning-rate variable in their constructor,
outside the scope. An optimizer still in its initial state (never built,
`iterations` 0, only the variables its constructor makes) is adopted: an
optimizer of its class and config (its learning rate as it is now, a
schedule kept as the same object) is made under the model's strategy,
and the user's object takes that one's state: its variables, placed as if
made in scope (the values carried over), and what Keras remembers of the
scope it was made in (TensorFlow: the tf.distribute strategy). It stays the
same object (`model.optimizer is optimizer`) and keeps every attribute of
its own. A used optimizer is refused: re-made, it would lose its state.
"""

from __future__ import annotations

from typing import Any, Callable, Optional

import keras
import numpy as np

_FIX = (
    "Create the optimizer inside `with strategy.scope():` (to keep a used "
    "one's state, restore it there, e.g. from a checkpoint), or give compile "
    "an unused one made anywhere (e.g. keras.optimizers.SGD(0.1)) or a name "
    "such as optimizer='sgd'."
)


def prepare_adoption(strategy, optimizer) -> Optional[Callable[[], None]]:
    """None when every variable of `optimizer` is `strategy`'s; else a
    function that adopts it (call it once every check of `compile` passed).
    Raises ValueError, having changed nothing, when it cannot be adopted."""
    outside = [v for v in optimizer.variables if not strategy.extended.variable_created_in_scope(v)]
    if not outside:
        return None
    fresh, reason = None, _used(optimizer)
    if reason is None:
        fresh, reason = _remade_under(strategy, optimizer)
    if reason is not None:
        raise ValueError(
            f"Optimizer variable {outside[0].path!r} was created outside the "
            f"scope of {strategy!r}, and the optimizer cannot be adopted by it: "
            f"{reason}. {_FIX}"
        )
    return lambda: _take_state(optimizer, fresh)


def _used(optimizer) -> Optional[str]:
    """Why `optimizer` is past its initial state, or None."""
    if optimizer.built:
        return (
            "it has been built (its slot variables exist), so re-creating its "
            "variables under the strategy would lose their state"
        )
    iterations = int(np.asarray(keras.ops.convert_to_numpy(optimizer.iterations)))
    if iterations:
        return (
            f"its iterations counter is {iterations}, not 0 (it has been applied, or "
            "restored), so re-creating its variables under the strategy would lose its state"
        )
    return None


def _remade_under(strategy, optimizer) -> tuple[Any, Optional[str]]:
    """(An optimizer of `optimizer`'s class and config made in `strategy`'s
    scope, None), or (None, why it does not reproduce `optimizer`)."""
    config = optimizer.get_config()  # the learning rate as it is now
    learning_rate = optimizer._learning_rate
    if not isinstance(learning_rate, keras.Variable):  # a schedule or callable: the same object
        config["learning_rate"] = learning_rate
    return _remade_from_config(strategy, optimizer, config)


def _remade_from_config(strategy, original, config) -> tuple[Any, Optional[str]]:
    """(An object of `original`'s class made from `config` in `strategy`'s
    scope, None), or (None, why it does not reproduce `original`)."""
    try:
        with strategy.scope():
            fresh = type(original).from_config(config)
    except Exception as error:  # noqa: BLE001 - why it cannot be adopted
        return None, (
            f"{type(original).__name__}.from_config({type(original).__name__.lower()}.get_config()) fails "
            f"({type(error).__name__}: {error})"
        )
    optimizer = original
    ours, theirs = optimizer.variables, fresh.variables
    if [_signature(v) for v in ours] != [_signature(v) for v in theirs]:
        return None, (
            f"it holds variables its constructor does not make "
            f"({', '.join(sorted({v.path for v in ours} - {v.path for v in theirs})) or 'a different set'}), "
            "so re-creating them under the strategy would lose their state"
        )
    mine, remade = vars(optimizer), vars(fresh)
    for name in sorted(set(mine) & set(remade)):
        if _plain(mine[name]) and _plain(remade[name]) and mine[name] != remade[name]:
            return None, (
                f"its get_config() does not give back its {name!r} ({mine[name]!r}; "
                f"re-made: {remade[name]!r}), so a copy would train differently; "
                "give its class a complete get_config()"
            )
    return fresh, None


def prepare_metric_adoption(strategy, metric) -> Optional[Callable[[], None]]:
    """As `prepare_adoption`, for a metric given to `compile` that was made
    outside the scope (plain Keras 3 with tf.distribute takes it): a metric
    of its class and config is made under the strategy and the user's
    object takes its state, its variables' values carried over (a metric's
    state is its totals, which a copy keeps). None when every variable is
    the strategy's already; ValueError, nothing changed, when it cannot be
    re-made from its config (the message names why and the fix)."""
    outside = [v for v in metric.variables if not strategy.extended.variable_created_in_scope(v)]
    if not outside:
        return None
    fresh, reason = _remade_from_config(strategy, metric, metric.get_config())
    if reason is not None:
        raise ValueError(
            f"Metric variable {outside[0].path!r} was created outside the scope of {strategy!r}, and the metric "
            f"cannot be adopted by it: {reason}. All metrics must be created in the same distribution strategy "
            "scope as the model: create it inside `with strategy.scope():`, or give compile its name "
            "(e.g. metrics=['accuracy'])."
        )
    return lambda: _take_state(metric, fresh)


def _signature(variable) -> tuple:
    return variable.path, tuple(variable.shape), variable.dtype


def _plain(value) -> bool:
    """Plain data (numbers, strings, None and containers of them): what a
    config describes, unlike variables, strategies and trackers."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    if isinstance(value, (list, tuple, set, frozenset)):
        return all(_plain(item) for item in value)
    if isinstance(value, dict):
        return all(_plain(key) and _plain(item) for key, item in value.items())
    return False


def _take_state(optimizer, fresh) -> None:
    """`optimizer` takes `fresh`'s state, keeping the attributes only it has
    (e.g. `exclude_from_weight_decay`'s) and its variables' values."""
    for theirs, ours in zip(fresh.variables, optimizer.variables):
        value = keras.ops.convert_to_numpy(ours)
        if not np.array_equal(value, keras.ops.convert_to_numpy(theirs)):
            theirs.assign(value)
    state = dict(vars(fresh))
    for name, value in vars(optimizer).items():
        state.setdefault(name, value)
    optimizer.__dict__.clear()
    optimizer.__dict__.update(state)
