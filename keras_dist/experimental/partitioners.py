"""`keras_dist.experimental.partitioners`: tf.distribute.experimental.partitioners' names.

```python
partitioner = keras_dist.experimental.partitioners.MinSizePartitioner(
    min_shard_bytes=256 << 10, max_shards=2)
strategy = keras_dist.ParameterServerStrategy(resolver, variable_partitioner=partitioner)
```
"""

from __future__ import annotations

from keras_dist._partitioners import FixedShardsPartitioner, MaxSizePartitioner, MinSizePartitioner, Partitioner

__all__ = ["FixedShardsPartitioner", "MaxSizePartitioner", "MinSizePartitioner", "Partitioner"]
