"""Custom training loops: strategy.run / reduce / gather, distributed
datasets, replica context and loss helpers, against single-device runs and
hand-computed values.

Input is lists of NumPy batches, which need nothing but the backend in use;
the same tests on tf.data input are marked `needs_tensorflow` (on JAX they
run where tensorflow is installed too: `make test-jax-with-tensorflow`)."""

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import FEATURES, make_data
from conftest import BACKEND


def _numpy_batches(arrays, batch_size):
    """`arrays` (an array or a tuple of arrays) as a list of global batches."""
    if isinstance(arrays, tuple):
        return list(zip(*(_numpy_batches(a, batch_size) for a in arrays)))
    return [arrays[i : i + batch_size] for i in range(0, len(arrays), batch_size)]


def _tf_data(arrays, batch_size):
    import tensorflow as tf

    return tf.data.Dataset.from_tensor_slices(arrays).batch(batch_size)


#: How a test builds its input: make_input(arrays, batch_size) -> dataset.
INPUTS = [
    pytest.param(_numpy_batches, id="numpy"),
    pytest.param(_tf_data, id="tf.data", marks=pytest.mark.needs_tensorflow),
]


def _model(seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [keras.Input((FEATURES,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)]
    )


def _custom_loop(strategy, model, optimizer, dataset):
    """The reference guide's loop, per backend; returns the step losses."""
    loss_object = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")
    distributed = strategy.experimental_distribute_dataset(dataset)
    if BACKEND == "tensorflow":
        import tensorflow as tf

        def train_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                predictions = model(features, training=True)
                loss = keras_dist.compute_average_loss(loss_object(labels, predictions))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def distributed_train_step(inputs):
            per_replica_losses = strategy.run(train_step, args=(inputs,))
            return strategy.reduce(keras_dist.ReduceOp.SUM, per_replica_losses, axis=None)

        return [float(distributed_train_step(inputs)) for inputs in distributed]

    import jax

    optimizer.build(model.trainable_variables)
    state = (
        [v.value for v in model.trainable_variables],
        [v.value for v in model.non_trainable_variables],
        [v.value for v in optimizer.variables],
    )

    def train_step(state, inputs):
        trainable, non_trainable, optimizer_state = state
        features, labels = inputs

        def loss_fn(trainable):
            predictions, new_non_trainable = model.stateless_call(
                trainable, non_trainable, features, training=True
            )
            loss = keras_dist.compute_average_loss(loss_object(labels, predictions))
            return loss, new_non_trainable

        (loss, non_trainable), grads = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, grads, trainable)
        return (trainable, non_trainable, optimizer_state), loss

    losses = []
    for inputs in distributed:
        state, per_replica_losses = strategy.run(train_step, args=(state, inputs))
        losses.append(float(strategy.reduce("SUM", per_replica_losses, axis=None)))
    for leaf in jax.tree_util.tree_leaves(state[1]):  # BatchNorm statistics: one value, not per-replica
        assert not isinstance(leaf, keras_dist.PerReplica), leaf
    for variables, values in zip((model.trainable_variables, model.non_trainable_variables, optimizer.variables), state):
        for variable, value in zip(variables, values):
            variable.assign(value)
    return losses


CASES = {"even-2000-64": (2000, 64), "partial-1003-64": (1003, 64), "batch10-partial": (203, 10)}


@pytest.mark.parametrize("num_replicas", [1, 2, 4])
@pytest.mark.parametrize("case", sorted(CASES))
def test_custom_loop_matches_single_device(mirrored, case, num_replicas):
    _check_custom_loop(mirrored, case, num_replicas, _numpy_batches)


@pytest.mark.needs_tensorflow
@pytest.mark.parametrize("case", ["batch10-partial", "partial-1003-64"])
def test_custom_loop_on_tf_data_matches_single_device(mirrored, case):
    _check_custom_loop(mirrored, case, 4, _tf_data)


def _check_custom_loop(mirrored, case, num_replicas, make_input):
    num_samples, batch_size = CASES[case]
    x, y = make_data(num_samples)
    dataset = make_input((x, y), batch_size)

    reference = _model()
    expected = _custom_loop(keras_dist.get_strategy(), reference, keras.optimizers.Adam(0.01), dataset)

    strategy = mirrored(num_replicas)
    with strategy.scope():
        model = _model()
        model.set_weights(_model().get_weights())  # the initial weights of `reference`
        optimizer = keras.optimizers.Adam(0.01)
    losses = _custom_loop(strategy, model, optimizer, dataset)

    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=1e-6)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _recurrent_model(layer, seed=1):
    keras.utils.set_random_seed(seed)
    return keras.Sequential([keras.Input((5, 3)), getattr(keras.layers, layer)(6), keras.layers.Dense(1)])


#: Every strategy of one process a custom loop runs under (the default
#: strategy is the reference).
_LOOP_STRATEGIES = {
    "mirrored-4": lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
    "central-storage-4": lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(4)]),
}


