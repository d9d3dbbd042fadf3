"""tf-keras's `strategy_combinations` as keras_dist strategies on CPU.

tf's combinations name devices this machine lacks ("gpu"); here each is a
simulated CPU device (conftest.py makes 4), so the combinations tf skips
without GPUs run. What has no keras_dist stand-in in one process is left
out, and `README.md` says where it is tested instead: `tpu_strategy` (no
TPU) and the multi-worker combinations (tests/test_multi_worker.py).

Also the few spellings a port needs on both backends: `function` is
`tf.function` on TensorFlow and the plain function on JAX (keras_dist's
`strategy.run` compiles its replica step there itself); `range_batches`
is `tf.data.Dataset.range(n).batch(b)` on TensorFlow and the same batches
as a list of NumPy arrays on JAX.
"""

from __future__ import annotations

import keras
import numpy as np

import keras_dist

BACKEND = keras.config.backend()

#: tf's combination name -> a function making the keras_dist strategy.
STRATEGIES = {
    "default_strategy": keras_dist.get_strategy,
    "one_device_strategy": lambda: keras_dist.OneDeviceStrategy("cpu:0"),
    "one_device_strategy_gpu": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "mirrored_strategy_with_gpu_and_cpu": lambda: keras_dist.MirroredStrategy(["cpu:1", "cpu:0"]),
    "mirrored_strategy_with_two_gpus": lambda: keras_dist.MirroredStrategy(["cpu:1", "cpu:2"]),
    "central_storage_strategy_with_gpu_and_cpu": lambda: keras_dist.CentralStorageStrategy(["cpu:1", "cpu:0"], parameter_device="cpu:0"),
}

strategies_minus_tpu = list(STRATEGIES)
strategies_minus_default_minus_tpu = [name for name in STRATEGIES if name != "default_strategy"]
all_strategies = strategies_minus_tpu  # + tpu_strategy: no TPU here
multidevice_strategies = ["mirrored_strategy_with_gpu_and_cpu", "mirrored_strategy_with_two_gpus"]  # + tpu_strategy


#: tf's combinations that none of the lists above holds (a file names them itself).
OTHER_STRATEGIES = {
    "central_storage_strategy_with_two_gpus": lambda: keras_dist.CentralStorageStrategy(
        ["cpu:1", "cpu:2"], parameter_device="cpu:0"
    ),
}


def strategy(name: str):
    return {**STRATEGIES, **OTHER_STRATEGIES}[name]()


def function(fn):
    """`tf.function` on TensorFlow; `fn` itself on JAX."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.function(fn)
    return fn


def range_batches(n: int, batch_size: int, drop_remainder: bool = False):
    """`tf.data.Dataset.range(n).batch(batch_size)`, or those batches (NumPy) on JAX."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.data.Dataset.range(n).batch(batch_size, drop_remainder=drop_remainder)
    stop = n - n % batch_size if drop_remainder else n
    return [np.arange(start, min(start + batch_size, stop), dtype="int64") for start in range(0, stop, batch_size)]


def repeated_batches(arrays, repeat: int, batch_size: int, drop_remainder: bool = False):
    """`tf.data.Dataset.from_tensor_slices(arrays).repeat(repeat).batch(batch_size)`
    on TensorFlow; on JAX (no tf.data in the JAX-only install) a
    `keras.utils.PyDataset` of the same batches, reusable like the dataset."""
    if BACKEND == "tensorflow":
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(arrays).repeat(repeat).batch(batch_size, drop_remainder=drop_remainder)
    return _RepeatedBatches(arrays, repeat, batch_size, drop_remainder)


class _RepeatedBatches(keras.utils.PyDataset):
    def __init__(self, arrays, repeat, batch_size, drop_remainder):
        super().__init__()
        self._arrays = arrays if isinstance(arrays, tuple) else (arrays,)
        rows = len(self._arrays[0]) * repeat
        self._order = np.tile(np.arange(len(self._arrays[0])), repeat)
        self._batch_size = batch_size
        self._num_batches = rows // batch_size if drop_remainder else -(-rows // batch_size)
        self._single = not isinstance(arrays, tuple)

    def __len__(self):
        return self._num_batches

    def __getitem__(self, index):
        rows = self._order[index * self._batch_size : (index + 1) * self._batch_size]
        batch = tuple(array[rows] for array in self._arrays)
        return batch[0] if self._single else batch
