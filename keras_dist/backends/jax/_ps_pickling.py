"""Scheduled functions on JAX's parameter servers, as they travel to a
worker actor: pickled (cloudpickle) with every reference to the strategy's
own objects replaced by a token the worker resolves to its own copy.

Tokens: the strategy itself, a registered model (its variables follow it),
an optimizer, a model's variable (by its model and position), and a
per-worker iterator (`PerWorkerIterator`, made from a `PerWorkerDataset`
that `create_per_worker_dataset` records). What a worker must hold first
(models, datasets) is listed beside the payload. Objects that cannot go
(the coordinator, a metric or layer made in the scope, a variable of no
model) raise one error naming what to pass instead.
"""

from __future__ import annotations

import io

from keras_dist.coordinator import PerWorkerValues


def token(cluster, obj, needs: list):
    """The token `obj` travels as (None: pickled as itself), appending to
    `needs` what the worker must hold to resolve it."""
    import keras

    from keras_dist.coordinator import ClusterCoordinator

    strategy = cluster.strategy_ref()
    if obj is strategy:
        return ("strategy",)
    if isinstance(obj, ClusterCoordinator):
        raise TypeError("A scheduled function cannot use the ClusterCoordinator: it runs on a worker.")
    if isinstance(obj, PerWorkerIterator):
        if obj._cluster is not cluster:
            raise ValueError("This per-worker iterator belongs to another ClusterCoordinator.")
        needs.append(("dataset", obj._dataset_id))
        return ("iterator", obj._iterator_id, obj._dataset_id)
    if isinstance(obj, PerWorkerDataset):
        raise TypeError(
            "A scheduled function takes the per-worker iterator, iter(per_worker_dataset), "
            "not the per-worker dataset."
        )
    if isinstance(obj, keras.Model):
        mid = cluster.register_model(obj)
        needs.append(("model", mid))
        return ("model", mid)
    if isinstance(obj, keras.optimizers.Optimizer):
        return ("optimizer", cluster.register_optimizer(obj))
    if isinstance(obj, keras.Variable):
        vid = cluster.vid_of.get(id(obj))
        if vid is not None and cluster.variables[vid] is obj:
            for mid, model, layout, _, _ in cluster.models.values():
                for position, (v, _) in enumerate(layout):
                    if v == vid:
                        needs.append(("model", mid))
                        return ("variable", mid, position)
        if cluster.owns(obj):
            raise ValueError(
                f"A scheduled function uses variable {obj.path!r}, which belongs to no model it "
                "refers to. On JAX, scheduled functions read variables through their model: "
                "refer to the model (its variables follow)."
            )
        return None
    if isinstance(obj, (keras.layers.Layer, keras.metrics.Metric)) and any(cluster.owns(v) for v in obj.variables):
        raise ValueError(
            f"A scheduled function uses {type(obj).__name__} {obj.name!r} made in the strategy's "
            "scope. On JAX, scheduled functions may refer to models and optimizers (the model's "
            "layers through the model); metrics live on the coordinator: return values from the "
            "function and update metrics with what fetch() gives."
        )
    return None


def pickle_call(cluster, fn, args, kwargs) -> tuple[bytes, list]:
    """`fn(*args, **kwargs)` pickled for a worker of `cluster`, and what the
    worker must hold first (`("model", mid)`, `("dataset", dsid)`), once each."""
    import ray.cloudpickle as cloudpickle

    needs: list = []

    class Pickler(cloudpickle.CloudPickler):
        def persistent_id(self, obj):
            return token(cluster, obj, needs)

    buffer = io.BytesIO()
    Pickler(buffer).dump((fn, args, kwargs))
    unique = list(dict.fromkeys(needs))
    return buffer.getvalue(), unique


# -- per-worker datasets


class PerWorkerDataset(PerWorkerValues):
    """A dataset made on each worker by `dataset_fn`; `iter()` of it is the
    per-worker iterator a scheduled function takes."""

    def __init__(self, cluster, dataset_id: int):
        super().__init__(("dataset", dataset_id))
        self._cluster = cluster
        self._dataset_id = dataset_id

    def __iter__(self):
        return PerWorkerIterator(self._cluster, self._dataset_id, next(self._cluster._ids))

    def __repr__(self):
        return f"PerWorkerDataset(workers={self._cluster.num_workers})"


class PerWorkerIterator(PerWorkerValues):
    """Each worker's own iterator over its dataset (a token here)."""

    def __init__(self, cluster, dataset_id: int, iterator_id: int):
        super().__init__(("iterator", iterator_id))
        self._cluster = cluster
        self._dataset_id = dataset_id
        self._iterator_id = iterator_id

    def __next__(self):
        raise TypeError(
            "A per-worker iterator is read on the workers: pass it to a scheduled function "
            "(coordinator.schedule(fn, args=(iterator,))) and call next() there."
        )

    def __repr__(self):
        return f"PerWorkerIterator(workers={self._cluster.num_workers})"


def create_per_worker_dataset(cluster, dataset_fn) -> PerWorkerDataset:
    """Records `dataset_fn` (pickled) for `cluster`'s workers, each of
    which makes its own dataset with it when a function first needs it."""
    import ray.cloudpickle as cloudpickle

    from keras_dist._input import is_dataset_object

    if is_dataset_object(dataset_fn):
        raise TypeError(
            "On JAX the workers are Ray actors, which a tf.data.Dataset made here cannot be "
            "sent to: pass a function that makes it on each worker, e.g. "
            "keras_dist.experimental.DatasetCreator(lambda input_context: make_dataset()) "
            "for fit, or coordinator.create_per_worker_dataset(make_dataset)."
        )
    cluster.start()
    if not callable(dataset_fn):
        raise TypeError("create_per_worker_dataset takes a function that makes the dataset.")
    dataset_id = next(cluster._ids)
    cluster.datasets[dataset_id] = cloudpickle.dumps(dataset_fn)
    return PerWorkerDataset(cluster, dataset_id)