@pytest.mark.parametrize(
    "layer, strategy_name",
    [(layer, "mirrored-4") for layer in ("LSTM", "GRU", "SimpleRNN")]
    + [("LSTM", "one-device"), ("LSTM", "central-storage-4")],
)
def test_recurrent_layers_inside_run_train_as_one_device(layer, strategy_name):
    """LSTM, GRU and SimpleRNN called inside `strategy.run` (JAX refused
    them: shard_map typed the scan's zero initial state as equal on every
    replica and its output state as varying), on 23 rows in batches of 10
    (uneven shards, a partial last batch), with SGD: the losses and weights
    of one device."""
    rng = np.random.default_rng(3)
    x = rng.normal(size=(23, 5, 3)).astype("float32")
    y = (x[:, :, 0].sum(axis=1, keepdims=True) > 0).astype("float32")
    dataset = _numpy_batches((x, y), 10)

    reference = _recurrent_model(layer)
    expected = _custom_loop(keras_dist.get_strategy(), reference, keras.optimizers.SGD(0.1), dataset)

    strategy = _LOOP_STRATEGIES[strategy_name]()
    with strategy.scope():
        model = _recurrent_model(layer)
        optimizer = keras.optimizers.SGD(0.1)
    losses = _custom_loop(strategy, model, optimizer, dataset)

    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=1e-6)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _batch_norm_model(seed=1, synchronized=False):
    keras.utils.set_random_seed(seed)
    return keras.Sequential(
        [
            keras.Input((FEATURES,)),
            keras.layers.Dense(16, use_bias=False),  # no bias before BatchNorm: its gradient is 0
            keras.layers.BatchNormalization(synchronized=synchronized),
            keras.layers.ReLU(),
            keras.layers.Dense(1),
        ]
    )


@pytest.mark.parametrize("synchronized", [False, True])
def test_custom_loop_with_batch_norm_matches_single_device(mirrored, synchronized):
    """BatchNormalization inside run normalises with the global batch's
    moments (uneven shards of 10 rows over 4 replicas included), its
    moving statistics come back as one value, and the weights match one
    device (`synchronized=True`, Keras' request for exactly this, too;
    written in the scope, where keras_dist takes it on JAX as well: plain
    Keras on JAX refuses it in the constructor)."""
    x, y = make_data(63)
    dataset = _numpy_batches((x, y), 10)

    reference = _batch_norm_model()  # one device: nothing to synchronize
    expected = _custom_loop(keras_dist.get_strategy(), reference, keras.optimizers.SGD(0.1), dataset)
    strategy = mirrored(4)
    with strategy.scope():
        model = _batch_norm_model(synchronized=synchronized)
        assert model.layers[1].synchronized is synchronized
        model.set_weights(reference.get_weights() and _batch_norm_model().get_weights())
        optimizer = keras.optimizers.SGD(0.1)
    losses = _custom_loop(strategy, model, optimizer, dataset)

    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=1e-6)
    assert len(reference.non_trainable_variables) == 2
    for a, b in zip(reference.get_weights(), model.get_weights()):  # moving mean/variance included
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _ten_rows():
    return np.arange(10, dtype="float32").reshape(10, 1)


def _scalar(value):
    return float(np.asarray(value).reshape(()))


def _replica_values(strategy, value):
    return [np.asarray(v) for v in strategy.experimental_local_results(value)]


def test_run_reduce_gather_local_results_by_hand(mirrored):
    strategy = mirrored(4)
    x = _ten_rows()
    (batch,) = list(strategy.experimental_distribute_dataset([x]))
    assert isinstance(batch, keras_dist.PerReplica)
    shards = [x[0:3], x[3:6], x[6:8], x[8:10]]
    for got, want in zip(_replica_values(strategy, batch), shards):
        np.testing.assert_array_equal(got, want)

    doubled = strategy.run(lambda rows: rows * 2.0, args=(batch,))
    np.testing.assert_array_equal(np.asarray(strategy.gather(doubled, axis=0)), x * 2)
    # a negative axis counts from the end, as in tf (TensorFlow's own gather failed in its graph)
    pairs = strategy.run(lambda rows: rows[:2] * 2.0, args=(batch,))  # (2, 1) on every replica
    side_by_side = np.concatenate([shard[:2] * 2 for shard in shards], axis=-1)  # (2, 4)
    np.testing.assert_array_equal(np.asarray(strategy.gather(pairs, axis=-1)), side_by_side)
    assert _scalar(strategy.reduce("SUM", doubled, axis=0)) == pytest.approx(90.0)
    assert _scalar(strategy.reduce("MEAN", doubled, axis=0)) == pytest.approx(9.0)

    sums = strategy.run(lambda rows: keras.ops.sum(rows), args=(batch,))
    assert [float(v) for v in _replica_values(strategy, sums)] == [3.0, 12.0, 13.0, 17.0]
    assert float(strategy.reduce(keras_dist.ReduceOp.SUM, sums, axis=None)) == pytest.approx(45.0)
    assert float(strategy.reduce(keras_dist.ReduceOp.MEAN, sums, axis=None)) == pytest.approx(45.0 / 4)

    ids = strategy.run(lambda: keras.ops.convert_to_tensor(keras_dist.get_replica_context().replica_id_in_sync_group))
    assert [int(v) for v in _replica_values(strategy, ids)] == [0, 1, 2, 3]


