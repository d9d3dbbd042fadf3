"""The PyTorch backend adapter (`torch.distributed`): see `_adapter.py`."""

from keras_dist.backends.torch._adapter import TorchAdapter

ADAPTER = TorchAdapter()

__all__ = ["ADAPTER", "TorchAdapter"]
