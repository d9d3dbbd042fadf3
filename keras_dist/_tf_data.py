"""Multi-worker `tf.data` input under `AutoShardPolicy.FILE`, `OFF` or `HINT`.

With the default policy (AUTO, or DATA) every worker reads the same global
batches and keeps its replicas' rows, so training equals one device on
those batches. With FILE, OFF or HINT the user asks for tf's own
per-worker input instead: each worker builds its stream as
`tf.distribute` does (tf.data's rebatch of each global batch into one
piece per replica in the job, then its auto-shard rewrite for this
worker), takes one piece per local replica each step, and the step's
global batch is the union of every worker's rows that step
(`keras_dist._worker_batches.WorkerBatches`). Which examples form a global batch
then depends on the worker count, as in tf:

- FILE: each worker reads its own files; every example once per epoch.
- OFF: every worker reads every file; each example W times per epoch.
- HINT: `dataset.shard(SHARD_HINT, SHARD_HINT)` marks where to shard;
  without one, as OFF.

tf.data is an input format here, not an engine: this module imports
tensorflow inside its functions, only once a user has handed keras_dist a
`tf.data.Dataset` (on JAX too, as Keras' own data adapters do). It is the
one core module allowed to (tests/test_architecture.py).

>>> import tensorflow as tf
>>> options = tf.data.Options()
>>> options.experimental_distribute.auto_shard_policy = tf.data.experimental.AutoShardPolicy.OFF
>>> dataset = tf.data.Dataset.range(10).batch(4).with_options(options)
>>> [b.tolist() for b in worker_dataset(dataset, 2, 1, 2).as_numpy_iterator()]
[[0, 1], [2, 3], [4, 5], [6, 7], [8, 9]]
"""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

#: The policies under which each worker reads its own stream (tf's names).
WORKER_POLICIES = ("FILE", "OFF", "HINT")


def auto_shard_policy(dataset: Any) -> Optional[str]:
    """The name of a `tf.data` dataset's auto-shard policy, or None for
    anything else (NumPy arrays, Python iterables, a `PyDataset`)."""
    if not callable(getattr(dataset, "options", None)) or not hasattr(dataset, "element_spec"):
        return None
    try:
        policy = dataset.options().experimental_distribute.auto_shard_policy
    except AttributeError:
        return None
    return getattr(policy, "name", str(policy))


def reads_per_worker(dataset: Any, num_workers: int) -> bool:
    """Whether `dataset` asks each of `num_workers` > 1 workers to read its
    own stream (a tf.data dataset with policy FILE, OFF or HINT)."""
    return num_workers > 1 and auto_shard_policy(dataset) in WORKER_POLICIES