def test_all_reduce_and_all_gather_by_hand(mirrored):
    strategy = mirrored(4)
    x = _ten_rows()
    (batch,) = list(strategy.experimental_distribute_dataset([x]))

    def step(rows):
        context = keras_dist.get_replica_context()
        assert context is not None and context.num_replicas_in_sync == 4
        assert not keras_dist.in_cross_replica_context()
        local = keras.ops.sum(rows)
        return context.all_reduce("SUM", local), context.all_reduce("MEAN", local)

    total, mean = strategy.run(step, args=(batch,))
    assert [float(v) for v in _replica_values(strategy, total)] == [45.0] * 4
    assert [float(v) for v in _replica_values(strategy, mean)] == [45.0 / 4] * 4

    even = np.arange(8, dtype="float32").reshape(8, 1)
    (even_batch,) = list(strategy.experimental_distribute_dataset([even]))
    gathered = strategy.run(
        lambda rows: keras_dist.get_replica_context().all_gather(rows, axis=0), args=(even_batch,)
    )
    for value in _replica_values(strategy, gathered):
        np.testing.assert_array_equal(value, even)


@pytest.mark.parametrize("make_input", INPUTS)
def test_distribute_datasets_from_function(mirrored, make_input):
    strategy = mirrored(4)
    seen = []
    x = np.arange(40, dtype="float32").reshape(40, 1)

    def dataset_fn(context):
        seen.append(context)
        per_replica = context.get_per_replica_batch_size(16)
        return make_input(x, per_replica)

    batches = list(strategy.distribute_datasets_from_function(dataset_fn))
    (context,) = seen
    assert isinstance(context, keras_dist.InputContext)
    assert (context.num_input_pipelines, context.input_pipeline_id, context.num_replicas_in_sync) == (1, 0, 4)
    assert context.get_per_replica_batch_size(16) == 4
    assert len(batches) == 3  # 10 batches of 4 rows over 4 replicas
    rows = [np.asarray(v) for b in batches for v in strategy.experimental_local_results(b)]
    assert [len(r) for r in rows] == [4] * 10 + [0, 0]
    np.testing.assert_array_equal(np.concatenate(rows), x)
    with pytest.raises(ValueError, match="not divisible"):
        context.get_per_replica_batch_size(10)


def test_compute_average_loss_and_regularization(mirrored):
    strategy = mirrored(4)
    x = _ten_rows()
    weights = np.linspace(0.5, 1.5, 10).astype("float32").reshape(10, 1)
    (batch,) = list(strategy.experimental_distribute_dataset([(x, weights)]))

    def step(inputs):
        rows, w = inputs
        per_example = keras.ops.squeeze(rows, -1)
        return (
            keras_dist.compute_average_loss(per_example),
            keras_dist.compute_average_loss(per_example, global_batch_size=20),
            keras_dist.compute_average_loss(per_example, sample_weight=keras.ops.squeeze(w, -1)),
            keras_dist.scale_regularization_loss(keras.ops.convert_to_tensor(2.0)),
        )

    plain, fixed, weighted, regularization = strategy.run(step, args=(batch,))
    assert float(strategy.reduce("SUM", plain, axis=None)) == pytest.approx(4.5)
    assert float(strategy.reduce("SUM", fixed, axis=None)) == pytest.approx(45 / 20)
    assert float(strategy.reduce("SUM", weighted, axis=None)) == pytest.approx(
        float((x[:, 0] * weights[:, 0]).sum() / 10), rel=1e-6
    )
    assert [float(v) for v in _replica_values(strategy, regularization)] == [0.5] * 4
    # outside any strategy: divides by the local batch
    assert float(keras_dist.compute_average_loss(np.array([1.0, 2.0, 6.0], "float32"))) == pytest.approx(3.0)


def test_scale_regularization_loss_sums_a_list_as_tf_does(mirrored):
    """tf.nn.scale_regularization_loss adds up a list of losses (model.losses)
    and sums a tensor before dividing; keras_dist returned the list itself,
    divided term by term (a data gradient scaled silently on TF, jax.grad
    failing on JAX)."""
    strategy = mirrored(4)
    terms = [keras.ops.convert_to_tensor(1.0), keras.ops.convert_to_tensor(3.0)]

    def step():
        return (
            keras_dist.scale_regularization_loss(terms),
            keras_dist.scale_regularization_loss(tuple(terms)),
            keras_dist.scale_regularization_loss(keras.ops.convert_to_tensor([1.5, 2.5])),
        )

    as_list, as_tuple, as_vector = strategy.run(step)
    for value in (as_list, as_tuple, as_vector):
        assert [float(v) for v in _replica_values(strategy, value)] == [1.0] * 4
    if BACKEND == "tensorflow":  # tf's own, in the same replica context: the oracle
        import tensorflow as tf

        theirs = strategy.run(lambda: tf.nn.scale_regularization_loss([tf.constant(1.0), tf.constant(3.0)]))
        assert [float(v) for v in _replica_values(strategy, theirs)] == [1.0] * 4
    with pytest.raises(ValueError, match="empty list"):
        strategy.run(lambda: keras_dist.scale_regularization_loss([]))


@pytest.mark.parametrize("reduction", ["sum_over_batch_size", "mean"])
def test_averaging_loss_in_replica_context_is_an_error(mirrored, reduction):
    strategy = mirrored(2)
    loss = keras.losses.MeanSquaredError(reduction=reduction)
    (batch,) = list(strategy.experimental_distribute_dataset([_ten_rows()]))
    with pytest.raises(ValueError, match=r"reduction='none'.*compute_average_loss"):
        strategy.run(lambda rows: loss(rows, rows * 0.5), args=(batch,))


