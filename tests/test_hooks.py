"""The hooks module: every hook installed, every hook live, and code outside
a strategy bit-for-bit plain Keras."""

import contextlib
import json
import os
import subprocess
import sys
import textwrap

import keras
import numpy as np
import pytest

import keras_dist
from keras_dist import _context, _hooks
from keras_dist._hooks import _files
from _helpers import FEATURES, compile_model, make_data, mlp, sharded_dense, twin, two_heads
from conftest import BACKEND, jax_train_step

def test_exactly_the_table_s_hooks_are_installed():
    """`install()` patched every hook of the table for this backend, and only
    those; the hooks module's docstring lists each one."""
    expected = [hook.target for hook in _hooks.hooks_for(BACKEND)]
    assert len(expected) == len(set(expected))
    assert sorted(_hooks.ORIGINALS) == sorted(expected)
    for path, original in _hooks.ORIGINALS.items():
        owner, name = _hooks.resolve(path)
        installed = getattr(owner, name)
        assert installed.__keras_dist_original__ is original, path
    for hook in _hooks.HOOKS:
        assert hook.target in _hooks.__doc__ and hook.purpose, hook.target


def test_every_hook_s_signature_is_recorded_and_checked_at_install():
    """Each hooked function has, in this Keras, a signature its wrapper was
    written for (`_keras_signatures`, measured on Keras 3.10, 3.15 and
    3.16); another is one ImportError at install naming the hook. Under a
    new Keras this test prints what to record."""
    from keras_dist._hooks import _patching
    from keras_dist._hooks._keras_signatures import SIGNATURES

    found = {path: _patching.signature(original) for path, original in _hooks.ORIGINALS.items()}
    missing = {path: sig for path, sig in found.items() if sig not in SIGNATURES.get(path, {})}
    assert not missing, f"Keras {keras.version()}: record (after reading the change) {missing}"
    path = next(iter(_hooks.ORIGINALS))
    with pytest.raises(ImportError, match=r"expects the signature .* has \(a, b, new_argument\)") as raised:
        _patching.check_signature(path, lambda a, b, new_argument: None)
    assert _hooks.current(path) in str(raised.value) and keras.version() in str(raised.value)


def test_every_hook_says_why_no_public_seam_serves():
    from keras_dist._hooks import _seams

    for hook in _hooks.HOOKS:
        assert len(_seams.reason(hook.target)) > 30, hook.target
        assert _seams.reason(hook.target) in _hooks.__doc__
    unused = [p for p in _seams.NO_PUBLIC_SEAM if not any(h.target.startswith(p) for h in _hooks.HOOKS)]
    assert not unused, unused


def test_keras_3_16_names_are_one_switch():
    """Every target is written as Keras 3.10-3.15 spell it; `current` turns
    it into Keras 3.16's (renamed trainer classes, the backends' ops moved
    under `ops/`), and only there. Each side is resolved by the suite run
    under that Keras (make test; make test-keras-nightly)."""
    from keras_dist._keras_names import current

    assert current("keras.src.trainers.trainer:Trainer.compile", (3, 15, 1)) == "keras.src.trainers.trainer:Trainer.compile"
    assert current("keras.src.trainers.trainer:Trainer.compile", (3, 16, 0)) == "keras.src.trainers.trainer:BaseTrainer.compile"
    assert current("keras.src.backend.tensorflow.nn:conv", (3, 16, 0)) == "keras.src.backend.tensorflow.ops.nn:conv"
    assert current("keras.src.backend.jax.trainer:JAXTrainer.make_train_function", (3, 16, 0)) == (
        "keras.src.backend.jax.trainer:Trainer.make_train_function")
    assert current("keras.src.backend:gru", (3, 16, 0)) == "keras.src.backend.jax.rnn:gru"
    assert current("keras.src.models.model:Model.fit", (3, 16, 0)) == "keras.src.models.model:Model.fit"
    for hook in _hooks.hooks_for(BACKEND):  # this Keras: each resolves (install did it too)
        owner, name = _hooks.resolve(hook.target)
        assert getattr(owner, name).__keras_dist_original__ is _hooks.ORIGINALS[hook.target]


# -- liveness: each hook, reverted alone, changes what a user sees ------------


def _outcome(probe, *args):
    try:
        return ("ok", probe(*args))
    except Exception as error:  # noqa: BLE001 - the error is the outcome
        return ("raised", f"{type(error).__name__}: {error}")


def _same(a, b) -> bool:
    if a[0] != b[0]:
        return False
    if a[0] == "raised":
        return a[1] == b[1]
    left, right = keras.tree.flatten(a[1]), keras.tree.flatten(b[1])
    if len(left) != len(right):
        return False
    for x, y in zip(left, right):
        if isinstance(x, str) or isinstance(y, str) or x is None or y is None:
            if x != y:
                return False
        elif np.shape(x) != np.shape(y) or not np.allclose(x, y, atol=1e-6, rtol=0):
            return False
    return True


def _probe_init(mirrored, tmp_path):
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
    return str(_hooks.model_strategy(model))


def _probe_compile(mirrored, tmp_path):
    """Compiled outside the scope: the optimizer is still the strategy's,
    given by name or made outside the scope, unused (adopted)."""
    strategy = mirrored(2)
    placed = []
    for optimizer in ("sgd", keras.optimizers.SGD(0.1)):
        with strategy.scope():
            model = mlp()
        model.compile(optimizer=optimizer, loss="mse")
        placed.append([strategy.extended.variable_created_in_scope(v) for v in model.optimizer.variables])
    return placed


