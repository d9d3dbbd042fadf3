"""`backends/jax/_ps_pickling`: a scheduled function's references to the
strategy's own objects become tokens, and what cannot travel is one clear
error. Unit tests on a stand-in cluster (no Ray actor is started)."""

import itertools
import pickle

import numpy as np
import pytest

import keras
import keras_dist
from conftest import BACKEND

pytestmark = pytest.mark.skipif(BACKEND != "jax", reason="the JAX parameter-server engine's pickling")


class _Cluster:
    """What `_ps_pickling` reads of `_parameter_servers.Cluster`."""

    num_workers = 2

    def __init__(self, strategy, owned=()):
        self.strategy_ref = lambda: strategy
        self._owned = {id(v) for v in owned}
        self.variables, self.vid_of, self.models, self.datasets = [], {}, {}, {}
        self._ids = itertools.count(7)
        self.started = 0
        self.registered = []

    def owns(self, variable):
        return id(variable) in self._owned

    def start(self):
        self.started += 1

    def register_model(self, model):
        mid = next(self._ids)
        layout = []
        for variable in model.variables:
            vid = len(self.variables)
            self.variables.append(variable)
            self.vid_of[id(variable)] = vid
            layout.append((vid, None))
        self.models[id(model)] = (mid, model, layout, None, b"")
        self.registered.append(model)
        return mid

    def register_optimizer(self, optimizer):
        return 99


def _model():
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    return model


def _loads(payload, resolve):
    class Unpickler(pickle.Unpickler):
        def persistent_load(self, pid):
            return resolve(pid)

    import io

    return Unpickler(io.BytesIO(payload)).load()


def test_the_strategy_models_optimizers_variables_and_iterators_travel_as_tokens():
    from keras_dist.backends.jax import _ps_pickling

    strategy = object()
    model = _model()
    cluster = _Cluster(strategy, owned=model.variables)
    dataset = _ps_pickling.create_per_worker_dataset(cluster, lambda: [1, 2, 3])
    iterator = iter(dataset)
    optimizer = keras.optimizers.SGD()
    kernel = model.variables[0]
    marker = np.arange(3.0)

    def fn(it, m, opt, var, s, data):
        return data

    payload, needs = _ps_pickling.pickle_call(cluster, fn, (iterator, model, optimizer, kernel, strategy), {"data": marker})
    mid = cluster.models[id(model)][0]
    dsid = dataset._dataset_id
    assert cluster.started == 1 and list(cluster.datasets) == [dsid]
    # the model once (its variable's token needs it too), then the dataset
    assert needs == [("dataset", dsid), ("model", mid)]
    seen = []
    loaded_fn, args, kwargs = _loads(payload, lambda pid: seen.append(pid) or pid)
    assert seen == [("iterator", iterator._iterator_id, dsid), ("model", mid), ("optimizer", 99), ("variable", mid, 0), ("strategy",)]
    assert args == tuple(seen) and np.array_equal(kwargs["data"], marker)
    assert loaded_fn(*args, **kwargs) is kwargs["data"]


def test_objects_that_cannot_travel_are_one_clear_error_each():
    from keras_dist.backends.jax import _ps_pickling

    model = _model()
    metric = keras.metrics.Mean()
    stray = keras.Variable(np.zeros(2))
    cluster = _Cluster(object(), owned=[*model.variables, *metric.variables, stray])
    other = _Cluster(object())
    dataset = _ps_pickling.create_per_worker_dataset(cluster, lambda: [1])
    cases = [
        (dataset, TypeError, "iter\\(per_worker_dataset\\)"),
        (iter(_ps_pickling.create_per_worker_dataset(other, lambda: [1])), ValueError, "another ClusterCoordinator"),
        (stray, ValueError, "belongs to no model"),
        (metric, ValueError, "metrics live on the coordinator"),
    ]
    for obj, error, message in cases:
        with pytest.raises(error, match=message):
            _ps_pickling.pickle_call(cluster, lambda x: x, (obj,), {})
    assert cluster.registered == []  # nothing registered on the way to an error
    # a variable the strategy does not own (made outside its scope) travels as itself
    outside = keras.Variable(np.ones(2))
    payload, needs = _ps_pickling.pickle_call(cluster, lambda x: x, (outside,), {})
    assert needs == []


def test_a_per_worker_iterator_is_read_on_the_workers_only_and_datasets_are_functions():
    from keras_dist.backends.jax import _ps_pickling

    cluster = _Cluster(object())
    iterator = iter(_ps_pickling.create_per_worker_dataset(cluster, lambda: [1]))
    with pytest.raises(TypeError, match="read on the workers"):
        next(iterator)
    with pytest.raises(TypeError, match="takes a function"):
        _ps_pickling.create_per_worker_dataset(cluster, [1, 2])
    assert "workers=2" in repr(iterator)
    coordinator = keras_dist.coordinator.ClusterCoordinator.__new__(keras_dist.coordinator.ClusterCoordinator)
    with pytest.raises(TypeError, match="cannot use the ClusterCoordinator"):
        _ps_pickling.pickle_call(cluster, lambda c: c, (coordinator,), {})
