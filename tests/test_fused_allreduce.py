"""Gradient all-reduce is fused: one cross-replica reduction per step for
all gradients (unbounded packing), not one per variable. Checked in the
compiled program: XLA's HLO on JAX, the traced graph on TensorFlow. The
cross-device ops choices really change that program: ``num_packs`` sets the
packing on both backends, and on TensorFlow the summing ops are the chosen
class's."""

import re

import numpy as np
import pytest
import keras

import keras_dist
from conftest import BACKEND, jax_train_step


def _gradient_sizes(model):
    return sorted(int(np.prod(v.shape)) for v in model.trainable_variables)


def _jax_all_reduce_operands(strategy, model, x, y):
    """The f32 operand sizes of each all-reduce of the compiled train step."""
    state = model._get_jax_state(
        trainable_variables=True, non_trainable_variables=True, optimizer_variables=True, metrics_variables=True
    )
    program, data = jax_train_step(model).program_for((x, y))  # the program this batch runs
    hlo = program.lower(state, data).compile().as_text()
    all_reduces = [line for line in hlo.splitlines() if re.search(r"\ball-reduce(-start)?\(", line)]
    operands = []
    for line in all_reduces:
        result_type = line.split(" = ", 1)[1].split(" all-reduce", 1)[0]
        shapes = re.findall(r"f32\[([\d,]*)\]", result_type)
        operands.append([int(np.prod([int(d) for d in shape.split(",") if d])) for shape in shapes])
    return operands


