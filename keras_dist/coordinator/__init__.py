"""`keras_dist.coordinator`: tf.distribute.experimental.coordinator's names.

`ClusterCoordinator` schedules functions on the workers of a
`keras_dist.ParameterServerStrategy`; the engine behind it is the
backend's (TensorFlow: tf's `ClusterCoordinator`; JAX: Ray actors).

```python
strategy = keras_dist.ParameterServerStrategy(resolver)
coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
result = coordinator.schedule(step_fn, args=(iterator,))
coordinator.join()
print(result.fetch())
```
"""

from __future__ import annotations

from keras_dist.coordinator._coordinator import ClusterCoordinator, PerWorkerValues, RemoteValue

__all__ = ["ClusterCoordinator", "PerWorkerValues", "RemoteValue"]