def _entry_probe(name):
    def probe(mirrored, tmp_path):
        """Called under another strategy's scope: refused, naming the call."""
        x, y = make_data(8)
        with mirrored(2).scope():
            model = compile_model(mlp(), "sgd")
        arguments = {
            "fit": lambda: model.fit(x, y, batch_size=4, verbose=0),
            "evaluate": lambda: model.evaluate(x, y, batch_size=4, verbose=0),
            "predict": lambda: model.predict(x, batch_size=4, verbose=0),
            "train_on_batch": lambda: model.train_on_batch(x, y),
            "test_on_batch": lambda: model.test_on_batch(x, y),
            "predict_on_batch": lambda: model.predict_on_batch(x),
        }[name]
        try:
            with mirrored(4).scope():
                arguments()
        except ValueError as error:
            return f"refused: {str(error)[: len(name) + 17]}"  # "Cannot <name> model"
        return "accepted"

    return probe


def _non_chief_write_probe(kind, filename):
    def probe(mirrored, tmp_path, monkeypatch):
        """A non-chief worker's `save` / `save_weights` leaves nothing at the
        user's path (every worker calls it; two writing one file tore it)."""
        strategy = mirrored(2)
        with strategy.scope():
            model = compile_model(mlp(), "sgd")
        monkeypatch.setattr(type(strategy.extended), "should_checkpoint", property(lambda self: False))
        getattr(model, kind)(tmp_path / filename)
        return (tmp_path / filename).exists()

    return probe


_probe_save = _non_chief_write_probe("save", "model.keras")
_probe_save_weights = _non_chief_write_probe("save_weights", "model.weights.h5")


def _fit_with_backup(mirrored, tmp_path, epochs=1):
    x, y = make_data(16)
    with mirrored(2).scope():
        model = compile_model(mlp(), "sgd")
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"), delete_checkpoint=False)
    model.fit(x, y, batch_size=8, epochs=epochs, verbose=0, callbacks=[backup])
    return model, backup


def _probe_backup_save(mirrored, tmp_path):
    """The backup's weights file carries the epoch it was written at."""
    import h5py

    _, backup = _fit_with_backup(mirrored, tmp_path)
    with h5py.File(backup._weights_path, "r") as handle:
        return str(handle.attrs.get("keras_dist_training_metadata"))


def _probe_backup_load(mirrored, tmp_path):
    """Restoring trusts the epoch committed with the weights, not the JSON
    file beside them (written after the rename, so it may lag)."""
    import h5py

    model, backup = _fit_with_backup(mirrored, tmp_path)
    with h5py.File(backup._weights_path, "a") as handle:  # the committed epoch
        handle.attrs["keras_dist_training_metadata"] = json.dumps({"epoch": 5, "batch": -1})
    backup.set_model(model)
    backup.on_train_begin()
    return model._initial_epoch


def _probe_loss_call(mirrored, tmp_path):
    """An averaging loss inside strategy.run is refused."""
    strategy = mirrored(4)
    x, y = make_data(8)
    loss = keras.losses.MeanSquaredError()
    try:
        for batch in strategy.experimental_distribute_dataset([(x, y)]):
            strategy.run(lambda a, b: loss(b, a[:, :1]), args=batch)
    except ValueError as error:
        return f"refused: {str(error)[:40]}"
    return "accepted"


def _probe_replica_fit(mirrored, tmp_path):
    """Per-replica training steps (BatchNorm, L2): weights and logged loss.
    Five even batches of 8 over 4 replicas, then 3 rows: uneven shards."""
    x, y = make_data(43)
    with mirrored(4).scope():
        model = mlp(batch_norm=True, regularizer="l2")
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="binary_crossentropy")
    history = model.fit(x, y, batch_size=8, shuffle=False, verbose=0).history
    return model.get_weights(), history["loss"]


def _probe_per_output_losses(mirrored, tmp_path):
    """A per-replica step of a two-output model: each output's logged loss."""
    x, y = make_data(43)
    with mirrored(4).scope():
        model = two_heads()
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss={"a": "binary_crossentropy", "b": "mse"})
    history = model.fit(x, {"a": y, "b": y}, batch_size=8, shuffle=False, verbose=0).history
    return history["a_loss"], history["b_loss"]


class _ShardingRecorder(keras.layers.Layer):
    """Records how the step splits its input over the devices (JAX: the
    input's sharding as the compiled step sees it)."""

    seen: list = []

    def call(self, x):
        if BACKEND == "jax":
            import jax

            jax.debug.inspect_array_sharding(x, callback=lambda s: _ShardingRecorder.seen.append(repr(s)))
        return x


def _step_probe(kind):
    def probe(mirrored, tmp_path):
        """Uneven batches split over replicas: the counting metric's state,
        the predictions, the weights."""
        x, y = make_data(10)
        _ShardingRecorder.seen = []
        with mirrored(4).scope():
            model = compile_model(keras.Sequential([keras.Input((8,)), _ShardingRecorder(), mlp()]), "sgd")
        if kind == "train":
            model.fit(x, y, batch_size=10, verbose=0)
            return model.get_weights(), [np.asarray(v) for v in model.metrics_variables], _ShardingRecorder.seen
        if kind == "test":
            model.evaluate(x, y, batch_size=10, verbose=0)
            return [np.asarray(v) for v in model.metrics_variables], _ShardingRecorder.seen
        return model.predict(x, batch_size=10, verbose=0), _ShardingRecorder.seen

    return probe


def _fit_probe(mirrored, optimizer, loss="binary_crossentropy", batch_size=10):
    """fit for one epoch under Mirrored(4) on 43 rows: weights and logged loss."""
    x, y = make_data(43)
    with mirrored(4).scope():
        model = mlp()
        model.compile(optimizer=optimizer, loss=loss)
    history = model.fit(x, y, batch_size=batch_size, shuffle=False, verbose=0).history
    return model.get_weights(), history["loss"]


def _probe_reduce_values(mirrored, tmp_path):
    """A loss function returning its own mean, in per-replica steps: each
    replica's scalar scaled by its share (Keras leaves it whole)."""
    return _fit_probe(
        mirrored, keras.optimizers.SGD(0.1), loss=lambda y, p: keras.ops.mean(keras.ops.square(y - p)), batch_size=8
    )