def _mlp_fit(strategy):
    with strategy.scope():
        model = keras.Sequential(
            [
                keras.Input((32,)),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(64, activation="relu"),
                keras.layers.Dense(10),
            ]
        )
        model.compile("adam", keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    x = np.random.default_rng(0).random((64, 32), dtype=np.float32)
    y = np.arange(64) % 10
    model.fit(x, y, batch_size=64, epochs=1, verbose=0)
    return model, x, y


@pytest.mark.skipif(BACKEND != "jax", reason="inspects XLA HLO of the JAX step")
@pytest.mark.parametrize("ops", [None, keras_dist.HierarchicalCopyAllReduce(num_packs=1)], ids=repr)
def test_jax_step_has_one_all_reduce_for_all_gradients(mirrored, ops):
    strategy = keras_dist.MirroredStrategy(mirrored(4).extended.worker_devices, cross_device_ops=ops)
    model, x, y = _mlp_fit(strategy)
    # even batches enter the step as host arrays, uneven ones pre-placed:
    # two programs, both fused
    for rows in (64, 62):
        operands = _jax_all_reduce_operands(strategy, model, x[:rows], y[:rows])
        assert len(operands) == 1, (rows, operands)
        for size in _gradient_sizes(model):  # every gradient rides in it
            assert size in operands[0], (rows, size, operands)


@pytest.mark.skipif(BACKEND != "jax", reason="inspects XLA HLO of the JAX step")
def test_jax_per_replica_step_sums_all_gradients_as_one_flat_buffer(mirrored, per_replica_step):
    """The multi-process CPU step (forced on here): gloo runs each operand of
    an all-reduce as its own collective, so the gradients travel as ONE
    buffer, not one operand per variable."""
    strategy = mirrored(4)
    model, x, y = _mlp_fit(strategy)
    step = jax_train_step(model)
    assert step.program_for((x, y))[0] is step.replica_program
    operands = _jax_all_reduce_operands(strategy, model, x, y)
    assert len(operands) == 1, operands  # XLA combines it with the metrics' sum
    assert sum(_gradient_sizes(model)) in operands[0], operands
    assert len(operands[0]) == 2, operands  # gradients + the loss tracker's total and count


@pytest.mark.skipif(BACKEND != "jax", reason="inspects XLA HLO of the JAX step")
@pytest.mark.parametrize(
    "ops", [keras_dist.HierarchicalCopyAllReduce(num_packs=0), keras_dist.ReductionToOneDevice()], ids=repr
)
def test_jax_unpacked_choices_give_one_all_reduce_per_gradient(ops):
    strategy = keras_dist.MirroredStrategy(cross_device_ops=ops)
    model, x, y = _mlp_fit(strategy)
    operands = _jax_all_reduce_operands(strategy, model, x, y)
    assert all(len(sizes) == 1 for sizes in operands), operands  # nothing packed
    singles = sorted(sizes[0] for sizes in operands)
    for size in _gradient_sizes(model):
        singles.remove(size)  # each gradient has its own all-reduce
    assert singles == [1], singles  # and the loss its own


@pytest.mark.skipif(BACKEND != "tensorflow", reason="inspects the TF graph")
def test_tensorflow_step_packs_gradients_into_one_collective_per_replica(mirrored):
    import tensorflow as tf

    strategy = mirrored(4)
    model, x, y = _mlp_fit(strategy)
    step = model.train_function.one_step  # the StepFunction's compiled step
    concrete = step.get_concrete_function(
        (tf.TensorSpec((None, 32), tf.float32), tf.TensorSpec((None,), tf.int64))
    )
    collectives = [op for op in concrete.graph.get_operations() if op.type.startswith("CollectiveReduce")]
    gradient_elements = sum(int(np.prod(v.shape)) for v in model.trainable_variables)
    sizes = [op.inputs[0].shape.num_elements() for op in collectives]
    # one packed collective per replica carries every gradient element
    assert sizes.count(gradient_elements) == strategy.num_replicas_in_sync, sizes
    # and no collective per variable
    per_variable = {int(np.prod(v.shape)) for v in model.trainable_variables}
    assert not per_variable & set(sizes), sizes


def _tf_reduction_ops(strategy, model):
    import tensorflow as tf

    step = model.train_function.one_step  # the StepFunction's compiled step
    concrete = step.get_concrete_function(
        (tf.TensorSpec((None, 32), tf.float32), tf.TensorSpec((None,), tf.int64))
    )
    return concrete.graph.get_operations()


@pytest.mark.skipif(BACKEND != "tensorflow", reason="inspects the TF graph")
@pytest.mark.parametrize("num_packs, packs", [(1, 1), (2, 2), (0, None)])
def test_tensorflow_hierarchical_copy_packs_gradients_into_num_packs(num_packs, packs):
    strategy = keras_dist.MirroredStrategy(cross_device_ops=keras_dist.HierarchicalCopyAllReduce(num_packs))
    model, _, _ = _mlp_fit(strategy)
    operations = _tf_reduction_ops(strategy, model)
    assert not [op for op in operations if op.type.startswith("Collective")]  # not TF's default
    sums = [op.inputs[0].shape.num_elements() for op in operations if op.type == "AddN"]
    gradient_elements = sum(_gradient_sizes(model))
    # the loss metric's total and count (2 scalars) are summed the same way
    assert sum(_gradient_sizes(model)) > 2 and min(_gradient_sizes(model)) > 2
    big = sorted(size for size in sums if size > 2)
    if packs is None:  # one sum per gradient (x 3: two halves, then across)
        assert big == sorted(_gradient_sizes(model) * 3), big
    else:  # the packs' sums together carry every gradient element once
        assert len(big) == 3 * packs and sum(big) == 3 * gradient_elements, big


@pytest.mark.skipif(BACKEND != "tensorflow", reason="inspects the TF graph")
def test_tensorflow_reduction_to_one_device_sums_each_gradient_on_one_device():
    strategy = keras_dist.MirroredStrategy(cross_device_ops=keras_dist.ReductionToOneDevice("cpu:2"))
    model, _, _ = _mlp_fit(strategy)
    operations = _tf_reduction_ops(strategy, model)
    assert not [op for op in operations if op.type.startswith("Collective")]
    sums = [op for op in operations if op.type == "AddN"]
    sizes = sorted(op.inputs[0].shape.num_elements() for op in sums)
    assert [s for s in sizes if s > 1] == _gradient_sizes(model)
    assert {op.device.rsplit(":", 1)[-1] for op in sums} == {"2"}, {op.device for op in sums}
