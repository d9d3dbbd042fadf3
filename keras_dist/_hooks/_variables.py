"""Variables agree across workers: in a multi-process job, a host value that
Keras places on the strategy's mesh (a new variable's initial value, an
`assign`, `set_weights`) becomes the chief's value first, so every worker
starts from the chief's weights without anyone's random state being
reseeded. (JAX requires a globally placed value to be equal on every
process; tf's MultiWorkerMirroredStrategy broadcasts initial values itself.)
"""

from __future__ import annotations

from keras_dist import _context
from keras_dist.backends import get_adapter


def wrap_distribute_tensor(original):
    def distribute_tensor(tensor, layout):
        adapter = get_adapter()
        if _context.current_strategy() is None:  # the adapter leaves alone what no strategy placed
            return adapter.place_variable_value(original(tensor, layout), layout)
        if adapter.is_multi_process():
            (tensor,) = adapter.values_from_chief([tensor])
        return adapter.place_variable_value(original(tensor, layout), layout)

    return distribute_tensor


class HookedProperty(property):
    """A property a hook puts in place of Keras' (a subclass, so that the
    hook machinery can note the original on it)."""


def wrap_trainable_variables(original):
    """`Layer.trainable_weights` / `trainable_variables`: a variable the
    engine stores split over the ps tasks (TensorFlow: tf's ShardedVariable
    under a ParameterServerStrategy's `variable_partitioner`) is listed as
    its parts, one Keras variable per shard: gradient tapes and optimizers
    work on those (tf.keras 2 listed the shards likewise). Every other
    variable, and every model without one, as Keras lists them."""
    getter = original.fget

    def trainable(self):
        variable_parts = get_adapter().variable_parts  # an optional capability
        if variable_parts is None:
            return getter(self)
        listed = []
        for variable in getter(self):
            parts = variable_parts(variable)
            listed.extend(parts if parts else (variable,))
        return listed

    return HookedProperty(trainable, doc=original.__doc__)


def wrap_initialize(original):
    """A backend's `Variable._initialize(value)` (torch): in a multi-process
    job, under a strategy, a new variable takes the chief's initial value, so
    every worker starts from the chief's weights without reseeding."""

    def _initialize(self, value):
        adapter = get_adapter()
        if _context.current_strategy() is not None and adapter.is_multi_process():
            (value,) = adapter.values_from_chief([value])
        return original(self, value)

    return _initialize
