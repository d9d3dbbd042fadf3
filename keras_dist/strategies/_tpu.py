"""`TPUStrategy`: replicas on TPU cores, `steps_per_execution` on device
(engine kind TPU)."""

from __future__ import annotations

import logging
from typing import Any, Sequence

from keras_dist import _devices, _foreign
from keras_dist._engine_kind import EngineKind
from keras_dist.backends import get_adapter
from keras_dist.strategies._base import Strategy
from keras_dist.strategies._multi_worker import _MultiWorkerExtended

TPU_ON_CPU_ENV = _devices.TPU_ON_CPU_ENV


class _TPUExtended(_MultiWorkerExtended):
    engine_kind = EngineKind.TPU


class TPUStrategy(Strategy):
    """Synchronous data parallelism over TPU cores (`tf.distribute.TPUStrategy`).

    Every variable is replicated on each TPU core and the global batch is
    split across them, as in `MirroredStrategy`. `steps_per_execution` in
    `compile` is the lever that matters on TPU: with it, `fit` and
    `evaluate` run that many batches in one compiled on-device loop.

    Where no TPU is visible it raises, naming `MirroredStrategy`; the test
    hook ``KERAS_DIST_TPU_ON_CPU=1`` makes it run over the CPU devices.
    Tested over simulated CPU devices only; not yet on real TPUs.

    ```python
    resolver = keras_dist.cluster_resolver.TPUClusterResolver()
    keras_dist.tpu.experimental.initialize_tpu_system(resolver)
    try:
        strategy = keras_dist.TPUStrategy(resolver)
    except RuntimeError:  # no TPU on this machine
        strategy = keras_dist.MirroredStrategy()
    ```
    """

    def __init__(self, tpu_cluster_resolver: Any = None, experimental_device_assignment: Any = None):
        from keras_dist._communication import CommunicationOptions

        if experimental_device_assignment is not None:
            raise NotImplementedError(
                "TPUStrategy(experimental_device_assignment=...) is not supported: "
                "keras_dist places one replica on every TPU core of the job. Pass "
                "experimental_device_assignment=None (for model parallelism on JAX, "
                "use keras.distribution.ModelParallel)."
            )
        if tpu_cluster_resolver is None:
            from keras_dist.cluster_resolver import TPUClusterResolver

            tpu_cluster_resolver = TPUClusterResolver()
        resolver = _foreign.accept(tpu_cluster_resolver, "cluster_resolver")
        adapter = get_adapter()
        adapter.initialize_tpu_system(resolver)  # before the devices are listed
        local = _tpu_cores(adapter.visible_devices())
        if resolver.num_workers > 1:
            global_devices = _tpu_cores(adapter.global_devices())
        else:
            global_devices = local
        self._cluster_resolver = resolver
        super().__init__(
            _TPUExtended(self, local, global_devices, resolver, CommunicationOptions())
        )

    @property
    def cluster_resolver(self):
        return self._cluster_resolver


def _tpu_cores(devices: Sequence[str]) -> tuple[str, ...]:
    """The TPU cores among `devices`; the CPU devices under the test hook;
    else the error that says what was looked for and what to use."""
    import os

    tpus = tuple(d for d in devices if d.startswith("tpu:"))
    if tpus:
        logging.getLogger("keras_dist").warning(
            "keras_dist's TPUStrategy found %d TPU core(s). It has been tested "
            "over CPU devices only, not yet on real TPUs: compare a few steps "
            "with MirroredStrategy and report what you see.",
            len(tpus),
        )
        return tpus
    if os.environ.get(TPU_ON_CPU_ENV) == "1":
        return tuple(d for d in devices if d.startswith("cpu:"))
    raise RuntimeError(
        "TPUStrategy found no TPU: the backend lists "
        f"{', '.join(devices) or 'no devices'} and no 'tpu:N' device. On a "
        "Cloud TPU VM, install the backend's TPU build (jax[tpu], or "
        "tensorflow with TPU support). Without a TPU, use "
        "keras_dist.MirroredStrategy() (GPUs or CPU). To exercise the TPU "
        f"code path on CPU devices (tests), set {TPU_ON_CPU_ENV}=1."
    )
