"""Keras callbacks from keras_dist.

```python
report = keras_dist.callbacks.ScalingReport(plot_path="scaling.png")
model.fit(x, y, batch_size=256, callbacks=[report])
```
"""

from keras_dist.callbacks._report import ScalingResult
from keras_dist.callbacks._scaling_report import ScalingReport

__all__ = ["ScalingReport", "ScalingResult"]