def _probe_clipped_sgd(mirrored, tmp_path):
    """SGD with global_clipnorm: clipped after the sum over replicas, and
    summed once (TensorFlow)."""
    return _fit_probe(mirrored, keras.optimizers.SGD(0.1, global_clipnorm=0.01))


def _probe_loss_scale_apply(mirrored, tmp_path):
    """A LossScaleOptimizer in fit (TensorFlow calls its inner optimizer in
    cross-replica context)."""
    return _fit_probe(mirrored, keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, global_clipnorm=0.01)))


def _probe_dropout(mirrored, tmp_path):
    """A model with Dropout in replica steps: each replica's rows of one
    device's mask (the replicas drew the same mask for their own rows)."""
    x, y = make_data(43)
    keras.utils.set_random_seed(1)
    with mirrored(4).scope():
        model = keras.Sequential(
            [keras.Input((FEATURES,)), keras.layers.Dense(8), keras.layers.Dropout(0.5, seed=3), keras.layers.Dense(1)]
        )
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    return model.get_weights()


def _probe_synchronized_batch_norm(mirrored, tmp_path):
    """JAX: BatchNormalization(synchronized=True) made under a strategy
    (Keras refuses it in the constructor on JAX)."""
    with mirrored(2).scope():
        return keras.layers.BatchNormalization(synchronized=True).synchronized


def _probe_optimizer_apply(mirrored, tmp_path):
    """An optimizer applied in cross-replica context is refused, leaving the
    weights as they were; on TensorFlow, one first applied inside
    strategy.run builds its slots."""
    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
        optimizer = keras.optimizers.SGD(0.1)
        try:
            optimizer.apply_gradients([(np.ones(v.shape, "float32"), v) for v in model.trainable_variables])
            refused = ""
        except RuntimeError as error:
            refused = str(error)
    outcome = [refused, model.get_weights()]
    if BACKEND == "tensorflow":
        outcome.append(_apply_first_inside_run(mirrored))
    return outcome


def _apply_first_inside_run(mirrored):
    import tensorflow as tf

    strategy = mirrored(2)
    with strategy.scope():
        model = mlp()
        optimizer = keras.optimizers.Adam(0.01)
    x, y = make_data(8)

    @tf.function
    def step(a, b):
        def replica(a, b):
            with tf.GradientTape() as tape:
                per_example = keras.losses.binary_crossentropy(b, model(a))
                loss = keras_dist.compute_average_loss(per_example)
            grads = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(grads, model.trainable_variables))
            return loss

        return strategy.run(replica, args=(a, b))

    for batch in strategy.experimental_distribute_dataset([(x, y)]):
        step(*batch)
    return model.get_weights()


def _probe_sharded_trainable(mirrored, tmp_path):
    """A variable split over the ps tasks (tf's ShardedVariable) is listed
    and trains as its shards: `weights` (and Keras' `trainable_weights`
    and `non_trainable_weights` from it) and `trainable_variables` list
    them, and a tape takes their gradients (it cannot watch the whole)."""
    import tensorflow as tf

    layer, _ = sharded_dense()
    with tf.GradientTape() as tape:
        loss = keras.ops.sum(layer(np.ones((4, 6), "float32")) ** 2)
    weights = layer.trainable_weights
    gradients = tape.gradient(loss, weights)
    listed = [layer.weights, weights, layer.non_trainable_weights, layer.trainable_variables]
    layer.kernel.trainable = False  # its shards follow: Keras lists them with the non-trainable weights
    listed += [layer.trainable_weights, layer.non_trainable_weights, layer.trainable_variables]
    return [[[tuple(w.shape) for w in variables] for variables in listed], gradients]


def _probe_whole_get_set_weights(mirrored, tmp_path):
    """`get_weights` / `set_weights` of a layer with a split variable give and
    take it whole, as an unsplit layer's."""
    layer, kernel = sharded_dense()
    shapes = [w.shape for w in layer.get_weights()]
    try:
        layer.set_weights([kernel + 1.0, np.zeros(2, "float32")])
    except ValueError as error:
        return [shapes, f"refused: {str(error)[:60]}"]
    return [shapes, float(np.abs(layer.kernel.numpy() - kernel - 1.0).max())]


def _probe_assign_on_ps(mirrored, tmp_path, monkeypatch):
    """A ps variable written with `assign` by a scheduled function that runs
    twice under one id (a re-run after its worker died) is written once
    (the local CPU stands in for the ps: the gate works on any device)."""
    import tensorflow as tf

    from keras_dist.backends.tensorflow import _exactly_once, _parameter_servers

    monkeypatch.setattr(_parameter_servers, "is_engine_variable", lambda value: True)
    variable = keras.Variable(1.0)
    gates = _exactly_once.ClosureGates()
    step = gates.closure_function(lambda: variable.assign(variable * 3.0))
    for _ in range(2):
        step(tf.constant(7, tf.int64))
    gates.forget()
    return [float(variable.numpy()), gates.skipped_writes]  # [3.0, 1]; Keras' own: [9.0, 0]


def _probe_symbolic_build(mirrored, tmp_path):
    """A built model's second fit reads its PyDataset as often as plain Keras."""
    return _dataset_reads(mirrored(2))


def _dataset_reads(strategy):
    x, y = make_data(40)

    class Counting(keras.utils.PyDataset):
        reads = 0

        def __len__(self):
            return 4

        def __getitem__(self, index):
            Counting.reads += 1
            return x[index * 10 : (index + 1) * 10], y[index * 10 : (index + 1) * 10]

    with strategy.scope() if strategy else contextlib.nullcontext():
        model = compile_model(mlp())
    model.fit(Counting(), epochs=1, verbose=0)  # builds everything
    Counting.reads = 0
    model.fit(Counting(), epochs=1, verbose=0)
    return Counting.reads


