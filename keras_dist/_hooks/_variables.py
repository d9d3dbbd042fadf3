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
        if _context.current_strategy() is not None and adapter.is_multi_process():
            (tensor,) = adapter.values_from_chief([tensor])
        return original(tensor, layout)

    return distribute_tensor
