"""Hook mechanics: the `Hook` record, resolving and patching Keras targets,
and the one attribute keras_dist adds to a Keras model (its strategy)."""

from __future__ import annotations

import dataclasses
import functools
import importlib
from typing import Callable

import keras

#: "module:Owner.attribute" -> the original, for every hook installed.
ORIGINALS: dict = {}


@dataclasses.dataclass(frozen=True)
class Hook:
    """One Keras function or method keras_dist wraps.

    `target` is "module:Owner.attribute"; `wrap(original)` returns the
    replacement; `backends` lists the Keras backends it is installed on;
    `purpose` is the line the hooks module's docstring shows.
    """

    target: str
    wrap: Callable
    backends: tuple = ("jax", "tensorflow", "torch")
    purpose: str = ""


def resolve(path: str):
    """`(owner, attribute name)` of a "module:Owner.attribute" target."""
    module_name, _, attribute = path.rpartition(":")
    module = importlib.import_module(module_name)
    owner = module
    for part in attribute.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner, attribute.split(".")[-1]


def patch(hook: Hook) -> None:
    """Replaces the hook's target by `hook.wrap(original)`; fails loudly,
    naming the target, when this Keras version has no such name."""
    path = hook.target
    try:
        owner, name = resolve(path)
        original = getattr(owner, name)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"keras_dist cannot find the Keras internal {path!r} in Keras "
            f"{keras.version()}; this Keras version is not supported by this "
            "keras_dist release."
        ) from error
    wrapper = hook.wrap(original)
    functools.update_wrapper(wrapper, original)
    wrapper.__keras_dist_original__ = original
    setattr(owner, name, wrapper)
    ORIGINALS[path] = original