def _probe_values_from_chief(mirrored, tmp_path, monkeypatch):
    """As in a multi-process job whose chief's values are all 0.5: a model
    created under the strategy starts from them."""
    from keras_dist.backends import get_adapter

    adapter = get_adapter()
    monkeypatch.setattr(adapter, "is_multi_process", lambda: True)
    monkeypatch.setattr(adapter, "values_from_chief", lambda values: [np.full(np.shape(v), 0.5, "float32") for v in values])
    with mirrored(2).scope():
        model = mlp()
    return model.get_weights()


def _assign_delta_probe(name):
    def probe(mirrored, tmp_path):
        """A "sum" variable at 10 incremented by 1 on each of 2 replicas
        inside run: tf.distribute gives 12 (Keras' own assign(v + 1) 22)."""
        strategy = mirrored(2)
        with strategy.scope():
            counter = keras.Variable(10.0, aggregation="sum")
        strategy.run(lambda: getattr(counter, name)(1.0))
        return float(counter.numpy())

    return probe


def _scalar_conversion_probe(convert):
    def probe(mirrored, tmp_path):
        """`int`/`float` of the optimizer's step count and of a mirrored
        scalar after one step on 2 replicas (tf's distributed variables
        have neither: a TypeError, and Keras' OrbaxCheckpoint with it)."""
        strategy = mirrored(2)
        with strategy.scope():
            model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
            model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
            scale = keras.Variable(2.5)
        model.fit(np.ones((4, 2), "float32"), np.ones((4, 1), "float32"), batch_size=4, verbose=0)
        return convert(model.optimizer.iterations), convert(scale)

    return probe


def _probe_metrics_in_run(mirrored, tmp_path):
    """Accuracy and AUC updated inside run on 10 rows over 4 replicas
    (JAX pads two shards): the padding rows must not count."""
    rng = np.random.default_rng(0)
    y_true = (rng.random((10, 1)) > 0.5).astype("float32")
    y_pred = rng.random((10, 1)).astype("float32")
    strategy = mirrored(4)
    with strategy.scope():
        metrics = [keras.metrics.BinaryAccuracy(), keras.metrics.AUC(num_thresholds=20)]

    def update(batch):
        for metric in metrics:
            metric.update_state(*batch)
        return keras.ops.convert_to_tensor(0.0)

    for batch in strategy.experimental_distribute_dataset([(y_true, y_pred)]):
        strategy.run(update, args=(batch,))
    return [round(float(metric.result()), 6) for metric in metrics]


def _probe_metric_result_in_run(mirrored, tmp_path):
    """A Mean updated and read inside run on 4 replicas: every replica's
    result must be the mean of all 8 rows."""
    strategy = mirrored(4)
    with strategy.scope():
        metric = keras.metrics.Mean()

    def step(x):
        metric.update_state(x)
        return metric.result()

    for batch in strategy.experimental_distribute_dataset([np.arange(8, dtype="float32")]):
        out = strategy.run(step, args=(batch,))
    return [float(v) for v in strategy.experimental_local_results(out)]


def _rnn_probe(layer):
    def probe(mirrored, tmp_path):
        """A recurrent layer called inside run on 2 replicas: JAX's shard_map
        must see its scan's initial state vary across replicas, as its state
        does."""
        return _run_recurrent_layer(mirrored, layer)

    return probe


def _run_recurrent_layer(mirrored, layer):
    strategy = mirrored(2)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3, 2)), getattr(keras.layers, layer)(2)])
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(4, 3, 2)
    for batch in strategy.experimental_distribute_dataset([x]):
        out = strategy.run(lambda b: model(b), args=(batch,))
    return np.concatenate([np.asarray(v) for v in strategy.experimental_local_results(out)])


def _probe_stateful_rnn(mirrored, tmp_path):
    """A stateful LSTM on 2 replicas that split the global batch (TensorFlow:
    fit's steps; JAX: inside run, as its steps see the global batch):
    keras_dist's clear error (TensorFlow failed in the graph, JAX in Keras'
    own batch-size check)."""
    strategy = mirrored(2)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((3, 2), batch_size=4), keras.layers.LSTM(2, stateful=True)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
    x = np.linspace(-1, 1, 24, dtype="float32").reshape(4, 3, 2)
    try:
        if BACKEND == "tensorflow":
            model.fit(x, x[:, 0, :], batch_size=4, verbose=0)
        else:
            for batch in strategy.experimental_distribute_dataset([x]):
                strategy.run(lambda b: model(b), args=(batch,))
    except ValueError as error:
        return "refused" if "is stateful (stateful=True)" in str(error) else f"another error: {error}"
    return "trained"


def _probe_empty_replica_add(mirrored, tmp_path):
    """A residual `Add` inside run on 3 rows over 4 replicas, in a
    tf.function: one replica gets 0 rows, and Keras' add took its (0, 4)
    operand for a bias."""
    import tensorflow as tf

    strategy = mirrored(4)
    with strategy.scope():
        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Add()([inputs, keras.layers.Dense(4)(inputs)]))
    x = np.linspace(-1, 1, 12, dtype="float32").reshape(3, 4)
    step = tf.function(lambda b: strategy.run(lambda v: model(v), args=(b,)))
    for batch in strategy.experimental_distribute_dataset([x]):
        out = step(batch)
    return np.concatenate([np.asarray(v) for v in strategy.experimental_local_results(out)])


def _empty_replica_convolution_probe(layer):
    def probe(mirrored, tmp_path):
        """`predict` of 3 rows on 4 replicas through one convolution: tf's
        oneDNN kernel gave the replica without rows the input's channels,
        and the Dense after it refused the shape."""
        strategy = mirrored(4)
        with strategy.scope():
            keras.utils.set_random_seed(1)
            model = keras.Sequential(
                [keras.Input((5, 5, 2)), layer(), keras.layers.GlobalAveragePooling2D(), keras.layers.Dense(1)]
            )
        x = np.linspace(-1, 1, 150, dtype="float32").reshape(3, 5, 5, 2)
        predicted = model.predict(x, batch_size=3, verbose=0)
        # and one training step: the replica without rows must add a zero
        # kernel gradient (without oneDNN tf's depthwise kernel gave it
        # uninitialised memory)
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        model.fit(x, np.ones((3, 1), "float32"), batch_size=3, epochs=1, verbose=0)
        return predicted, [np.asarray(w) for w in model.get_weights()]

    return probe