def _squared_errors(rows):
    """Each row's mean squared error of `rows` against `rows * 0.5`."""
    return np.mean((rows - rows * 0.5) ** 2, axis=-1)


@pytest.mark.parametrize("reduction", ["sum", "none"])
def test_summing_losses_are_allowed(mirrored, reduction):
    """A loss that sums (or reduces nothing) is taken in replica context and
    gives each replica's own value over its rows (5 of the 10 each)."""
    strategy = mirrored(2)
    loss = keras.losses.MeanSquaredError(reduction=reduction)
    (batch,) = list(strategy.experimental_distribute_dataset([_ten_rows()]))
    values = _replica_values(strategy, strategy.run(lambda rows: loss(rows, rows * 0.5), args=(batch,)))
    shards = [_squared_errors(_ten_rows()[:5]), _squared_errors(_ten_rows()[5:])]
    expected = [shard.sum() for shard in shards] if reduction == "sum" else shards
    assert len(values) == 2
    for value, want in zip(values, expected):
        np.testing.assert_allclose(value, want, rtol=1e-6)


def test_averaging_loss_allowed_with_one_replica(mirrored):
    """With one replica the replica's batch is the global batch: averaging
    is taken, and gives the global mean."""
    strategy = mirrored(1)
    loss = keras.losses.MeanSquaredError()
    (batch,) = list(strategy.experimental_distribute_dataset([_ten_rows()]))
    (value,) = _replica_values(strategy, strategy.run(lambda rows: loss(rows, rows * 0.5), args=(batch,)))
    np.testing.assert_allclose(value, _squared_errors(_ten_rows()).mean(), rtol=1e-6)


def test_default_strategy_is_a_pass_through():
    strategy = keras_dist.get_strategy()
    assert strategy.run(lambda a, b: a + b, args=(1, 2)) == 3
    assert strategy.reduce("SUM", 1.0, axis=None) == 1.0
    assert strategy.experimental_local_results(5) == (5,)
    assert keras_dist.get_replica_context().num_replicas_in_sync == 1


def test_bad_dataset_input(mirrored):
    x = _ten_rows()
    with pytest.raises(ValueError, match="not arrays of samples"):
        mirrored(2).experimental_distribute_dataset((x, x))


@pytest.mark.skipif(BACKEND != "jax", reason="JAX-specific: shard_map, jit, check_vma")
class TestJaxRun:
    def test_replicated_results_are_plain_arrays_and_per_replica_results_are_not(self, mirrored):
        import jax

        strategy = mirrored(4)
        (batch,) = list(strategy.experimental_distribute_dataset([_ten_rows()]))
        weights = jax.numpy.ones((1,))
        same, different = strategy.run(lambda w, rows: (w * 3.0, keras.ops.sum(rows * w)), args=(weights, batch))
        assert isinstance(same, jax.Array) and not isinstance(same, keras_dist.PerReplica)
        assert same.sharding.is_fully_replicated
        assert isinstance(different, keras_dist.PerReplica)

    def test_summing_gradients_again_is_refused(self, mirrored):
        import jax

        strategy = mirrored(4)
        (batch,) = list(strategy.experimental_distribute_dataset([_ten_rows()]))

        def step(w, rows):
            grads = jax.grad(lambda w: keras_dist.compute_average_loss((rows * w)[:, 0]))(w)
            return keras_dist.get_replica_context().all_reduce("SUM", grads)

        with pytest.raises(ValueError, match="already summed over replicas by autodiff"):
            strategy.run(step, args=(jax.numpy.ones((1,)), batch))

    def test_gradients_are_aggregated_exactly_once(self, mirrored):
        import jax

        strategy = mirrored(4)
        x = _ten_rows()
        (batch,) = list(strategy.experimental_distribute_dataset([x]))
        grads = strategy.run(
            lambda w, rows: jax.grad(lambda w: keras_dist.compute_average_loss((rows * w)[:, 0]))(w),
            args=(jax.numpy.ones((1,)), batch),
        )
        np.testing.assert_allclose(np.asarray(grads), [x.mean()], rtol=1e-6)

    def test_run_inside_jit_compiles_once(self, mirrored):
        import jax

        strategy = mirrored(4)
        traces = []

        def step(w, rows):
            traces.append(1)
            return w + keras.ops.mean(rows), keras.ops.sum(rows)

        @jax.jit
        def jitted(w, batch):
            w, sums = strategy.run(step, args=(w, batch))
            return w, strategy.reduce("SUM", sums, axis=None)

        w = jax.numpy.zeros(())
        x = np.arange(12, dtype="float32").reshape(12, 1)
        batches = list(strategy.experimental_distribute_dataset([x[:8], x[2:10], x[1:9], x[4:]]))
        totals = []
        for batch in batches:
            w, total = jitted(w, batch)
            totals.append(float(total))
            if len(totals) == 2:  # from here on `w` is the step's own output
                compiled = jitted._cache_size()
                traced = len(traces)
        assert totals == [28.0, 44.0, 36.0, 60.0]
        assert jitted._cache_size() == compiled and len(traces) == traced


@pytest.mark.parametrize("make_input", INPUTS)
def test_distributed_datasets_can_be_read_again(mirrored, make_input):
    strategy = mirrored(2)
    x = _ten_rows()
    dataset = make_input(x, 4)
    distributed = strategy.experimental_distribute_dataset(dataset)
    assert len(list(distributed)) == 3 and len(list(distributed)) == 3
    from_function = strategy.distribute_datasets_from_function(lambda context: dataset)
    assert len(list(from_function)) == 2 and len(list(from_function)) == 2


