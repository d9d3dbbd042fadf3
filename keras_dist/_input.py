"""Input for custom loops: InputContext, InputOptions, distributed datasets."""

from __future__ import annotations

import abc
import collections
import dataclasses
import enum
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

from keras_dist._split import per_replica_batch_size


class InputReplicationMode(enum.Enum):
    """How `distribute_datasets_from_function` builds input (tf names):
    one pipeline per worker, or one per replica.

    ```python
    options = keras_dist.InputOptions(experimental_replication_mode=keras_dist.InputReplicationMode.PER_WORKER)
    options.experimental_replication_mode.value  # 'PER_WORKER'
    ```
    """

    PER_WORKER = "PER_WORKER"
    PER_REPLICA = "PER_REPLICA"


@dataclasses.dataclass(frozen=True)
class InputOptions:
    """Options for distributing a dataset (tf.distribute.InputOptions).

    - `experimental_fetch_to_device` (None: True unless the dataset is
      placed on the device): put each element on the replicas' devices.
    - `experimental_replication_mode`: `InputReplicationMode.PER_WORKER`,
      or `PER_REPLICA` (`distribute_datasets_from_function` only: one
      `dataset_fn` call per replica).
    - `experimental_place_dataset_on_device`: run the input pipeline on the
      device (PER_REPLICA, without fetch_to_device).
    - `experimental_per_replica_buffer_size`: elements prepared ahead.

    On TensorFlow with tf.data input, tf carries them out; elsewhere
    keras_dist does (buffer size, replication mode) or raises, naming what
    the backend cannot do (an element kept off the devices, a pipeline on
    the device).

    >>> InputOptions(experimental_per_replica_buffer_size=2).fetch_to_device
    True
    """

    experimental_fetch_to_device: Optional[bool] = None
    experimental_replication_mode: InputReplicationMode = InputReplicationMode.PER_WORKER
    experimental_place_dataset_on_device: bool = False
    experimental_per_replica_buffer_size: int = 1

    def __post_init__(self):
        if self.experimental_fetch_to_device not in (None, True, False):
            raise TypeError(f"InputOptions: experimental_fetch_to_device must be None, True or False, got {self.experimental_fetch_to_device!r}.")
        if not isinstance(self.experimental_replication_mode, InputReplicationMode):
            raise TypeError(
                "InputOptions: experimental_replication_mode must be a "
                f"keras_dist.InputReplicationMode, got {self.experimental_replication_mode!r}."
            )
        size = self.experimental_per_replica_buffer_size
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"InputOptions: experimental_per_replica_buffer_size must be a positive integer, got {size!r}.")
        if self.experimental_place_dataset_on_device:
            if self.experimental_replication_mode is not InputReplicationMode.PER_REPLICA:
                raise ValueError(
                    "InputOptions: experimental_place_dataset_on_device=True needs "
                    "experimental_replication_mode=InputReplicationMode.PER_REPLICA (as in tf)."
                )
            if self.experimental_fetch_to_device:
                raise ValueError(
                    "InputOptions: experimental_place_dataset_on_device and "
                    "experimental_fetch_to_device cannot both be True (as in tf); "
                    "set experimental_fetch_to_device=False."
                )

    @property
    def fetch_to_device(self) -> bool:
        """Whether elements go to the devices (the None default resolved)."""
        if self.experimental_fetch_to_device is None:
            return not self.experimental_place_dataset_on_device
        return self.experimental_fetch_to_device