_TRAINER = "keras.src.trainers.trainer:Trainer"
_JAX_TRAINER = "keras.src.backend.jax.trainer"
_TF_TRAINER = "keras.src.backend.tensorflow.trainer:TensorFlowTrainer"
_FILES = "keras.src.callbacks.backup_and_restore:BackupAndRestore"
PROBES = {
    f"{_TRAINER}.__init__": _probe_init,
    f"{_TRAINER}.compile": _probe_compile,
    **{f"keras.src.models.model:Model.{name}": _entry_probe(name) for name in (
        "fit", "evaluate", "predict", "train_on_batch", "test_on_batch", "predict_on_batch")},
    "keras.src.models.model:Model.save": _probe_save,
    "keras.src.models.model:Model.save_weights": _probe_save_weights,
    f"{_FILES}._save_model": _probe_backup_save,
    f"{_FILES}._load_model": _probe_backup_load,
    "keras.src.losses.loss:Loss.__call__": _probe_loss_call,
    "keras.src.losses.loss:scale_loss_for_distribution": _probe_replica_fit,
    "keras.src.losses.loss:unscale_loss_for_distribution": _probe_per_output_losses,
    "keras.src.layers.normalization.batch_normalization:BatchNormalization._moments": _probe_replica_fit,
    "keras.src.layers.normalization.batch_normalization:BatchNormalization.__init__": _probe_synchronized_batch_norm,
    f"{_TRAINER}._aggregate_additional_loss": _probe_replica_fit,
    f"{_JAX_TRAINER}:JAXTrainer.compute_loss_and_updates": _probe_replica_fit,
    f"{_JAX_TRAINER}:_distribute_data": _step_probe("train"),
    "keras.src.backend.jax.distribution_lib:distribute_tensor": _probe_values_from_chief,
    "keras.src.backend:rnn": _rnn_probe("LSTM"),  # LSTM on CPU: Keras' generic rnn
    "keras.src.backend:gru": _rnn_probe("GRU"),  # the backend's own GRU loop
    "keras.src.layers.rnn.rnn:RNN.call": _probe_stateful_rnn,
    "keras.src.backend.tensorflow.numpy:add": _probe_empty_replica_add,
    "keras.src.backend.tensorflow.nn:conv": _empty_replica_convolution_probe(lambda: keras.layers.Conv2D(3, 3)),
    "keras.src.backend.tensorflow.nn:depthwise_conv": _empty_replica_convolution_probe(
        lambda: keras.layers.DepthwiseConv2D(3, depth_multiplier=2)
    ),
    "keras.src.backend.tensorflow.nn:separable_conv": _empty_replica_convolution_probe(
        lambda: keras.layers.SeparableConv2D(3, 3)
    ),
    "keras.src.optimizers.base_optimizer:BaseOptimizer.apply": _probe_optimizer_apply,
    "keras.src.losses.loss:reduce_values": _probe_reduce_values,
    "keras.src.backend.tensorflow.random:dropout": _probe_dropout,
    "keras.src.optimizers.loss_scale_optimizer:LossScaleOptimizer.apply": _probe_loss_scale_apply,
    "keras.src.backend.tensorflow.optimizer:TFOptimizer._all_reduce_sum_gradients": _probe_clipped_sgd,
    **{f"keras.src.backend.common.variables:Variable.{n}": _assign_delta_probe(n) for n in ("assign_add", "assign_sub")},
    "keras.src.backend.common.variables:Variable.assign": _probe_assign_on_ps,
    **{f"keras.src.backend.common.variables:Variable.__{c.__name__}__": _scalar_conversion_probe(c) for c in (int, float)},
    "keras.src.metrics.reduction_metrics:reduce_to_samplewise_values": _probe_metrics_in_run,
    "keras.src.metrics.metrics_utils:update_confusion_matrix_variables": _probe_metrics_in_run,
    "keras.src.metrics.metric:Metric.__init__": _probe_metric_result_in_run,
    f"{_TF_TRAINER}._maybe_symbolic_build": _probe_symbolic_build,
    **{f"keras.src.layers.layer:Layer.{n}": _probe_sharded_trainable for n in ("weights", "trainable_variables")},
    **{f"keras.src.layers.layer:Layer.{n}": _probe_whole_get_set_weights for n in ("get_weights", "set_weights")},
}


#: Hooks whose effect on torch needs several replicas, which are processes
#: there: their probe is a 2-process job with the hook reverted
#: (tests/test_torch_backend.py::test_every_torch_hook_changes_behaviour);
#: the torch backend's own hooks have no other probe.
TORCH_PROBED_BY_JOB = (
    "keras.src.backend.torch.random:dropout",
    "keras.src.backend.torch.core:Variable._initialize",
    "keras_dist:install_step_functions",  # not a hook: the per-instance step function makers (reverted: not installed)
    "keras.src.losses.loss:Loss.__call__",
    "keras.src.losses.loss:reduce_values",
    "keras.src.losses.loss:scale_loss_for_distribution",
    "keras.src.losses.loss:unscale_loss_for_distribution",
    "keras.src.layers.normalization.batch_normalization:BatchNormalization._moments",
    f"{_TRAINER}._aggregate_additional_loss",
    "keras.src.backend.common.variables:Variable.assign_add",
    "keras.src.backend.common.variables:Variable.assign_sub",
    "keras.src.layers.rnn.rnn:RNN.call",
)
_TORCH_ONLY = {target for target in TORCH_PROBED_BY_JOB if ".torch." in target}


def test_every_hook_has_a_liveness_probe():
    assert sorted([*PROBES, *_TORCH_ONLY]) == sorted(hook.target for hook in _hooks.HOOKS)


