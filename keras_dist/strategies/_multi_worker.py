"""`MultiWorkerMirroredStrategy`: synchronous replicas on every device of
several worker processes (engine kind MULTI_WORKER)."""

from __future__ import annotations

from typing import Any

from keras_dist import _foreign
from keras_dist import _heartbeat as heartbeat
from keras_dist._engine_kind import EngineKind
from keras_dist.backends import get_adapter
from keras_dist.cluster_resolver._validate import check_cluster_to_join
from keras_dist.strategies._base import Strategy, StrategyExtended


class _MultiWorkerExtended(StrategyExtended):
    engine_kind = EngineKind.MULTI_WORKER

    def __init__(self, strategy, devices, global_devices, resolver, options):
        super().__init__(strategy, devices, engine_devices=global_devices)
        self._resolver = resolver
        self._options = options

    @property
    def should_checkpoint(self) -> bool:
        return self._resolver.is_chief

    @property
    def should_save_summary(self) -> bool:
        return self._resolver.is_chief

    @property
    def task_type(self):
        return self._resolver.task_type

    @property
    def task_id(self):
        return self._resolver.task_id

    @property
    def communication_options(self):
        return self._options

    @property
    def cluster_resolver(self):
        return self._resolver

    @property
    def num_workers(self) -> int:
        return self._resolver.num_workers

    @property
    def worker_index(self) -> int:
        return self._resolver.worker_index


def _default_resolver():
    """TF_CONFIG's cluster (as keras-dist launch sets it); where TF_CONFIG is
    unset and torchrun's variables are set, torchrun's."""
    import os

    from keras_dist.cluster_resolver import TFConfigClusterResolver
    from keras_dist.cluster_resolver._torchrun import TorchrunClusterResolver, in_torchrun_job

    if not os.environ.get("TF_CONFIG") and in_torchrun_job():
        return TorchrunClusterResolver()
    return TFConfigClusterResolver()


class MultiWorkerMirroredStrategy(Strategy):
    """Synchronous data parallelism over all devices of several workers.

    Every worker runs the same program; the cluster comes from
    `cluster_resolver` (default: the `TF_CONFIG` environment variable, as
    set by `keras-dist launch`; where it is unset, torchrun's variables). `num_replicas_in_sync` counts the replicas
    of all workers, and `batch_size` is the global batch: every worker
    passes the same full arrays and keras_dist gives each its share.
    Create it first thing in the program, before any computation.

    ```python
    strategy = keras_dist.MultiWorkerMirroredStrategy()   # one worker here
    with strategy.scope():
        model = keras.Sequential([keras.layers.Dense(1)])
        model.compile(optimizer="adam", loss="mse")
    model.fit(x, y, batch_size=64, verbose=0)
    ```
    """

    def __init__(self, cluster_resolver: Any = None, communication_options: Any = None):
        from keras_dist._communication import CommunicationOptions
        # TensorFlow: tf's own resolver and options are taken too (ported code)
        resolver = _foreign.accept(cluster_resolver, "cluster_resolver") or _default_resolver()
        options = _foreign.accept(communication_options, "communication_options") or CommunicationOptions()
        if not isinstance(options, CommunicationOptions):
            raise TypeError(
                "communication_options must be a keras_dist.CommunicationOptions, "
                f"got {options!r}."
            )
        if not (callable(getattr(resolver, "cluster_spec", None)) and hasattr(resolver, "task_type")):
            raise TypeError(
                "MultiWorkerMirroredStrategy(cluster_resolver=...) takes a cluster resolver, got "
                f"{type(resolver).__name__}. For a cluster written as a dict use "
                "keras_dist.cluster_resolver.SimpleClusterResolver(cluster_dict, task_type='worker', "
                "task_id=i); leave it None to read TF_CONFIG."
            )
        if resolver.task_type not in (None, "chief", "worker"):
            raise ValueError(
                f"MultiWorkerMirroredStrategy runs on chief and worker tasks; "
                f"this task is {resolver.task_type!r}."
            )
        check_cluster_to_join(resolver)  # before joining: no hang, no engine dump
        self._cluster_resolver = resolver
        adapter = get_adapter()
        heartbeat.mark_join("joining")
        adapter.initialize_multi_worker(resolver, options)
        heartbeat.mark_join("joined")
        heartbeat.beat()  # joined the job
        super().__init__(
            _MultiWorkerExtended(
                self, adapter.visible_devices(), adapter.global_devices(), resolver, options
            )
        )

    @property
    def cluster_resolver(self):
        return self._cluster_resolver