class ValueContext:
    """Which replica `experimental_distribute_values_from_function` is
    building a value for.

    >>> ValueContext(replica_id_in_sync_group=1, num_replicas_in_sync=4).replica_id_in_sync_group
    1
    """

    def __init__(self, replica_id_in_sync_group: int = 0, num_replicas_in_sync: int = 1):
        self._replica_id_in_sync_group = replica_id_in_sync_group
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def replica_id_in_sync_group(self) -> int:
        return self._replica_id_in_sync_group

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def __repr__(self) -> str:
        return (
            f"ValueContext(replica_id_in_sync_group={self._replica_id_in_sync_group}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )


class InputContext:
    """What a `dataset_fn` needs to build its part of the input.

    >>> context = InputContext(num_replicas_in_sync=4)
    >>> context.get_per_replica_batch_size(64)
    16
    """

    def __init__(
        self,
        num_input_pipelines: int = 1,
        input_pipeline_id: int = 0,
        num_replicas_in_sync: int = 1,
    ):
        self._num_input_pipelines = num_input_pipelines
        self._input_pipeline_id = input_pipeline_id
        self._num_replicas_in_sync = num_replicas_in_sync

    @property
    def num_input_pipelines(self) -> int:
        return self._num_input_pipelines

    @property
    def input_pipeline_id(self) -> int:
        return self._input_pipeline_id

    @property
    def num_replicas_in_sync(self) -> int:
        return self._num_replicas_in_sync

    def get_per_replica_batch_size(self, global_batch_size: int) -> int:
        """`global_batch_size` / replicas; errors if it does not divide."""
        return per_replica_batch_size(global_batch_size, self._num_replicas_in_sync)

    def __repr__(self) -> str:
        return (
            f"InputContext(num_input_pipelines={self._num_input_pipelines}, "
            f"input_pipeline_id={self._input_pipeline_id}, "
            f"num_replicas_in_sync={self._num_replicas_in_sync})"
        )


def _shape(spec) -> Optional[list]:
    """A `tf.TypeSpec`'s shape as a list (None: unknown rank or no shape)."""
    shape = getattr(spec, "shape", None)
    if shape is None or getattr(shape, "rank", 0) is None:
        return None
    try:
        return list(shape.as_list() if hasattr(shape, "as_list") else shape)
    except (TypeError, ValueError):
        return None


def _unbatched_sign(parts: list, model_input: Optional[tuple]) -> Optional[str]:
    """Why the element shapes `parts` (x and y leaves; x first) cannot be
    batches, or None. `model_input`: the shape of a single-input model's
    input (batch axis included), where known."""
    shapes = [s for s in parts if s is not None]
    if any(len(s) == 0 for s in shapes):
        return "a part of each element is a scalar, with no batch axis"
    leading = [s[0] for s in shapes]
    if len(leading) > 1 and None not in leading and len(set(leading)) > 1:
        # tf's own test (compute_batch_size): the parts of a batch have one size.
        return f"the parts of each element have {len(set(leading))} different leading sizes {leading}"
    if model_input is not None and parts and parts[0] is not None:
        x, rank = parts[0], len(model_input)
        squeezed = len(x) == rank - 1 and model_input[-1] == 1  # Keras adds that axis
        if len(x) < rank and not squeezed:
            return (
                f"its inputs have shape {tuple(x)} and the model takes "
                f"{tuple(model_input)}, with the batch axis first"
            )
    return None


def check_batched(dataset: Any, num_replicas: int, model: Any = None, what: str = "fit") -> None:
    """Refuses a `tf.data` dataset of single examples (not batched).

    Only a dataset's `element_spec` is read, never its data. Signs, as tf's:
    a scalar part, parts of different static leading sizes, or (with a
    single-input `model`) inputs of lower rank than the model's.
    """
    spec = getattr(dataset, "element_spec", None)
    if spec is None or not callable(getattr(dataset, "batch", None)):
        return
    import keras

    if model is None:  # a custom loop: every part is split by rows
        parts = [_shape(s) for s in keras.tree.flatten(spec)]
        model_input = None
    else:
        spec = tuple(spec) if isinstance(spec, list) else spec
        x, y = (spec[0], spec[1] if len(spec) > 1 else None) if isinstance(spec, tuple) else (spec, None)
        parts = [_shape(s) for s in keras.tree.flatten(x)]
        model_input = _single_input_shape(model) if len(parts) == 1 else None
        parts += [_shape(s) for s in keras.tree.flatten(y)]
    reason = _unbatched_sign(parts, model_input)
    if reason is None:
        return
    raise ValueError(
        f"{what} got a tf.data dataset that is not batched: {reason}. A "
        "distributed step takes a global batch and splits its rows over the "
        f"{num_replicas} replicas in sync. Batch the dataset first: "
        "dataset.batch(global_batch_size)."
    )


def _single_input_shape(model) -> Optional[tuple]:
    try:
        inputs = model.inputs
    except (AttributeError, ValueError):  # a subclassed or unbuilt model
        return None
    if not inputs or len(inputs) != 1:
        return None
    return tuple(inputs[0].shape)


def check_dataset(dataset: Any) -> None:
    """Rejects inputs that are not a dataset or an iterable of batches."""
    import numpy as np

    if isinstance(dataset, np.ndarray) or (
        isinstance(dataset, tuple)
        and dataset
        and all(isinstance(part, np.ndarray) for part in dataset)
    ):
        raise ValueError(
            "experimental_distribute_dataset takes a dataset of global "
            "batches, not arrays of samples. Batch them first, e.g. "
            "tf.data.Dataset.from_tensor_slices((x, y)).batch(global_batch) "
            "or a list of (x, y) batches."
        )
    if not hasattr(dataset, "__iter__"):
        raise ValueError(
            f"Expected a tf.data.Dataset or an iterable of batches, got "
            f"{type(dataset).__name__}."
        )


_END = object()


class OnePass:
    """`batches()` over a one-shot iterator (a generator, an iterator): the
    first call reads it; `peek()` (for `element_spec`) looks at its first
    batch without losing it; a second pass is one clear error, not an
    empty epoch.

    >>> batches = OnePass(lambda: iter([1, 2]), iter([]))
    >>> batches.peek(), list(batches())
    (1, [1, 2])
    """

    def __init__(self, make_iterator: Callable[[], Iterable], source: Any):
        self._make = make_iterator
        self._source = source
        self._iterator: Optional[Iterator] = None
        self._head: list = []
        self._passes = 0

    @staticmethod
    def needed(dataset: Any) -> bool:
        """Whether `dataset` can be read only once (it is its own iterator)."""
        try:
            return iter(dataset) is dataset
        except TypeError:
            return False

    def _check_unread(self) -> None:
        if self._passes:
            raise ValueError(
                f"This distributed dataset was made from a one-shot {type(self._source).__name__} "
                "(it is its own iterator), which has been read once: a second pass (a second "
                "epoch, or iterating again) would see no batch. Give "
                "experimental_distribute_dataset something that can be iterated again: a list of "
                "batches, a tf.data.Dataset, a keras.utils.PyDataset, or call "
                "experimental_distribute_dataset again on a new generator for each pass."
            )

    def _read(self) -> Iterator:
        if self._iterator is None:
            self._iterator = iter(self._make())
        return self._iterator

    def peek(self) -> Any:
        """The first batch (None if there is none), kept for the pass."""
        self._check_unread()
        if not self._head:
            self._head = [next(self._read(), _END)]
        return None if self._head[0] is _END else self._head[0]

    def __call__(self) -> Iterator:
        self._check_unread()
        self._passes += 1
        head, self._head = [h for h in self._head if h is not _END], []
        yield from head
        yield from self._read()


def check_same_rows(batch: Any) -> Any:
    """`batch` itself, if every array in it has the same number of rows;
    else one clear error (each replica takes the same rows of every array,
    so arrays of different lengths would pair the wrong rows).

    >>> import numpy as np
    >>> check_same_rows((np.zeros((4, 2)), np.zeros(4)))[1].shape
    (4,)
    """
    import keras

    rows = []
    for leaf in keras.tree.flatten(batch):
        shape = getattr(leaf, "shape", None)
        if shape is not None and len(shape) >= 1 and shape[0] is not None:
            rows.append(int(shape[0]))
    if len(set(rows)) > 1:
        raise ValueError(
            "experimental_distribute_dataset got a batch whose arrays have different numbers of rows "
            f"({', '.join(map(str, rows))}): each replica takes the same rows of "
            "every array, so they would be paired wrongly. Give every array of a "
            "batch one row per example (e.g. x[:10] with y[:10], not y[:9])."
        )
    return batch


class OptionalValue:
    """What `DistributedIterator.get_next_as_optional` returns: a value, or
    none at the end of the data (tf.experimental.Optional's methods).

    >>> OptionalValue(None, False).has_value()
    False
    """

    def __init__(self, value: Any, has_value: bool):
        self._value = value
        self._has_value = has_value

    def has_value(self) -> bool:
        return self._has_value

    def get_value(self) -> Any:
        if not self._has_value:
            raise ValueError("get_value() of an empty optional: the distributed iterator is exhausted.")
        return self._value


class DistributedIterator(metaclass=abc.ABCMeta):
    """An iterator over a distributed dataset's per-replica elements
    (tf.distribute.DistributedIterator; tf's own is one on TensorFlow).

    `get_next()` raises StopIteration at the end (tf raises its
    OutOfRangeError there); `get_next_as_optional()` returns an
    `OptionalValue` instead.

    ```python
    strategy = keras_dist.MirroredStrategy()
    iterator = iter(strategy.experimental_distribute_dataset([(x[:10],), (x[10:20],)]))
    (first,) = iterator.get_next()
    rows = sum(int(part.shape[0]) for part in strategy.experimental_local_results(first))
    assert rows == 10 or strategy.extended.num_workers > 1
    ```
    """

    def __init__(self, elements: Iterator, element_spec: Callable[[], Any]):
        self._elements = elements
        self._element_spec = element_spec

    def __iter__(self) -> "DistributedIterator":
        return self

    def __next__(self) -> Any:
        return next(self._elements)

    def get_next(self) -> Any:
        """The next per-replica element; StopIteration at the end."""
        return next(self._elements)

    def get_next_as_optional(self) -> OptionalValue:
        """The next element as an `OptionalValue`, empty at the end."""
        try:
            return OptionalValue(next(self._elements), True)
        except StopIteration:
            return OptionalValue(None, False)

    @property
    def element_spec(self) -> Any:
        return self._element_spec()


class DistributedDataset(metaclass=abc.ABCMeta):
    """A dataset whose elements are per-replica values
    (tf.distribute.DistributedDataset; tf's own is one on TensorFlow).

    Made by `strategy.experimental_distribute_dataset`: each global batch
    is split into contiguous per-replica shards whose sizes differ by at
    most one (see `keras_dist._split`).

    ```python
    strategy = keras_dist.MirroredStrategy()
    dataset = strategy.experimental_distribute_dataset([(x[:64], y[:64]), (x[64:100], y[64:100])])
    for x_part, y_part in dataset:
        strategy.run(lambda a, b: keras.ops.sum(a), args=(x_part, y_part))
    ```
    """

    def __init__(
        self,
        batches: Callable[[], Iterable],
        to_replicas: Callable[[Any], Any],
        spec: Callable[[Any], Any] = None,
        buffer_size: int = 1,
    ):
        self._batches = batches  # makes a fresh pass over the data
        self._to_replicas = to_replicas
        self._spec = spec
        self._buffer_size = buffer_size

    def _elements(self) -> Iterator:
        for batch in self._batches():
            yield self._to_replicas(batch)

    def _buffered(self) -> Iterator:
        """The elements, each prepared (split and sent to the devices, which
        runs asynchronously) `buffer_size` elements before it is taken."""
        ahead: collections.deque = collections.deque()
        for element in self._elements():
            ahead.append(element)
            if len(ahead) > self._buffer_size - 1:
                yield ahead.popleft()
        while ahead:
            yield ahead.popleft()

    def __iter__(self) -> DistributedIterator:
        return DistributedIterator(self._buffered(), lambda: self.element_spec)

    @property
    def element_spec(self) -> Any:
        """The structure of an element: a `keras.KerasTensor` per array,
        with the shape one replica's component has (batch dimension None)."""
        if isinstance(self._batches, OnePass):  # look without losing the batch
            batch = self._batches.peek()
            first = None if batch is None else self._to_replicas(batch)
        else:
            first = next(self._elements(), None)
        if first is None:
            raise ValueError("element_spec of an empty distributed dataset: it has no element to describe.")
        return self._spec(first) if self._spec else first

    def reduce(self, initial_state: Any, reduce_fn: Callable[[Any, Any], Any]) -> Any:
        """Folds `reduce_fn(state, element)` over the per-replica elements."""
        state = initial_state
        for element in self._elements():
            state = reduce_fn(state, element)
        return state

    #: (the strategy that made this dataset, a function giving what
    #: `fit`/`evaluate`/`predict` train on in its place), as
    #: `keras_dist.strategies._arguments._trains_as` marks the engine's own distributed
    #: datasets (`keras_dist._hooks._distributed_input` reads both). The
    #: default strategy's maker is None (a model made outside any scope).
    _keras_dist_trains_as: tuple = (None, None)
    _count: Optional[Callable[[], Optional[int]]] = None

    def _made_by(
        self, strategy: Any, fit_source: Any = None, count: Optional[Callable[[], Optional[int]]] = None
    ) -> "DistributedDataset":
        """Records its maker, and what `fit` trains on: `fit_source` (a
        `tf.data` dataset each worker reads its own stream of) or this
        dataset's global batches. `count` says, when asked (at `fit`,
        eagerly: the dataset may be made while a `tf.function` traces),
        how many global batches a pass gives."""
        self._keras_dist_trains_as = (strategy, (lambda: self) if fit_source is None else (lambda: fit_source))
        self._count = count
        return self

    @property
    def num_global_batches(self) -> Optional[int]:
        """How many global batches a pass gives, where the source says (a
        list's length, a tf.data dataset's known cardinality); else None."""
        return None if self._count is None else self._count()

    def global_batches(self) -> Iterator:
        """A fresh pass over the global batches this dataset splits (what
        `fit(distributed_dataset)` trains on, as one device would)."""
        return (check_same_rows(batch) for batch in self._batches())


class DistributedDatasetsFromFunction(DistributedDataset):
    """Iterates per-replica batches made by `dataset_fn`, one per replica.

    One pipeline for the worker (PER_WORKER): replica ``r`` of step ``s``
    gets batch ``s * replicas + r`` of the dataset. One pipeline per
    replica (PER_REPLICA): replica ``r`` gets the next batch of its own.
    When the data runs out mid-step the remaining replicas get empty
    batches.
    """

    def __init__(
        self,
        batches: Callable[[], Iterable],
        num_replicas: int,
        combine: Callable[[list], Any],
        spec: Callable[[Any], Any] = None,
        buffer_size: int = 1,
        per_replica: Optional[list] = None,
    ):
        super().__init__(batches, lambda element: element, spec, buffer_size)
        self._num_replicas = num_replicas
        self._combine = combine
        self._per_replica = per_replica  # one batches() per replica (PER_REPLICA)

    def _elements(self) -> Iterator:
        return (self._combine(group) for group in self._groups())

    def global_batches(self) -> Iterator:
        """Each step's replica batches, concatenated in replica order: the
        global batch the step trains on."""
        return (concatenate_rows(group) for group in self._groups())

    def _groups(self) -> Iterator:
        """Each step's replica batches (fewer than the replicas at the end)."""
        if self._per_replica is not None:
            yield from self._per_replica_groups()
            return
        group = []
        for batch in self._batches():
            group.append(batch)
            if len(group) == self._num_replicas:
                yield group
                group = []
        if group:
            yield group

    def _per_replica_groups(self) -> Iterator:
        iterators = [iter(batches()) for batches in self._per_replica]
        while True:
            group, done = [], []
            for replica, iterator in enumerate(iterators):
                batch = next(iterator, _END)
                (done if batch is _END else group).append(replica if batch is _END else batch)
            if not group:
                return
            if done and done != list(range(len(group), len(iterators))):
                raise ValueError(
                    f"distribute_datasets_from_function (PER_REPLICA): the pipelines of "
                    f"replicas {done} ran out before those of later replicas; give "
                    "every replica's dataset the same number of batches (the last "
                    "replicas' may end one step early)."
                )
            yield group


def known_length(dataset: Any) -> Optional[int]:
    """How many batches `dataset` gives, if it says without being read
    (`len()`, or a tf.data dataset's known cardinality); else None.

    >>> known_length([1, 2, 3]), known_length(iter([1]))
    (3, None)
    """
    cardinality = getattr(dataset, "cardinality", None)
    if callable(cardinality) and hasattr(dataset, "element_spec"):
        try:
            count = int(cardinality())
        except (TypeError, ValueError):  # a graph tensor (inside tf.function): not known here
            return None
        return count if count >= 0 else None
    try:
        return len(dataset)
    except TypeError:
        return None


def concatenate_rows(batches: list) -> Any:
    """Batches of one structure joined along rows (NumPy).

    >>> import numpy as np
    >>> concatenate_rows([(np.zeros((2, 3)), np.ones(2)), (np.zeros((1, 3)), np.ones(1))])[0].shape
    (3, 3)
    """
    import keras

    return keras.tree.map_structure(lambda *parts: np.concatenate([np.asarray(p) for p in parts]), *batches)


def is_dataset_object(x: Any) -> bool:
    """A dataset already made (it has an `element_spec` and is not a
    function making one)."""
    return hasattr(x, "element_spec") and not callable(x)


def check_dataset_fn_result(result: Any, dataset_fn: Callable) -> Any:
    """`result` if it is a dataset (anything iterated for batches: a
    `tf.data.Dataset`, a `PyDataset`, a generator, a list of batches);
    data itself, the common slip, is one clear error (tf.keras'
    DatasetCreator refused a non-dataset too)."""
    name = getattr(dataset_fn, "__name__", type(dataset_fn).__name__)
    if result is None:
        what = "None (is a `return` missing?)"
    elif hasattr(result, "shape") and hasattr(result, "dtype") and not hasattr(result, "element_spec"):
        what = f"an array of shape {tuple(result.shape)}"
    elif isinstance(result, dict) or (
        isinstance(result, tuple) and result and all(hasattr(r, "shape") and hasattr(r, "dtype") for r in result)
    ):
        what = f"a {type(result).__name__} of arrays"
    elif isinstance(result, (str, bytes)) or not hasattr(result, "__iter__"):
        what = f"a value of type {type(result).__name__}"
    else:
        return result
    raise TypeError(
        f"The dataset function {name!r} returned {what}, not a dataset. It runs on "
        "each worker and returns batches that repeat: return "
        "tf.data.Dataset.from_tensor_slices((x, y)).batch(n).repeat() (or a "
        "generator of (x, y) batches), not the data itself."
    )
