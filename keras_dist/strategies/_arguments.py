"""Argument checks and input helpers shared by the strategies."""

from __future__ import annotations

import collections.abc
from typing import Any, Callable, Optional


def _check_per_replica_arguments(strategy: Any, arguments: Any) -> None:
    """Refuses a `PerReplica` argument whose number of values is not the
    replica count (replicas would get no value, or values would be
    dropped): a PerReplica of values holds this worker's replicas'; one of
    the engine's that says how many it spans (JAX's global arrays), all of
    them."""
    from keras_dist._values import PerReplica

    found: list = []

    def collect(value):  # no generator: autograph converts run's callees, and warns on them
        if isinstance(value, PerReplica):
            found.append(value)
        elif isinstance(value, (list, tuple)):
            for item in value:
                collect(item)
        elif isinstance(value, collections.abc.Mapping):
            for item in value.values():
                collect(item)

    collect(arguments)
    local = strategy.num_replicas_in_sync // max(1, strategy.extended.num_workers)
    for leaf in found:
        spans = getattr(leaf, "num_replicas", None)
        count, num_replicas = (spans, strategy.num_replicas_in_sync) if spans else (len(leaf.values), local)
        if count != num_replicas:
            raise ValueError(
                f"strategy.run got a PerReplica of {count} values on a strategy of "
                f"{num_replicas} replicas (on this worker): it needs one value per replica. Make it with "
                "strategy.experimental_distribute_values_from_function(fn) (fn is called once per "
                "replica) or experimental_distribute_dataset."
            )


def _check_axis(method: str, axis: Any, components: tuple) -> None:
    """`axis` must be an integer within the rank of the per-replica values."""
    if isinstance(axis, bool) or not isinstance(axis, int):
        raise TypeError(f"strategy.{method}: axis must be an integer, got {axis!r}.")
    ranks = {len(component.shape) for component in components if hasattr(component, "shape")}
    if not ranks:  # nests and Python numbers: the engine checks them
        return
    rank = min(ranks)
    if not -rank <= axis < rank:
        raise ValueError(
            f"strategy.{method}: axis={axis} is out of range for per-replica values "
            f"of rank {rank} (valid: {-rank}..{rank - 1}); "
            + ("pass axis=None to combine scalars." if method == "reduce" and rank == 0 else "pick an existing axis.")
        )


#: Dimensions of each per-replica value that `_check_gather_shapes`
#: compares across workers (a higher rank is compared by its first ones).
_GATHER_CHECKED_RANK = 8


def _check_gather_shapes(strategy: Any, value: Any, axis: int, components: tuple) -> None:
    """Every replica's value of a per-replica `value` must agree but along
    `axis` (tf.distribute's rule): one clear error on every worker, before
    any collective (tf's and gloo's own errors come from inside one, and
    leave the job's collectives unusable: "Restart your program"). Across
    workers the shapes travel first (one all-gather of a few integers)."""
    import zlib

    import numpy as np

    from keras_dist._values import PerReplica, _dtype_name, uneven_gather_message

    workers = strategy.extended.num_workers
    if not isinstance(value, PerReplica):
        from keras_dist.backends import backend_name

        # tf.distribute gives run's result of a worker's one replica as a
        # plain tensor, and gathers it over the job: checked as one
        if not (workers > 1 and backend_name() == "tensorflow" and hasattr(value, "shape")):
            return
    shaped = all(hasattr(c, "shape") and hasattr(c, "dtype") for c in components)
    shapes = [(f"replica {i}", tuple(int(d) for d in c.shape), _dtype_name(c.dtype))
              for i, c in enumerate(components)] if shaped else []
    if workers > 1:
        rows = np.full((max(1, len(components)), _GATHER_CHECKED_RANK + 2), -1, np.int32)
        if shaped:
            for row, (_, shape, dtype) in zip(rows, shapes):
                row[0] = len(shape)
                row[1 : 1 + min(len(shape), _GATHER_CHECKED_RANK)] = shape[:_GATHER_CHECKED_RANK]
                row[-1] = zlib.crc32(dtype.encode()) % 2**31
        else:
            rows[:, 0] = -2  # nests and numbers: the engine checks them
        from keras_dist.backends import get_adapter

        (every,) = get_adapter().values_from_every_worker([rows])
        every = np.asarray(every)
        if (every[:, :, 0] == -2).any():
            return
        names = {zlib.crc32(d.encode()) % 2**31: d for d in ("float16", "bfloat16", "float32", "float64", "int8",
                                                             "int16", "int32", "int64", "uint8", "bool")}
        shapes = [
            (f"worker {w} replica {r}", tuple(int(d) for d in row[1 : 1 + min(int(row[0]), _GATHER_CHECKED_RANK)]),
             names.get(int(row[-1]), "another dtype"))
            for w, worker in enumerate(every) for r, row in enumerate(worker)
        ]
    if len(shapes) < 2:
        return
    message = uneven_gather_message(axis, shapes)
    if message is not None:
        raise ValueError(message)


