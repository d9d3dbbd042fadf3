"""Hook mechanics: the `Hook` record, resolving and patching Keras targets,
and the one attribute keras_dist adds to a Keras model (its strategy)."""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Callable, Optional

import keras

from keras_dist._keras_names import current, locate, resolve  # noqa: F401 (resolve: re-exported)
from keras_dist._hooks._keras_signatures import SIGNATURES

#: "module:Owner.attribute" -> the original, for every hook installed.
ORIGINALS: dict = {}


@dataclasses.dataclass(frozen=True)
class Hook:
    """One Keras function or method keras_dist wraps.

    `target` is "module:Owner.attribute"; `wrap(original)` returns the
    replacement; `backends` lists the Keras backends it is installed on;
    `purpose` is the line the hooks module's docstring shows; `below`, a
    Keras version from which the hook is not needed (Keras fixed it).
    """

    target: str
    wrap: Callable
    backends: tuple = ("jax", "tensorflow", "torch")
    purpose: str = ""
    #: installed on Keras releases below this one only (Keras fixed it there)
    below: Optional[tuple] = None


def signature(original) -> str:
    """`inspect.signature` of a hooked function (a property's getter) as text."""
    function = original.fget if isinstance(original, property) else original
    try:
        return str(inspect.signature(function))
    except (TypeError, ValueError):
        return "(unknown)"


def check_signature(path: str, original) -> None:
    """The hooked function takes the arguments its wrapper was written for
    (`_keras_signatures.SIGNATURES`), or one ImportError naming the hook."""
    accepted = SIGNATURES.get(path, {})
    found = signature(original)
    if found not in accepted:
        raise ImportError(
            f"keras_dist's hook on the Keras internal {current(path)!r} expects the signature "
            f"{' or '.join(accepted) or '(none recorded)'}; Keras {keras.version()} has {found}. This "
            "Keras version is not supported by this keras_dist release (a hook whose arguments "
            "changed would fail mid-fit)."
        )


def patch(hook: Hook) -> None:
    """Replaces the hook's target by `hook.wrap(original)`; fails loudly,
    naming the target, when this Keras version has no such name."""
    path = hook.target
    owner, name, original = locate(path)
    check_signature(path, original)
    wrapper = hook.wrap(original)
    functools.update_wrapper(wrapper, original)
    wrapper.__keras_dist_original__ = original
    setattr(owner, name, wrapper)
    ORIGINALS[path] = original