def test_a_model_under_a_strategy_gets_its_own_step_function_makers(mirrored):
    """Keras' public seam, per instance: a model made in a strategy's scope
    has its own make_{train,test,predict}_function; one made outside has
    Keras' (no trainer class is patched); a model class that defines one
    keeps its own."""
    from keras_dist._hooks import _steps

    with mirrored(2).scope():
        inside = mlp()
    outside = mlp()
    for name in _steps.STEP_FUNCTION_MAKERS:
        assert name in inside.__dict__ and name not in outside.__dict__
        assert getattr(type(outside), name) is getattr(keras.Model, name)
        assert not hasattr(getattr(keras.Model, name), "__keras_dist_original__")  # Keras' own, unpatched

    class OwnSteps(keras.Sequential):
        def make_train_function(self, force=False):
            return super().make_train_function(force)

    with mirrored(2).scope():
        own = OwnSteps([keras.Input((8,)), keras.layers.Dense(1)])
    assert "make_train_function" not in own.__dict__ and "make_test_function" in own.__dict__


@pytest.mark.parametrize("kind", ["train", "test", "predict"])
def test_the_per_instance_step_function_makers_change_behaviour(kind, mirrored, monkeypatch, tmp_path, request):
    """The liveness rule for the one seam that is not a hook: without the
    per-instance makers (Keras' own step under the strategy) the probe's
    outcome changes."""
    from keras_dist._hooks import _steps

    if BACKEND == "torch":
        pytest.skip("several replicas are processes on torch: tests/test_torch_backend.py::"
                    "test_every_torch_hook_changes_behaviour[keras_dist:install_step_functions]")
    if BACKEND == "jax":
        request.getfixturevalue("per_replica_step")
    probe = _step_probe(kind)
    live = _outcome(probe, mirrored, tmp_path / "live")
    monkeypatch.setattr(_steps, "install_step_functions", lambda model: None)
    reverted = _outcome(probe, mirrored, tmp_path / "reverted")
    _context.reset()
    assert live[0] == "ok", live
    assert not _same(live, reverted), (kind, live, reverted)


def test_a_keras_whose_step_function_makers_changed_fails_at_install():
    from keras_dist._hooks import _steps

    class Changed(keras.Model):
        def make_train_function(self, force=False, extra=None):
            return None

    with pytest.raises(ImportError, match=r"make_train_function\(self, force=False\), but Keras .* has "
                                          r"make_train_function\(self, force=False, extra=None\)"):
        _steps.check_step_function_makers(Changed)
    _steps.check_step_function_makers(keras.Model)


def _probe_compile_checks(mirrored, tmp_path):
    """torch (where every variable of a process is on its one device, so
    adoption changes no placement): compile's own checks under a strategy."""
    with mirrored(1).scope():
        model = mlp()
    try:
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=0)
    except ValueError as error:
        return f"refused: {str(error)[:40]}"
    return "accepted"


if BACKEND == "torch":
    PROBES[f"{_TRAINER}.compile"] = _probe_compile_checks


def _is_a_not_implemented_stub(function) -> bool:
    """Whether `function`'s body is only `raise NotImplementedError`
    (Keras' placeholder for a backend's optional fast path)."""
    import ast
    import inspect
    import textwrap

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError):
        return False
    body = tree.body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]  # a docstring
    return (len(body) == 1 and isinstance(body[0], ast.Raise)
            and "NotImplementedError" in ast.unparse(body[0]))


@pytest.mark.parametrize("target", [hook.target for hook in _hooks.hooks_for(BACKEND)])
def test_every_hook_changes_behaviour(target, mirrored, monkeypatch, tmp_path, request):
    """Reverting this one hook to Keras' original (a pass-through) changes
    the probe's outcome: a hook that did nothing would fail here. (On JAX
    the per-replica training step is forced on for the probes, as
    multi-process CPU jobs take it.)"""
    if BACKEND == "torch" and target in TORCH_PROBED_BY_JOB:
        pytest.skip("needs several replicas, which are processes on torch: probed by "
                    "tests/test_torch_backend.py::test_every_torch_hook_changes_behaviour")
    if _is_a_not_implemented_stub(_hooks.ORIGINALS[target]):
        pytest.skip(f"{target} is a NotImplementedError stub in Keras {keras.version()}: Keras' layers fall back "
                    "to another hooked function there (keras.src.backend:rnn, whose probe runs)")
    if BACKEND == "jax":
        request.getfixturevalue("per_replica_step")
    probe = PROBES[target]
    if target in _ONEDNN_CONVOLUTIONS and not _onednn_gives_an_empty_batch_its_input_channels():
        pytest.skip("TensorFlow's oneDNN kernels are off on this CPU (on by default only where it has AVX-512): "
                    "without them Conv2D takes an empty batch, and the depthwise kernels' fault is a gradient of "
                    "uninitialised memory, which can read as zeros, so reverting the hook need not change the "
                    "outcome (test_empty_replica_convolution_hooks_are_live_under_onednn probes all three with "
                    "oneDNN on, where reverting fails every time)")
    extra = (monkeypatch,) if probe in (_probe_save, _probe_save_weights, _probe_values_from_chief, _probe_assign_on_ps) else ()
    live = _outcome(probe, mirrored, tmp_path / "live", *extra)
    owner, name = _hooks.resolve(target)
    monkeypatch.setattr(owner, name, _hooks.ORIGINALS[target])
    reverted = _outcome(probe, mirrored, tmp_path / "reverted", *extra)
    _context.reset()  # a reverted entry hook may leave a scope behind
    assert live[0] == "ok", live
    assert not _same(live, reverted), (target, live, reverted)


#: The hooks on TensorFlow's convolutions (a replica with 0 rows): tf's
#: oneDNN kernel gives an empty batch the input's channels.
_ONEDNN_CONVOLUTIONS = tuple(f"keras.src.backend.tensorflow.nn:{name}" for name in ("conv", "depthwise_conv", "separable_conv"))