def _natively(adapter, engine, dataset, first_replica: int, kind: str, options) -> Any:
    """The engine's own distributed dataset (the adapter's optional
    `distribute_dataset_natively`), or None: keras_dist splits on the host."""
    if adapter.distribute_dataset_natively is None:
        return None
    return adapter.distribute_dataset_natively(engine, dataset, first_replica, kind, options)


def _trains_as(native: Any, strategy: Any, make_source: Callable[[], Any]) -> Any:
    """`native` (the engine's own distributed dataset) marked, as
    `DistributedDataset._made_by` marks keras_dist's, with a function
    giving what `fit`/`evaluate`/`predict` under `strategy` take in its
    place: its undistributed source, or keras_dist's own distributed
    dataset of the same batches, made only then (the native one may be
    made while a `tf.function` traces) (`keras_dist._hooks._distributed_input`).
    Handed to Keras as it is, the engine's would be read as global batches
    of one replica's rows (TensorFlow: 0.28 off one device on 4 replicas)."""
    native._keras_dist_trains_as = (strategy, make_source)
    return native


def _steps_of_replica_batches(datasets: Any, num_replicas: int, per_replica: bool) -> Optional[int]:
    """How many steps `distribute_datasets_from_function`'s input gives,
    where its datasets say (else None): one per `num_replicas` batches of
    one pipeline, or the longest of the replicas' pipelines."""
    from keras_dist._input import known_length

    if per_replica:
        lengths = [known_length(d) for d in datasets]
        return None if None in lengths else max(lengths, default=0)
    length = known_length(datasets)
    return None if length is None else -(-length // num_replicas)


def _input_options(method: str, options: Any):
    """`options` as a `keras_dist.InputOptions` (the defaults for None)."""
    from keras_dist._input import InputOptions

    if options is None:
        return InputOptions()
    if not isinstance(options, InputOptions):
        raise TypeError(f"strategy.{method}(options=...) takes a keras_dist.InputOptions, got {options!r}.")
    return options


def _check_host_input_options(method: str, options) -> None:
    """Where keras_dist splits batches on the host (JAX; non-tf.data input
    on TensorFlow) every element goes to the devices: it cannot keep one
    off them or run the pipeline on them."""
    if options.experimental_place_dataset_on_device:
        raise NotImplementedError(
            f"strategy.{method}: InputOptions(experimental_place_dataset_on_device=True) "
            "needs an input pipeline that runs on the device (tf.data on "
            "TensorFlow); here the pipeline runs on the host. Leave it False."
        )
    if not options.fetch_to_device:
        raise NotImplementedError(
            f"strategy.{method}: InputOptions(experimental_fetch_to_device=False) "
            "cannot be carried out here: keras_dist splits each batch on the host "
            "and places the shards on the replicas' devices, where the replicas "
            "run on them (tf.data input on TensorFlow can keep them off the "
            "devices). Leave it None or True."
        )