@pytest.mark.needs_tensorflow
def test_default_strategy_yields_batches_the_backend_takes():
    import tensorflow as tf

    dataset = _tf_data(_ten_rows(), 4)
    batches = list(keras_dist.get_strategy().experimental_distribute_dataset(dataset))
    assert len(batches) == 3
    expected = np.ndarray if BACKEND == "jax" else tf.Tensor
    assert all(isinstance(batch, expected) for batch in batches)


def test_options_are_refused_not_ignored(mirrored):
    """Options keras_dist does not carry out raise, naming the fix; the
    defaults pass."""
    strategy = mirrored(2)
    x = np.ones((4, 3), "float32")
    assert list(strategy.experimental_distribute_dataset([x], options=keras_dist.InputOptions()))
    with pytest.raises(NotImplementedError, match=r"experimental_fetch_to_device=False\) cannot be carried out"):
        strategy.experimental_distribute_dataset([x], keras_dist.InputOptions(experimental_fetch_to_device=False))
    with pytest.raises(TypeError, match="takes a keras_dist.RunOptions"):
        strategy.run(lambda: 1.0, options=object())
    with pytest.raises(TypeError, match="takes a keras_dist.InputOptions"):
        strategy.distribute_datasets_from_function(lambda context: [x], options="fetch")


def test_run_args_must_be_a_tuple(mirrored):
    strategy = mirrored(2)
    for batch in strategy.experimental_distribute_dataset([np.ones((4, 3), "float32")]):
        with pytest.raises(TypeError, match=r"args=\(value,\)"):
            strategy.run(lambda value: value, args=batch)


def test_run_kwargs_and_per_replica_arguments_are_checked(mirrored):
    """kwargs that are not a dict, and a PerReplica with another number of
    values than the replicas: one clear error each, before the function runs
    (they were a raw dict-update TypeError, and on TensorFlow a PerReplica
    of 2 values ran on 4 replicas without a word)."""
    strategy = mirrored(4)
    called = []
    with pytest.raises(TypeError, match="kwargs=.*takes a dict.*got list"):
        strategy.run(lambda **kw: called.append(kw), kwargs=[1, 2])
    two = keras_dist.PerReplica((np.ones(2, "float32"), np.ones(2, "float32")))
    with pytest.raises(ValueError, match="PerReplica of 2 values on a strategy of 4 replicas"):
        strategy.run(lambda value: called.append(value), args=(two,))
    with pytest.raises(ValueError, match="PerReplica of 2 values"):
        strategy.run(lambda value=None: called.append(value), kwargs={"value": [two]})
    assert not called


def test_compute_average_loss_checks_the_sample_weight_shape(mirrored):
    """A sample_weight that does not line up with the per-example losses
    (it broadcast to a (4, 4) or failed deep in the engine); a (batch, 1)
    weight is taken for (batch,) losses, as tf does."""
    strategy = mirrored(2)

    def loss_with(weight):
        return strategy.run(
            lambda: keras_dist.compute_average_loss(keras.ops.ones((4,)), sample_weight=weight, global_batch_size=8)
        )

    with pytest.raises(ValueError, match=r"sample_weight of shape \(3,\).*\(4,\)"):
        loss_with(keras.ops.ones((3,)))
    each = strategy.experimental_local_results(loss_with(keras.ops.full((4, 1), 0.5)))
    assert [float(v) for v in each] == pytest.approx([0.25] * len(each))  # 4 x 0.5 / 8


def test_datasets_from_function_with_several_workers_refuses_what_it_cannot_read(mirrored, monkeypatch):
    """With several workers (a 2-worker job reads one pipeline per worker:
    tests/test_multi_worker.py), PER_REPLICA is refused before `dataset_fn`
    runs, and a `dataset_fn` that returns no tf.data dataset (whose
    element_spec gives the empty batch a worker without data sends) is
    refused with the fix."""
    import keras_dist

    strategy = mirrored(2)
    monkeypatch.setattr(type(strategy.extended), "num_workers", property(lambda self: 2))
    called = []
    per_replica = keras_dist.InputOptions(experimental_replication_mode=keras_dist.InputReplicationMode.PER_REPLICA)
    with pytest.raises(NotImplementedError, match="PER_REPLICA and several workers.*PER_WORKER"):
        strategy.distribute_datasets_from_function(lambda context: called.append(context), options=per_replica)
    assert not called  # refused before the user's function ran
    with pytest.raises(NotImplementedError, match="several workers takes a tf.data.Dataset.*got list"):
        strategy.distribute_datasets_from_function(lambda context: [np.ones((2, 3), "float32")])


