"""JAX backend: a `jax.sharding.Mesh` over the strategy's devices.

Variables are replicated on the mesh (through a Keras `DataParallel`
distribution, so Keras places them itself); each global batch is sharded
along the mesh's ``batch`` axis inside the compiled step, so XLA's SPMD
partitioner splits the work and inserts the all-reduces. Because the step
is written on global arrays, losses, metrics and BatchNorm statistics are
those of the global batch, exactly as on one device. Batches that do not
divide by the replica count are handed to the step replicated and sharded
inside it; XLA pads and masks the uneven shards. Multi-process CPU jobs
train even batches per replica instead, with one packed gradient
all-reduce (see `_replica_step`).
"""

from keras_dist.backends.jax._adapter import JaxAdapter
from keras_dist.backends.jax._replica import JaxPerReplica

#: The adapter `keras_dist.backends.get_adapter()` returns on JAX.
ADAPTER = JaxAdapter()

__all__ = ["ADAPTER", "JaxAdapter", "JaxPerReplica"]