def worker_stream(dataset: Any, num_workers: int, worker_index: int, num_replicas: int) -> tuple:
    """`(stream, empty, max_rows)` for this worker: `worker_dataset`, its
    `empty_batch`, and the most rows a step of it holds (its replicas'
    pieces of a global batch, each at most ceil(B / replicas) rows; None
    where tf cannot read the global batch size B from the pipeline)."""
    batch_size = _global_batch_size(dataset)
    stream = _worker_dataset(dataset, num_workers, worker_index, num_replicas, batch_size)
    max_rows = None if batch_size is None else -(-batch_size // num_replicas) * (num_replicas // num_workers)
    return stream, empty_batch(stream.element_spec), max_rows


def _global_batch_size(dataset: Any) -> Optional[int]:
    """The global batch size tf reads from the pipeline, or None."""
    from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute

    batch_size = int(tf_data_distribute.compute_batch_size(dataset))
    return None if batch_size == -1 else batch_size


def worker_dataset(dataset: Any, num_workers: int, worker_index: int, num_replicas: int) -> Any:
    """This worker's stream of a dataset of global batches, one element a
    step: tf.distribute's per-worker pipeline (rebatch into one piece per
    replica in the job, auto-shard for this worker), its pieces taken one
    per local replica and concatenated.

    Its cardinality is left unknown: workers may hold different numbers of
    steps (FILE), and the job's steps end together (`WorkerBatches`).
    """
    return _worker_dataset(dataset, num_workers, worker_index, num_replicas, _global_batch_size(dataset))


def _worker_dataset(dataset, num_workers, worker_index, num_replicas, batch_size):
    from tensorflow.python.data.experimental.ops import distribute as tf_data_distribute
    from tensorflow.python.distribute import input_ops

    if num_replicas % num_workers:
        raise ValueError(f"{num_replicas} replicas do not divide over {num_workers} workers.")
    per_worker = num_replicas // num_workers
    if batch_size is not None:  # as tf.distribute: tf's own split of a global batch
        sizes = tf_data_distribute.batch_sizes_for_worker(batch_size, num_workers, per_worker, worker_index)
        pieces = dataset.rebatch(sizes)
    else:  # tf cannot read the batch size from the pipeline: tf's legacy split
        pieces = tf_data_distribute._LegacyRebatchDataset(dataset, num_replicas)
    pieces = input_ops.auto_shard_dataset(pieces, num_workers, worker_index, num_replicas)
    return _steps_of_pieces(pieces, per_worker)


def replica_batches_stream(dataset: Any, replicas_per_worker: int) -> tuple:
    """`(stream, empty)` for this worker, as `worker_stream` gives them, of
    a dataset of per-replica batches (what `distribute_datasets_from_function`'s
    `dataset_fn` returns on this worker): its batches taken one per local
    replica and concatenated, a last step perhaps with fewer, and the
    stream's `empty_batch` (the clear error where a part's dimensions but
    the batch one are unknown)."""
    stream = _steps_of_pieces(dataset, replicas_per_worker)
    return stream, empty_batch(stream.element_spec)


def _steps_of_pieces(pieces: Any, per_worker: int) -> Any:
    """`pieces` (one per replica) taken `per_worker` at a time and
    concatenated along the batch dimension; unknown cardinality."""
    import tensorflow as tf

    if per_worker > 1:
        is_tuple = isinstance(pieces.element_spec, tuple)

        def concatenate(piece):
            if isinstance(piece, tf.RaggedTensor):
                return piece.merge_dims(0, 1)
            return tf.reshape(piece, tf.concat([[-1], tf.shape(piece)[2:]], 0))

        def step(*element):
            element = element if is_tuple else element[0]
            return tf.nest.map_structure(concatenate, element)

        pieces = pieces.ragged_batch(per_worker).map(step)
    return pieces.filter(lambda *_: True)  # unknown cardinality


def empty_batch(element_spec: Any) -> Any:
    """A batch of 0 rows with `element_spec`'s structure, dtypes and inner
    shapes (NumPy): what a worker whose stream has ended contributes."""
    import tensorflow as tf

    def empty(spec):
        shape = list(spec.shape)
        if any(d is None for d in shape[1:]):
            raise ValueError(
                f"A dataset read per worker (AutoShardPolicy FILE, OFF or HINT, or "
                f"distribute_datasets_from_function with several workers) needs "
                f"every dimension but the batch one known; an element part has shape "
                f"{tuple(shape)}. Give its parts static shapes (e.g. with "
                "dataset.map(lambda x, y: (tf.ensure_shape(x, ...), y)))."
            )
        return np.zeros([0, *shape[1:]], spec.dtype.as_numpy_dtype)

    return tf.nest.map_structure(empty, element_spec)


def dataset_of_batches(batches: Any, element_spec: Any) -> Any:
    """A `tf.data.Dataset` whose every pass calls `batches()` for a fresh
    pass over its batches; `element_spec` gives each part's dtype and
    inner shape (a `keras.KerasTensor` or anything with `shape`/`dtype`;
    the batch dimension is left unknown).

    >>> import numpy as np
    >>> import keras
    >>> spec = keras.KerasTensor((None, 2), dtype="float32")
    >>> d = dataset_of_batches(lambda: iter([np.ones((3, 2), "float32")]), spec)
    >>> [b.shape for b in d.as_numpy_iterator()], [b.shape for b in d.as_numpy_iterator()]
    ([(3, 2)], [(3, 2)])
    """
    import tensorflow as tf

    def signature(spec):
        return tf.TensorSpec((None, *tuple(spec.shape)[1:]), tf.as_dtype(spec.dtype))

    return tf.data.Dataset.from_generator(batches, output_signature=tf.nest.map_structure(signature, element_spec))
