"""Strategy stack and replica context (backend-agnostic).

The strategy stack is process-wide (replica threads of a TensorFlow
MirroredStrategy must see it); the replica context is per thread.
"""

from __future__ import annotations

import contextlib
import threading
from typing import TYPE_CHECKING, Iterator, Optional

if TYPE_CHECKING:  # pragma: no cover
    from keras_dist._strategy import Strategy

_stack: list["Strategy"] = []
_set_strategy: list[tuple["Strategy", contextlib.ExitStack]] = []
_local = threading.local()


def current_strategy() -> Optional["Strategy"]:
    """The innermost strategy whose scope is entered, or None."""
    return _stack[-1] if _stack else None


def push(strategy: "Strategy") -> None:
    top = current_strategy()
    if top is not None and top is not strategy:
        raise ValueError(
            f"Cannot enter the scope of {strategy!r} inside the scope of "
            f"{top!r}: a model lives under exactly one strategy. Exit the "
            "first scope before entering another, or use the same strategy."
        )
    _stack.append(strategy)


def pop(strategy: "Strategy") -> None:
    if not _stack or _stack[-1] is not strategy:
        raise RuntimeError(
            "keras_dist strategy scopes were exited out of order."
        )
    _stack.pop()


def replica_context():
    """The replica context set by `Strategy.run` on this thread, or None."""
    return getattr(_local, "replica_context", None)


@contextlib.contextmanager
def in_replica(context) -> Iterator[None]:
    previous = getattr(_local, "replica_context", None)
    _local.replica_context = context
    try:
        yield
    finally:
        _local.replica_context = previous


@contextlib.contextmanager
def outside_strategies() -> Iterator[None]:
    """No strategy scope is entered while inside (process-wide).

    For keras_dist's own code that must build plain Keras objects while a
    scope is open (the one-replica reference of `ScalingReport`, built in
    a fresh thread during `fit`).
    """
    saved = list(_stack)
    _stack.clear()
    try:
        yield
    finally:
        _stack[:] = saved