@pytest.mark.skipif(BACKEND != "jax", reason="JAX compiles run's function per call signature")
def test_run_keeps_a_bounded_cache_of_compiled_functions(mirrored):
    from keras_dist.backends.jax import _replica

    strategy = mirrored(2)
    batch = next(iter(strategy.experimental_distribute_dataset([np.ones((4, 3), "float32")])))
    for index in range(_replica._RUN_CACHE_SIZE + 6):  # a new function each step
        strategy.run(lambda value, scale=float(index): value * scale, args=(batch,))
    assert len(_replica._run_cache) == _replica._RUN_CACHE_SIZE


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a tf.function iterating tf's distributed dataset")
def test_iterating_a_distributed_dataset_inside_a_tf_function():
    """`iter(dist_dataset)` and a `for` loop over it inside a `tf.function`
    (tensorflow.org's custom-training tutorial does both) on 4 simulated
    devices: it waited forever for one of TF's inter-op threads (one per
    core; plain tf.distribute too); simulate_cpu_devices gives the pool 2
    more than devices. Run in a thread so a regression fails here instead of
    hanging."""
    import threading

    import tensorflow as tf

    strategy = keras_dist.MirroredStrategy()
    assert strategy.num_replicas_in_sync == 4
    dataset = tf.data.Dataset.from_tensor_slices(np.arange(32, dtype="float32").reshape(16, 2)).batch(8)
    distributed = strategy.experimental_distribute_dataset(dataset)

    @tf.function
    def first_batch():
        batch = next(iter(distributed))
        return strategy.reduce("SUM", strategy.run(tf.reduce_sum, args=(batch,)), axis=None)

    @tf.function
    def every_batch():
        total = tf.constant(0.0)
        for batch in distributed:
            total += strategy.reduce("SUM", strategy.run(tf.reduce_sum, args=(batch,)), axis=None)
        return total

    results = {}
    thread = threading.Thread(
        target=lambda: results.update(first=float(first_batch()), every=float(every_batch())), daemon=True
    )
    thread.start()
    thread.join(timeout=120)
    assert not thread.is_alive(), "iterating the distributed dataset inside tf.function hangs"
    assert results == {"first": float(np.arange(16).sum()), "every": float(np.arange(32).sum())}


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.function is TensorFlow's")
@pytest.mark.parametrize("strategy_name", list(_LOOP_STRATEGIES))
@pytest.mark.parametrize("outer", ["eager", "tf.function"])
def test_a_tf_function_given_to_run_trains_as_one_device(strategy_name, outer):
    """A `tf.function` step given to `strategy.run` (tf-keras's
    ctl_correctness_test does it, called eagerly or from another
    tf.function): tf.distribute runs its Python function on every replica
    inside one clone of it; keras_dist ran the function itself per replica,
    and `apply_gradients` inside failed ("merge_call called while defining
    a new graph"), under every strategy. Three steps on 23 rows in batches
    of 10 (a partial last batch), SGD: one device's losses and weights."""
    import tensorflow as tf

    x, y = make_data(23)
    batches = _numpy_batches((x, y), 10)
    loss_object = keras.losses.BinaryCrossentropy(from_logits=True, reduction="none")

    def train(strategy, model, optimizer):
        @tf.function
        def step_fn(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                loss = keras_dist.compute_average_loss(loss_object(labels, model(features, training=True)))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        def step(inputs):
            return strategy.reduce("SUM", strategy.run(step_fn, args=(inputs,)), axis=None)

        step = tf.function(step) if outer == "tf.function" else step
        return [float(step(inputs)) for inputs in strategy.experimental_distribute_dataset(batches)]

    reference = _model()
    expected = train(keras_dist.get_strategy(), reference, keras.optimizers.SGD(0.1))
    strategy = _LOOP_STRATEGIES[strategy_name]()
    with strategy.scope():
        model = _model()
        optimizer = keras.optimizers.SGD(0.1)
    losses = train(strategy, model, optimizer)
    np.testing.assert_allclose(losses, expected, atol=1e-6, rtol=1e-6)
    for a, b in zip(reference.get_weights(), model.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=0)


def _jax_state_step(strategy, model, optimizer, outer_jit):
    """keras-io's JAX step (the variables' values in, the new ones out; MSE
    averaged over the global batch) given to `strategy.run`, with a
    `jax.jit` around `run` or not."""
    import jax

    loss_fn = keras.losses.MeanSquaredError(reduction="none")

    def compute_loss(trainable, non_trainable, x, y):
        y_pred, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return keras_dist.compute_average_loss(loss_fn(y, y_pred)), non_trainable

    gradients = jax.value_and_grad(compute_loss, has_aux=True)

    def train_step(state, data):
        trainable, non_trainable, optimizer_variables = state
        (loss, non_trainable), grads = gradients(trainable, non_trainable, *data)
        trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
        return loss, (trainable, non_trainable, optimizer_variables)

    step = lambda state, data: strategy.run(train_step, args=(state, data))  # noqa: E731
    return jax.jit(step) if outer_jit else step


@pytest.mark.skipif(BACKEND != "jax", reason="JAX compiles a step per input placement")
@pytest.mark.parametrize("placed", [False, True], ids=["values", "placed"])
@pytest.mark.parametrize("outer_jit", [False, True], ids=["run", "jit-of-run"])
@pytest.mark.parametrize(
    "make_strategy",
    [
        lambda: keras_dist.OneDeviceStrategy("cpu:0"),  # one GPU: device 0
        lambda: keras_dist.MirroredStrategy(["cpu:0"]),
        lambda: keras_dist.OneDeviceStrategy("cpu:1"),
        lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
        lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(4)]),
    ],
    ids=["one-device-0", "mirrored-0", "one-device-1", "mirrored-4", "central-storage-4"],
)
def test_a_state_in_state_out_loop_compiles_its_step_once(make_strategy, outer_jit, placed):
    """keras-io's JAX loop (state = the variables' `.value`s, `run` returns
    the new state, fed back): nothing compiles after the first step. The
    state used to come back placed differently from the `.value`s on device
    0 (a one-device mesh's sharding vs the array's own), so the step
    compiled twice (12 s for a 23M-parameter model on an H200). Under
    CentralStorageStrategy the variables live on the parameter device and
    the state comes back on the compute devices: a `jax.jit` over `run`
    compiles once more there, unless the loop starts from
    `strategy.experimental_place_state(state)` ("placed"; elsewhere it
    returns the values as they are; guides/custom_training_loops.md)."""
    import logging

    import jax

    compiles = []

    class Count(logging.Handler):
        def emit(self, record):
            if record.getMessage().startswith("Compiling"):
                compiles.append(record.getMessage()[:80])

    handler = Count()
    logger = logging.getLogger("jax")
    logger.addHandler(handler)
    previous = jax.config.jax_log_compiles
    jax.config.update("jax_log_compiles", True)
    try:
        x, y = make_data(64)
        strategy = make_strategy()
        with strategy.scope():
            model = _batch_norm_model()
            optimizer = keras.optimizers.SGD(0.1)
            optimizer.build(model.trainable_variables)
        step = _jax_state_step(strategy, model, optimizer, outer_jit)
        state = (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in optimizer.variables],
        )
        if placed:
            values = state
            state = strategy.experimental_place_state(state)
            for value, placed_value in zip(jax.tree_util.tree_leaves(values), jax.tree_util.tree_leaves(state)):
                np.testing.assert_array_equal(value, placed_value)
                if not isinstance(strategy, keras_dist.CentralStorageStrategy):
                    assert placed_value is value  # already placed as run returns state
        after_each_step = []
        for data in strategy.experimental_distribute_dataset([(x[i : i + 16], y[i : i + 16]) for i in range(0, 64, 16)]):
            loss, state = step(state, data)
            after_each_step.append(len(compiles))
    finally:
        jax.config.update("jax_log_compiles", previous)
        logger.removeHandler(handler)
    once_more = 1 if outer_jit and not placed and isinstance(strategy, keras_dist.CentralStorageStrategy) else 0
    assert after_each_step[-1] - after_each_step[0] == once_more, (after_each_step, compiles[after_each_step[0]:])



