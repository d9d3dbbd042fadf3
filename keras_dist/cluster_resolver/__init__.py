"""Cluster description, backend-agnostic (`tf.distribute.cluster_resolver` names).

Pure Python (standard library only): nothing here imports JAX or TensorFlow.

```python
from keras_dist.cluster_resolver import TFConfigClusterResolver
resolver = TFConfigClusterResolver()   # reads TF_CONFIG when asked
resolver.cluster_spec(), resolver.task_type, resolver.task_id
resolver.num_workers, resolver.is_chief, resolver.worker_index
```

`KubernetesClusterResolver` and `GCEClusterResolver` list the machines through
the `kubernetes` / `googleapiclient` package, imported only when no client of
your own (`override_client=`, `service=`) is given.
"""

from keras_dist.cluster_resolver._cloud import GCEClusterResolver, KubernetesClusterResolver, KubernetesExecutableLocation
from keras_dist.cluster_resolver._cluster_spec import ClusterSpec
from keras_dist.cluster_resolver._resolvers import (
    ClusterResolver,
    SimpleClusterResolver,
    TFConfigClusterResolver,
)
from keras_dist.cluster_resolver._slurm import SlurmClusterResolver
from keras_dist.cluster_resolver._torchrun import TorchrunClusterResolver
from keras_dist.cluster_resolver._tpu import TPUClusterResolver
from keras_dist.cluster_resolver._union import UnionResolver

__all__ = [
    "ClusterResolver",
    "ClusterSpec",
    "GCEClusterResolver",
    "KubernetesClusterResolver",
    "KubernetesExecutableLocation",
    "SimpleClusterResolver",
    "SlurmClusterResolver",
    "TFConfigClusterResolver",
    "TPUClusterResolver",
    "TorchrunClusterResolver",
    "UnionResolver",
]
