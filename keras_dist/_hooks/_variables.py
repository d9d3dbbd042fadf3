"""Variables agree across workers: in a multi-process job, a host value that
Keras places on the strategy's mesh (a new variable's initial value, an
`assign`, `set_weights`) becomes the chief's value first, so every worker
starts from the chief's weights without anyone's random state being
reseeded. (JAX requires a globally placed value to be equal on every
process; tf's MultiWorkerMirroredStrategy broadcasts initial values itself.)
"""

from __future__ import annotations

import functools
import threading

from keras_dist import _context
from keras_dist.backends import get_adapter


def wrap_scalar_conversion(convert):
    """The wrapper maker for `Variable.__int__` / `__float__` (`convert` is
    `int` or `float`) on TensorFlow: a scalar variable a strategy holds as
    tf's distributed variable (mirrored, aggregating: tf's classes have no
    `__int__` or `__float__`, so `int(model.optimizer.iterations)` raised a
    TypeError, and Keras' `OrbaxCheckpoint` with it) converts from its value
    as one device reads it; every other variable as Keras converts it."""

    def wrap(original):
        def conversion(self):
            if self.ndim > 0 or hasattr(type(self.value), f"__{convert.__name__}__"):
                return original(self)
            return convert(self.numpy())

        return conversion

    return wrap


def wrap_distribute_tensor(original):
    def distribute_tensor(tensor, layout):
        adapter = get_adapter()
        if _context.current_strategy() is None:  # the adapter leaves alone what no strategy placed
            return adapter.place_variable_value(original(tensor, layout), layout)
        if adapter.is_multi_process():
            _check_same_variable_on_every_worker(adapter, "a value placed on the mesh", tensor)
            (tensor,) = adapter.values_from_chief([tensor])
        return adapter.place_variable_value(original(tensor, layout), layout)

    return distribute_tensor


class HookedProperty(property):
    """A property a hook puts in place of Keras' (a subclass, so that the
    hook machinery can note the original on it)."""


#: Inside `get_weights` / `set_weights` (this thread): layers list whole variables.
_whole_variables = threading.local()


def wrap_variable_list(original):
    """`Layer.weights` / `trainable_variables`: a variable the engine stores
    split over the ps tasks (TensorFlow: tf's ShardedVariable under a
    ParameterServerStrategy's `variable_partitioner`) is listed as its
    parts, one Keras variable per shard: gradient tapes and optimizers work
    on those, and Keras derives `trainable_weights` and
    `non_trainable_weights` from `weights`, so every list shows the shards,
    as tf.keras 2 listed them. Inside `get_weights` / `set_weights` (see
    `wrap_whole_variables`), and for every other variable and model, as
    Keras lists them."""
    getter = original.fget

    def listed(self):
        variable_parts = get_adapter().variable_parts  # an optional capability
        if variable_parts is None or getattr(_whole_variables, "active", False):
            return getter(self)
        variables = []
        for variable in getter(self):
            parts = variable_parts(variable)
            if not parts:
                variables.append(variable)
                continue
            for part in parts:  # Keras filters `weights` by `trainable`: the whole variable's, set later too
                part.trainable = variable.trainable
            variables.extend(parts)
        return variables

    return HookedProperty(listed, doc=original.__doc__)


def wrap_whole_variables(original):
    """`Layer.get_weights` / `set_weights`: whole variables, as `save_weights`
    and checkpoints store them, so a model split over the ps tasks gives
    and takes the weights of the same model unsplit (tf.keras 2 gave the
    shards)."""

    @functools.wraps(original)
    def whole(self, *args, **kwargs):
        outer = getattr(_whole_variables, "active", False)
        _whole_variables.active = True
        try:
            return original(self, *args, **kwargs)
        finally:
            _whole_variables.active = outer

    return whole


def _check_same_variable_on_every_worker(adapter, name: str, value) -> None:
    """Every worker creates its variables in the same order, of the same
    shape and dtype (the same model): else the chief's value would be
    written into another variable. One clear error on every worker, naming
    each one's variable, before any value is taken (one all-gather)."""
    import zlib

    import numpy as np

    shape = tuple(int(d) for d in getattr(value, "shape", ()))
    dtype = str(getattr(value, "dtype", type(value).__name__)).replace("torch.", "")
    text = f"{name} {shape} {dtype}"
    described = np.frombuffer(text.encode()[:_DESCRIBED_BYTES].ljust(_DESCRIBED_BYTES), dtype=np.uint8)
    # compared: the shape and the dtype (a path may differ: layer names count per process)
    key = np.array([len(shape), zlib.crc32(repr((shape, dtype)).encode()) % 2**31], np.int32)
    texts, keys = adapter.values_from_every_worker([described.astype(np.int32), key])
    if all(np.array_equal(row, keys[0]) for row in keys):
        return
    made = [bytes(np.asarray(row).astype(np.uint8)).decode(errors="replace").strip() for row in texts]
    raise ValueError(
        "The workers built different models: at the same variable "
        + ", ".join(f"worker {w} has {d}" for w, d in enumerate(made))
        + ". Every worker of a job must build the same model (the same layers in the same order, of the same "
        "shapes): each starts from the chief's weights and trains with it step by step."
    )


#: The text of a variable (path, shape, dtype) that
#: `_check_same_variable_on_every_worker` shows, cut to this many bytes.
_DESCRIBED_BYTES = 96


def wrap_initialize(original):
    """A backend's `Variable._initialize(value)` (torch): in a multi-process
    job, under a strategy, a new variable takes the chief's initial value, so
    every worker starts from the chief's weights without reseeding."""

    def _initialize(self, value):
        adapter = get_adapter()
        if _context.current_strategy() is not None and adapter.is_multi_process():
            _check_same_variable_on_every_worker(adapter, getattr(self, "path", None) or self.name, value)
            (value,) = adapter.values_from_chief([value])
        return original(self, value)

    return _initialize