@pytest.mark.skipif(BACKEND != "jax", reason="jax.jit over the variables' values is JAX's loop")
@pytest.mark.parametrize("outer_jit", [False, True], ids=["run", "jit-of-run"])
@pytest.mark.parametrize("strategy_name", sorted(_LOOP_STRATEGIES) + ["default"])
def test_a_loop_that_writes_the_state_back_every_step_trains_as_one_device(strategy_name, outer_jit):
    """The JAX guide's loop that reads the variables' values, steps, and
    assigns the new state back every step (SGD with momentum, BatchNorm,
    uneven batches): the same weights as one device. Under
    CentralStorageStrategy a `jax.jit` over `run` failed at the second step
    ("incompatible devices"): the assigned values were pinned to the
    parameter device, beside a batch on the compute devices."""
    x, y = make_data(64)

    def train(strategy):
        with strategy.scope():
            model = _batch_norm_model()
            optimizer = keras.optimizers.SGD(0.1, momentum=0.9)
            optimizer.build(model.trainable_variables)
        groups = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)
        step = _jax_state_step(strategy, model, optimizer, outer_jit)
        batches = [(x[i : i + 15], y[i : i + 15]) for i in range(0, 64, 15)]  # 15 rows: uneven over 4 replicas
        for data in strategy.experimental_distribute_dataset(batches):
            _, state = step(tuple([v.value for v in group] for group in groups), data)
            for group, values in zip(groups, state):
                for variable, value in zip(group, values):
                    variable.assign(value)
        return model.get_weights() + [keras.ops.convert_to_numpy(v) for v in optimizer.variables]

    expected = train(keras_dist.get_strategy())
    strategy = keras_dist.get_strategy() if strategy_name == "default" else _LOOP_STRATEGIES[strategy_name]()
    for want, got in zip(expected, train(strategy)):
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=0)


_APPLY_STRATEGIES = {
    "mirrored-4": lambda: keras_dist.MirroredStrategy([f"cpu:{i}" for i in range(4)]),
    "central-storage-4": lambda: keras_dist.CentralStorageStrategy([f"cpu:{i}" for i in range(4)]),
    "one-device": lambda: keras_dist.OneDeviceStrategy("cpu:1"),
}


