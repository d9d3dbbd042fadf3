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
from keras_dist import _hooks
from _helpers import compile_model, make_data, mlp, twin, two_heads
from conftest import BACKEND

EXPECTED = {
    "common": [
        "keras.src.trainers.trainer:Trainer.__init__",
        "keras.src.trainers.trainer:Trainer.compile",
        *(f"keras.src.models.model:Model.{name}" for name in _hooks._ENTRY_POINTS),
        "keras.src.losses.loss:Loss.__call__",
        "keras.src.models.model:Model.save",
        "keras.src.callbacks.backup_and_restore:BackupAndRestore._save_model",
        "keras.src.callbacks.backup_and_restore:BackupAndRestore._load_model",
        # per-replica steps (TensorFlow; JAX multi-process CPU)
        "keras.src.losses.loss:scale_loss_for_distribution",
        "keras.src.losses.loss:unscale_loss_for_distribution",
        "keras.src.layers.normalization.batch_normalization:BatchNormalization._moments",
    ],
    "jax": [
        *(f"keras.src.backend.jax.trainer:JAXTrainer.make_{k}_function" for k in ("train", "test", "predict")),
        "keras.src.backend.jax.trainer:_distribute_data",
        "keras.src.trainers.trainer:Trainer._aggregate_additional_loss",
        "keras.src.backend.jax.trainer:JAXTrainer.compute_loss_and_updates",
    ],
    "tensorflow": [
        "keras.src.optimizers.base_optimizer:BaseOptimizer.apply",
        *(
            f"keras.src.backend.tensorflow.trainer:TensorFlowTrainer.make_{k}_function"
            for k in ("train", "test", "predict")
        ),
        "keras.src.backend.tensorflow.trainer:TensorFlowTrainer._maybe_symbolic_build",
    ],
}


def test_exactly_the_expected_hooks_are_installed():
    assert sorted(_hooks.ORIGINALS) == sorted(EXPECTED["common"] + EXPECTED[BACKEND])
    for path, original in _hooks.ORIGINALS.items():
        owner, name = _hooks._resolve(path)
        installed = getattr(owner, name)
        assert installed.__keras_dist_original__ is original, path


def test_every_hook_is_live_in_a_distributed_workload(mirrored, monkeypatch, tmp_path):
    """Count calls to each hook over fit/evaluate/predict/*_on_batch (on JAX
    with the per-replica training step forced on, as multi-process CPU jobs
    take it)."""
    if BACKEND == "jax":
        from keras_dist.backends.jax import _replica_step

        monkeypatch.setattr(_replica_step, "POLICY", "always")
    calls = dict.fromkeys(_hooks.ORIGINALS, 0)
    for path in _hooks.ORIGINALS:
        owner, name = _hooks._resolve(path)
        hook = getattr(owner, name)

        def counting(*args, __hook=hook, __path=path, **kwargs):
            calls[__path] += 1
            return __hook(*args, **kwargs)

        monkeypatch.setattr(owner, name, counting)

    x, y = make_data(43)
    with mirrored(4).scope():
        model = mlp(batch_norm=True, regularizer="l2")
    model.compile(optimizer="sgd", loss="binary_crossentropy", metrics=["accuracy"])
    backup = keras.callbacks.BackupAndRestore(str(tmp_path / "backup"))
    model.fit(x, y, batch_size=10, verbose=0, callbacks=[backup])
    model.evaluate(x, y, batch_size=10, verbose=0)
    model.predict(x, batch_size=10, verbose=0)
    model.train_on_batch(x[:6], y[:6])
    model.test_on_batch(x[:6], y[:6])
    model.predict_on_batch(x[:6])
    model.save(tmp_path / "model.keras")
    assert (tmp_path / "model.keras").exists()  # a single-worker job is its own chief
    with mirrored(4).scope():  # Keras logs a loss per output
        heads = two_heads()
    heads.compile(optimizer="sgd", loss={"a": "binary_crossentropy", "b": "mse"})
    heads.fit(x, {"a": y, "b": y}, batch_size=8, verbose=0)
    never = [path for path, count in calls.items() if count == 0]
    assert not never, f"hooks never called: {never}"


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
    program_for = distributed.train_function.step.program_for
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
    x, y = make_data(40)

    class Counting(keras.utils.PyDataset):
        reads = 0

        def __len__(self):
            return 4

        def __getitem__(self, index):
            Counting.reads += 1
            return x[index * 10 : (index + 1) * 10], y[index * 10 : (index + 1) * 10]

    reads = {}
    for name, strategy in (("plain", None), ("mirrored", mirrored(2))):
        with strategy.scope() if strategy else contextlib.nullcontext():
            model = compile_model(mlp())
        model.fit(Counting(), epochs=1, verbose=0)  # builds everything
        Counting.reads = 0
        model.fit(Counting(), epochs=1, verbose=0)
        reads[name] = Counting.reads
    assert reads["mirrored"] == reads["plain"], reads


_PLAIN_SCRIPT = textwrap.dedent(
    """
    import json, sys
    import numpy as np
    import keras
    if sys.argv[1] == "with":
        import keras_dist  # hooks installed, no strategy used
    keras.utils.set_random_seed(7)
    rng = np.random.default_rng(0)
    x = rng.normal(size=(203, 8)).astype("float32")
    y = (x[:, :1] > 0).astype("float32")
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                              keras.layers.BatchNormalization(), keras.layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"], steps_per_execution=2)
    history = model.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    logs = model.evaluate(x, y, batch_size=10, verbose=0, return_dict=True)
    prediction = model.predict(x, batch_size=10, verbose=0)
    model.train_on_batch(x[:10], y[:10])
    print(json.dumps({
        "weights": [w.tolist() for w in model.get_weights()],
        "history": history, "logs": logs, "prediction": prediction.tolist(),
    }))
    """
)


def test_code_outside_a_strategy_is_plain_keras_bit_for_bit(tmp_path):
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN_SCRIPT)
    env = dict(os.environ, KERAS_BACKEND=BACKEND, TF_CPP_MIN_LOG_LEVEL="3")
    env["PYTHONPATH"] = os.pathsep.join([os.getcwd(), env.get("PYTHONPATH", "")])
    results = {}
    for mode in ("without", "with"):
        done = subprocess.run(
            [sys.executable, str(script), mode], env=env, capture_output=True, text=True, timeout=300
        )
        assert done.returncode == 0, done.stderr[-3000:]
        results[mode] = json.loads(done.stdout.strip().splitlines()[-1])
    assert results["with"] == results["without"]  # exact, not approximate


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
        copy = _hooks._private_copy(callback, str(private))
        assert copy is not callback
        assert os.path.dirname(getattr(copy, attribute)) == str(private)
        assert str(tmp_path) in getattr(callback, attribute)  # the user's is untouched
    history = keras.callbacks.History()
    assert _hooks._private_copy(history, str(private)) is history
