"""Keras internal names, written as Keras 3.10-3.15 spell them, and the one
version switch that turns them into Keras 3.16's.

Keras 3.16 renamed the trainer classes (`Trainer` -> `BaseTrainer`; each
backend's `JAXTrainer` / `TensorFlowTrainer` / `TorchTrainer` -> `Trainer`)
and moved each backend's ops modules under `ops/` (`keras.src.backend.
tensorflow.nn` -> `keras.src.backend.tensorflow.ops.nn`; JAX's `rnn` and
`gru` are reached through `keras.src.backend.jax.rnn`). Every hook target
and every internal keras_dist reads goes through `current(path)`:

    >>> current("keras.src.trainers.trainer:Trainer.compile")  # on Keras 3.16
    'keras.src.trainers.trainer:BaseTrainer.compile'
"""

from __future__ import annotations

import functools
import importlib
import re

import keras


@functools.cache
def keras_version() -> tuple:
    """(major, minor, patch) of the installed Keras; a dev build counts as its release."""
    return tuple(int(part) for part in re.findall(r"\d+", keras.version())[:3])


#: Keras 3.16's spelling of each 3.10-3.15 prefix (the longest match wins).
RENAMED_IN_3_16 = {
    "keras.src.trainers.trainer:Trainer.": "keras.src.trainers.trainer:BaseTrainer.",
    "keras.src.backend.jax.trainer:JAXTrainer": "keras.src.backend.jax.trainer:Trainer",
    "keras.src.backend.tensorflow.trainer:TensorFlowTrainer": "keras.src.backend.tensorflow.trainer:Trainer",
    "keras.src.backend.torch.trainer:TorchTrainer": "keras.src.backend.torch.trainer:Trainer",
    "keras.src.backend.tensorflow.numpy:": "keras.src.backend.tensorflow.ops.numpy:",
    "keras.src.backend.tensorflow.nn:": "keras.src.backend.tensorflow.ops.nn:",
    "keras.src.backend.torch.core:": "keras.src.backend.torch.ops.core:",
    "keras.src.backend:rnn": "keras.src.backend.jax.rnn:rnn",  # JAX-only hooks
    "keras.src.backend:gru": "keras.src.backend.jax.rnn:gru",
}


def current(path: str, version: tuple | None = None) -> str:
    """`path` ("module:Owner.attribute", as Keras 3.10-3.15 spell it) as the
    installed Keras (or `version`) spells it."""
    if (version or keras_version()) < (3, 16):
        return path
    for old in sorted(RENAMED_IN_3_16, key=len, reverse=True):
        if path.startswith(old):
            return RENAMED_IN_3_16[old] + path[len(old):]
    return path


def resolve(path: str):
    """`(owner, attribute name)` of a "module:Owner.attribute" target
    (spelled for the installed Keras)."""
    module_name, _, attribute = current(path).rpartition(":")
    owner = importlib.import_module(module_name)
    for part in attribute.split(".")[:-1]:
        owner = getattr(owner, part)
    return owner, attribute.split(".")[-1]


def internal(path: str):
    """The Keras internal object at `path`, e.g.
    ``internal("keras.src.backend.jax.trainer:JAXTrainer")``; an ImportError
    naming it and the Keras version where it is missing."""
    return locate(path)[2]


def locate(path: str):
    """`(owner, attribute name, object)` of `path`; an ImportError as `internal`'s."""
    try:
        owner, name = resolve(path)
        return owner, name, getattr(owner, name)
    except (ImportError, AttributeError) as error:
        raise ImportError(
            f"keras_dist cannot find the Keras internal {current(path)!r} in Keras "
            f"{keras.version()}; this Keras version is not supported by this "
            "keras_dist release."
        ) from error