@pytest.mark.parametrize("gradient", ["autodiff", "per-replica"])
@pytest.mark.parametrize("aggregation", ["none", "sum", "mean", "only_first_replica"])
@pytest.mark.parametrize("strategy_name", sorted(_APPLY_STRATEGIES))
def test_apply_gradients_inside_run_moves_a_variable_once_whatever_its_aggregation(strategy_name, aggregation, gradient):
    """Each replica's loss is (replica + 1) * v: the update is SGD's step
    for the sum of the replicas' gradients, applied once (tf applies it in
    cross-replica context). On JAX a variable with aggregation="sum" moved
    num_replicas times as far (found by tf-keras's keras_optimizer_v2_test,
    tests/peer/test_peer_keras_optimizer_v2.py). "per-replica": each
    replica hands apply_gradients its own gradient (not through autodiff;
    on JAX it still differs across replicas), which tf sums."""
    strategy = _APPLY_STRATEGIES[strategy_name]()
    with strategy.scope():
        var = keras.Variable(2.0, aggregation=aggregation)
        optimizer = keras.optimizers.SGD(0.05)
        optimizer.build([var])

    def replica_fn():
        replica = keras.ops.cast(keras_dist.get_replica_context().replica_id_in_sync_group, "float32")
        if gradient == "per-replica":
            grad = replica + 1.0
        elif BACKEND == "tensorflow":
            import tensorflow as tf

            with tf.GradientTape() as tape:
                loss = (replica + 1.0) * var
            grad = tape.gradient(loss, var)
        else:
            import jax

            grad = jax.grad(lambda v: (replica + 1.0) * v)(var.value)
        optimizer.apply_gradients([(grad, var)])

    if BACKEND == "tensorflow":
        import tensorflow as tf

        step = tf.function(lambda: strategy.run(replica_fn))
    else:
        step = lambda: strategy.run(replica_fn)  # noqa: E731
    for _ in range(2):
        step()
    total = sum(r + 1.0 for r in range(strategy.num_replicas_in_sync))
    np.testing.assert_allclose(float(keras.ops.convert_to_numpy(var.value)), 2.0 - 2 * 0.05 * total, rtol=1e-6, atol=1e-6)
    assert int(keras.ops.convert_to_numpy(optimizer.iterations)) == 2


@pytest.mark.parametrize("strategy_name", sorted(_LOOP_STRATEGIES) + ["default"])
def test_reduce_and_gather_of_a_value_never_distributed_and_of_one_equal_on_every_replica(strategy_name):
    """tf's rules, on every strategy: a value the strategy never distributed
    gathers as it is, MEANs to itself, and cannot be SUMmed over several
    replicas (a clear error); `run`'s result that is equal on every replica
    (a PerReplica in tf, a plain array on JAX) is one copy per replica. JAX
    gathered the first once per replica ((8, 3) on 4 replicas, tf (2, 3))
    and refused to SUM the second; TensorFlow's refusal named no fix."""
    strategy = keras_dist.get_strategy() if strategy_name == "default" else _LOOP_STRATEGIES[strategy_name]()
    n = strategy.num_replicas_in_sync
    plain = np.arange(6, dtype="float32").reshape(2, 3)
    np.testing.assert_array_equal(np.asarray(strategy.gather(plain, axis=0)), plain)
    np.testing.assert_array_equal(np.asarray(strategy.reduce("MEAN", plain, axis=None)), plain)
    if n > 1:
        with pytest.raises(ValueError, match=f"Cannot SUM a value that is not distributed across {n} replicas"):
            strategy.reduce("SUM", plain, axis=None)
    else:
        np.testing.assert_array_equal(np.asarray(strategy.reduce("SUM", plain, axis=None)), plain)

    def check_equal_on_every_replica(same, gather, total, mean, row_totals):
        np.testing.assert_array_equal(np.asarray(gather), np.concatenate([plain] * n))
        np.testing.assert_allclose(np.asarray(total), plain * n)
        np.testing.assert_allclose(np.asarray(mean), plain)
        np.testing.assert_allclose(np.asarray(row_totals), plain.sum(axis=0) * n)

    def ops_on(same):
        return (
            same,
            strategy.gather(same, axis=0),
            strategy.reduce("SUM", same, axis=None),
            strategy.reduce("MEAN", same, axis=None),
            strategy.reduce("SUM", same, axis=0),
        )

    def same_everywhere():
        return strategy.run(lambda: keras.ops.convert_to_tensor(plain))

    check_equal_on_every_replica(*ops_on(same_everywhere()))
    if BACKEND == "jax":  # inside jit, run's results are tracers: run remembers which are per replica
        import jax

        check_equal_on_every_replica(*jax.jit(lambda: ops_on(same_everywhere()))())
        traced_plain = jax.jit(lambda x: strategy.gather(x, axis=0))(plain)
        np.testing.assert_array_equal(np.asarray(traced_plain), plain)
    if strategy_name == "mirrored-4":  # a mirrored variable's value: one copy per replica
        with strategy.scope():
            variable = keras.Variable(plain)
        np.testing.assert_allclose(np.asarray(strategy.reduce("SUM", variable.value, axis=None)), plain * n)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="a tf.function given to run (TensorFlow)")
def test_one_device_runs_an_xla_function_on_its_device():
    """`OneDeviceStrategy("cpu:1").run` of a `tf.function(jit_compile=True)`
    that writes a variable returns its value, as tf's own OneDeviceStrategy
    does (XLA compiled the lifted step for the default device: "located in
    device CPU:1 from device CPU:0"; 16 tf-keras ctl_correctness cases)."""
    import tensorflow as tf

    strategy = keras_dist.OneDeviceStrategy("cpu:1")
    with strategy.scope():
        counter = keras.Variable(1.0)

    @tf.function(jit_compile=True)
    def step(x):
        counter.assign_add(x)
        return counter.value * 2.0

    assert float(strategy.run(step, args=(tf.constant(1.0),))) == 4.0
    assert float(strategy.run(step, args=(tf.constant(2.0),))) == 8.0
    assert "CPU:1" in counter.value.device