def _onednn_gives_an_empty_batch_its_input_channels() -> bool:
    """Whether this process's TensorFlow convolution has the bug those hooks
    fix (oneDNN on: TF_ENABLE_ONEDNN_OPTS=1, TensorFlow's default on CPUs
    with AVX-512)."""
    import tensorflow as tf

    return tf.nn.conv2d(tf.zeros((0, 5, 5, 2)), tf.ones((3, 3, 2, 4)), 1, "VALID").shape[-1] != 4


_ONEDNN_PROBE = """
import json, os, sys
sys.path.insert(0, {tests!r})
import keras, keras_dist
keras_dist.simulate_cpu_devices(4)
import numpy as np
from keras_dist import _hooks
import test_hooks

def mirrored(n):
    return keras_dist.MirroredStrategy([f"cpu:{{i}}" for i in range(n)])

out = {{"bug": test_hooks._onednn_gives_an_empty_batch_its_input_channels()}}
for target in test_hooks._ONEDNN_CONVOLUTIONS:
    probe = test_hooks.PROBES[target]
    live = test_hooks._outcome(probe, mirrored, None)
    owner, name = _hooks.resolve(target)
    hooked = getattr(owner, name)
    setattr(owner, name, _hooks.ORIGINALS[target])
    reverted = test_hooks._outcome(probe, mirrored, None)
    setattr(owner, name, hooked)
    out[target] = [live[0], reverted[0], reverted[1] if reverted[0] == "raised" else None,
                   bool(test_hooks._same(live, reverted))]
print(json.dumps(out))
"""


@pytest.mark.starts_processes
@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's convolutions")
def test_empty_replica_convolution_hooks_are_live_under_onednn(tmp_path):
    """With TensorFlow's oneDNN kernels on (its default on CPUs with
    AVX-512, off on others), `predict` of 3 rows on 4 replicas through each
    convolution works with the hook and fails with it reverted."""
    script = tmp_path / "onednn_probe.py"
    script.write_text(_ONEDNN_PROBE.format(tests=os.path.dirname(os.path.abspath(__file__))))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, TF_ENABLE_ONEDNN_OPTS="1", KERAS_BACKEND="tensorflow"))
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result.pop("bug") is True  # oneDNN's kernel is in use
    for target, (live, reverted, error, same) in result.items():
        assert live == "ok" and not same, (target, live, reverted, error)


def test_compile_from_config_still_compiles(tmp_path, recwarn):
    """Keras compiles loaded and cloned models only if `compile` is its own."""
    import keras

    model = mlp()
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    model.save(tmp_path / "model.keras")
    loaded = keras.models.load_model(tmp_path / "model.keras")
    clone = keras.models.clone_model(model)
    clone.compile_from_config(model.get_compile_config())
    assert loaded.compiled and clone.compiled
    assert not [w for w in recwarn if "compile()` was not called" in str(w.message)]


def test_compile_adopts_an_unused_optimizer_made_outside_the_scope(mirrored):
    """The same object, its variables re-made under the strategy (same
    paths, values carried over), its config and own attributes kept: a
    learning rate assigned before compile, a schedule (the same object),
    momentum, exclude_from_weight_decay, an attribute of the user's."""
    strategy = mirrored(2)
    schedule = keras.optimizers.schedules.ExponentialDecay(0.1, decay_steps=10, decay_rate=0.5)
    with_schedule = keras.optimizers.SGD(schedule, momentum=0.9, nesterov=True, weight_decay=0.01)
    with_schedule.exclude_from_weight_decay(var_names=["bias"])
    with_schedule.note = "mine"
    assigned = keras.optimizers.Adam(0.01, beta_1=0.8, clipnorm=1.0)
    assigned.learning_rate = 0.05
    for optimizer in (with_schedule, assigned):
        config, paths = optimizer.get_config(), [v.path for v in optimizer.variables]
        values = [np.array(v.numpy()) for v in optimizer.variables]
        with strategy.scope():
            model = mlp()
        model.compile(optimizer=optimizer, loss="binary_crossentropy")
        assert model.optimizer is optimizer
        assert all(strategy.extended.variable_created_in_scope(v) for v in optimizer.variables)
        assert [v.path for v in optimizer.variables] == paths
        for variable, value in zip(optimizer.variables, values):
            np.testing.assert_array_equal(variable.numpy(), value)
        assert optimizer.get_config() == config
    assert with_schedule._learning_rate is schedule and with_schedule.note == "mine"
    assert with_schedule._exclude_from_weight_decay_pattern.pattern == "bias"
    assert abs(float(assigned.learning_rate.numpy()) - 0.05) < 1e-9
    x, y = make_data(10)
    model.fit(x, y, batch_size=10, verbose=0)  # the adopted Adam trains
    assert int(assigned.iterations.numpy()) == 1


def test_model_remembers_its_strategy(mirrored):
    strategy = mirrored(2)
    with strategy.scope():
        inside = mlp()
    outside = mlp()
    assert _hooks.model_strategy(inside) is strategy
    assert _hooks.model_strategy(outside) is None


def test_lazily_created_variables_belong_to_the_strategy(mirrored):
    """compile and fit outside the scope still create optimizer and metric
    variables under the model's strategy."""
    x, y = make_data(30)
    strategy = mirrored(4)
    with strategy.scope():
        model = mlp()
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    model.fit(x, y, batch_size=7, verbose=0)
    for variable in model.optimizer.variables + model.metrics_variables:
        assert strategy.extended.variable_created_in_scope(variable), variable.path


