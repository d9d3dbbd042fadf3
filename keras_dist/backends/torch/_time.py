"""PyTorch: timing one all-reduce of the training step's size (ScalingReport)."""

from __future__ import annotations

import time

import numpy as np
import torch

from keras_dist.backends.torch import _collectives


def time_all_reduce(engine, shapes_and_dtypes, repeats: int = 5) -> float:
    """Median seconds to all-reduce buffers of these shapes over the job,
    packed as the training step packs its gradients (one flat buffer per
    dtype); every process must call it (it is a collective)."""
    if engine.num_replicas == 1 or not shapes_and_dtypes:
        return 0.0
    sizes = {}
    for shape, dtype in shapes_and_dtypes:
        sizes[str(np.dtype(dtype))] = sizes.get(str(np.dtype(dtype)), 0) + int(np.prod(shape))
    device = engine.torch_device
    buffers = [torch.zeros(size, dtype=getattr(torch, dtype), device=device) for dtype, size in sizes.items()]
    _collectives.all_reduce_sum(buffers)  # warm up
    times = []
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        _collectives.all_reduce_sum(buffers)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times.append(time.perf_counter() - start)
    return float(np.median(times))
