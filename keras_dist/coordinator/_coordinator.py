"""The core of `ClusterCoordinator`: argument checks and the value types;
the scheduling itself is the adapter's (`create_coordinator`, `schedule`,
`fetch`, `join`, `done`, `create_per_worker_dataset`)."""

from __future__ import annotations

from typing import Any, Callable, Optional

from keras_dist.backends import get_adapter


class RemoteValue:
    """The result of a scheduled function, ready once it has run.

    `fetch()` blocks until then and returns it as host values (NumPy);
    `get()` is the same (tf's spelling for values already local).
    """

    def __init__(self, coordinator: "ClusterCoordinator", engine_value: Any):
        self._coordinator = coordinator
        self._engine_value = engine_value

    def fetch(self) -> Any:
        """Waits for the function and returns its result (raises its error)."""
        return get_adapter().fetch(self._coordinator._engine, self._engine_value)

    def get(self) -> Any:
        """The result, as `fetch()`."""
        return self.fetch()

    def __repr__(self) -> str:
        return f"RemoteValue({self._engine_value!r})"


class PerWorkerValues:
    """One value per worker (`create_per_worker_dataset`, and
    `iter()` of it): a scheduled function receives its worker's."""

    def __init__(self, values: Any):
        self._values = values

    def __repr__(self) -> str:
        return f"PerWorkerValues({self._values!r})"


class ClusterCoordinator:
    """Schedules functions on the workers of a `ParameterServerStrategy`.

    ```python
    coordinator = keras_dist.coordinator.ClusterCoordinator(strategy)
    per_worker_dataset = coordinator.create_per_worker_dataset(dataset_fn)
    iterator = iter(per_worker_dataset)
    losses = [coordinator.schedule(step_fn, args=(iterator,)) for _ in range(10)]
    coordinator.join()
    ```
    """

    def __init__(self, strategy: Any):
        from keras_dist.strategies._parameter_server import ParameterServerStrategy

        if not isinstance(strategy, ParameterServerStrategy):
            raise ValueError(
                "ClusterCoordinator takes a keras_dist.ParameterServerStrategy, "
                f"got {strategy!r}. Other strategies run steps themselves: call "
                "strategy.run(fn) instead."
            )
        existing = getattr(strategy, "_keras_dist_coordinator", None)
        if existing is not None:
            # tf: one coordinator per strategy; a second refers to the first.
            self.__dict__ = existing.__dict__
            return
        self._strategy = strategy
        self._engine = get_adapter().create_coordinator(strategy)
        strategy._keras_dist_coordinator = self

    @property
    def strategy(self) -> Any:
        return self._strategy

    def schedule(self, fn: Callable, args: Optional[tuple] = None, kwargs: Optional[dict] = None) -> RemoteValue:
        """Queues `fn(*args, **kwargs)` on a free worker; returns at once."""
        if not callable(fn):
            raise TypeError(f"ClusterCoordinator.schedule needs a callable, got {fn!r}.")
        if args is not None and not isinstance(args, (tuple, list)):
            raise TypeError(
                "ClusterCoordinator.schedule(fn, args=...) takes a tuple, got "
                f"{type(args).__name__}; for one argument write args=(value,)."
            )
        if kwargs is not None and not isinstance(kwargs, dict):
            raise TypeError(f"ClusterCoordinator.schedule(fn, kwargs=...) takes a dict, got {type(kwargs).__name__}.")
        engine_value = get_adapter().schedule(self._engine, fn, tuple(args or ()), dict(kwargs or {}))
        return RemoteValue(self, engine_value)

    def join(self) -> None:
        """Blocks until every scheduled function has run."""
        get_adapter().join(self._engine)

    def done(self) -> bool:
        """Whether every scheduled function has run."""
        return get_adapter().done(self._engine)

    def create_per_worker_dataset(self, dataset_fn: Callable) -> Any:
        """A dataset on every worker, made there by `dataset_fn` (called
        with a `keras_dist.InputContext` if it takes an argument: one input
        pipeline, this worker's, as tf.distribute does). On TensorFlow a
        `tf.data.Dataset` is taken too: tf copies it to every worker."""
        from keras_dist._input import is_dataset_object
        from keras_dist.strategies._parameter_server import call_dataset_fn

        if is_dataset_object(dataset_fn):
            return get_adapter().create_per_worker_dataset(self._engine, dataset_fn)
        if not callable(dataset_fn):
            raise TypeError(
                "create_per_worker_dataset takes a function that makes the "
                f"dataset (it runs on each worker), got {type(dataset_fn).__name__}."
                " Wrap it: coordinator.create_per_worker_dataset(lambda: dataset)."
            )
        from keras_dist._input import InputContext

        def per_worker_dataset_fn():
            return call_dataset_fn(dataset_fn, InputContext(1, 0, 1))

        return get_adapter().create_per_worker_dataset(self._engine, per_worker_dataset_fn)

    def fetch(self, val: Any) -> Any:
        """The results of a nest of `RemoteValue`s (others pass unchanged)."""
        import keras

        def one(v):
            return v.fetch() if isinstance(v, RemoteValue) else v

        return keras.tree.map_structure(one, val)