@pytest.mark.skipif(BACKEND != "jax", reason="JAX's batch placement")
def test_jax_even_host_batches_enter_the_step_unplaced(mirrored):
    """Even host batches go into the jitted step as they are (jit splits them
    over the devices, as plain Keras' step takes them); uneven ones are
    placed first, by the step. Both run the same training, exactly."""
    import jax
    from keras.src.backend.jax import trainer as jax_trainer

    strategy = mirrored(4)
    x, y = make_data(43)
    with strategy.scope():  # Keras' iterator leaves placement to the step
        for rows in (8, 6):
            batch = jax_trainer._distribute_data((x[:rows], y[:rows]))
            assert all(type(leaf) is np.ndarray for leaf in batch), rows

    reference, distributed = twin(strategy)
    for model in (reference, distributed):  # 5 batches of 8 rows, then 3
        model.fit(x, y, batch_size=8, shuffle=False, verbose=0)
    program_for = jax_train_step(distributed).program_for
    host_program, host_data = program_for((x[:8], y[:8]))
    placed_program, placed_data = program_for((x[:3], y[:3]))
    assert host_program is not placed_program
    assert all(type(leaf) is np.ndarray for leaf in host_data)
    assert all(isinstance(leaf, jax.Array) for leaf in placed_data)
    for a, b in zip(reference.get_weights(), distributed.get_weights()):
        np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="TensorFlow's symbolic build")
def test_tensorflow_fit_draws_the_same_batches_as_plain_keras(mirrored):
    """Keras builds models symbolically under tf.distribute by pulling a batch
    from a fresh input iterator on every fit; keras_dist skips that once the
    model is built, so a PyDataset is read as often as in plain Keras."""
    assert _dataset_reads(mirrored(2)) == _dataset_reads(None)


_PLAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras
    if sys.argv[1] == "with":
        import keras_dist
        keras_dist.MirroredStrategy  # the first name used installs the hooks
        assert keras_dist._hooks._installed
    if sys.argv[2] == "keras-data-parallel":  # Keras' own distribution, no keras_dist strategy
        devices = ["cpu:0", "cpu:1"] if keras.config.backend() == "jax" else ["cpu:0"]
        try:
            keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))
        except AttributeError as error:  # this Keras has no distribution on this backend (TF, torch before 3.11)
            print(json.dumps({"unsupported": str(error)}))
            sys.exit(0)
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(0)
    # Keras' DataParallel needs every batch to split evenly (plain Keras too)
    x = rng.normal(size=(200 if sys.argv[2] == "keras-data-parallel" else 203, 8)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"], steps_per_execution=1 if keras.config.backend() == "torch" else 2)  # torch: Keras allows 1
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    logs = model.evaluate(x, y, batch_size=10, verbose=0, return_dict=True)
    prediction = model.predict(x, batch_size=10, verbose=0)
    if tuple(int(p) for p in keras.version().split(".")[:2]) < (3, 16) and sys.argv[2] == "none":
        # Keras' own train_on_batch fails after steps_per_execution=2 in
        # 3.16.dev, and under DataParallel in 3.10 (both on the None sample
        # weights), keras_dist imported or not
        model.train_on_batch(x[:10], y[:10])
    print(json.dumps({
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history, "logs": logs, "prediction": prediction.tolist(),
    }))
    """
)


@pytest.mark.slow("a fresh Python process trains plain Keras (keras_dist never imported) for the bit-for-bit comparison")
@pytest.mark.starts_processes
@pytest.mark.parametrize("distribution", ["none", "keras-data-parallel"])
def test_code_outside_a_strategy_is_plain_keras_bit_for_bit(tmp_path, distribution):
    """keras_dist imported (its hooks installed) or not, a program without a
    keras_dist strategy trains bit for bit the same: plain, and under
    Keras' own `keras.distribution.DataParallel` (JAX: over 2 devices)."""
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN_SCRIPT)
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    if BACKEND == "jax":
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=2").strip()
    results = {}
    for mode in ("without", "with"):
        done = subprocess.run(
            [sys.executable, str(script), mode, distribution], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    if "unsupported" in results["without"]:
        assert results["with"] == results["without"]
        pytest.skip(f"Keras {keras.version()} has no keras.distribution on {BACKEND}: {results['without']['unsupported']}")
    assert results["with"] == results["without"]  # exact, not approximate


@pytest.mark.parametrize("kind", ["save", "save_weights"])
def test_the_chief_s_file_is_whole_or_the_previous_one(mirrored, tmp_path, kind):
    """Under a strategy the chief writes a temporary file, then renames it:
    a write that fails half-way (a full disk, a killed process) leaves the
    previous file, loadable, and no temporary file (plain Keras leaves the
    half-written one in place)."""
    path = tmp_path / ("model.keras" if kind == "save" else "model.weights.h5")
    with mirrored(2).scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
        model.compile(optimizer="sgd", loss="mse")
    getattr(model, kind)(path)
    saved = model.get_weights()
    model.set_weights([w + 1.0 for w in saved])

    def disk_full(store):
        raise OSError("disk full (simulated)")

    model.layers[-1].save_own_variables = disk_full  # the second layer's weights fail to write
    with pytest.raises(OSError, match="disk full"):
        getattr(model, kind)(path)
    assert sorted(os.listdir(tmp_path)) == [path.name]
    if kind == "save":
        plain = keras.saving.load_model(path, compile=False)
    else:
        plain = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.Dense(2)])
        plain.load_weights(path)
    for got, want in zip(plain.get_weights(), saved):
        np.testing.assert_array_equal(got, want)


def test_private_copies_of_file_writing_callbacks(tmp_path):
    """What a non-chief worker runs instead of the user's callbacks."""
    import keras

    user = {
        "filepath": keras.callbacks.ModelCheckpoint(str(tmp_path / "ckpt" / "best.keras")),
        "filename": keras.callbacks.CSVLogger(str(tmp_path / "log.csv")),
        "log_dir": keras.callbacks.TensorBoard(str(tmp_path / "tb") + "/"),
    }
    private = tmp_path / "private"
    for attribute, callback in user.items():
        copy = _files.private_copy(callback, str(private))
        assert copy is not callback
        assert os.path.dirname(getattr(copy, attribute)) == str(private)
        assert str(tmp_path) in getattr(callback, attribute)  # the user's is untouched
    history = keras.callbacks.History()
    assert _files.private_copy(history, str(private)) is history
