"""Cross-device ops: validated values; every choice a backend takes trains
exactly like one device; a clear error for every choice it cannot honour.

(That each choice really changes the compiled step is checked in
test_fused_allreduce.py.)"""

import numpy as np
import pytest
import keras

import keras_dist
from _helpers import assert_same_logs, make_data, max_weight_diff, twin
from conftest import BACKEND

def _add_n():
    import tensorflow as tf

    return tf.math.add_n


#: name -> factory of every choice each backend must take.
ON_ANY_BACKEND = {
    "None": lambda: None,
    "HierarchicalCopyAllReduce()": lambda: keras_dist.HierarchicalCopyAllReduce(),
    "HierarchicalCopyAllReduce(0)": lambda: keras_dist.HierarchicalCopyAllReduce(num_packs=0),
    "ReductionToOneDevice()": lambda: keras_dist.ReductionToOneDevice(),
}
TENSORFLOW_ONLY = {
    "HierarchicalCopyAllReduce(2)": lambda: keras_dist.HierarchicalCopyAllReduce(num_packs=2),
    "HierarchicalCopyAllReduce(3)": lambda: keras_dist.HierarchicalCopyAllReduce(num_packs=3),
    "ReductionToOneDevice(cpu:3)": lambda: keras_dist.ReductionToOneDevice(reduce_to_device="/cpu:3"),
    "ReductionToOneDevice(add_n)": lambda: keras_dist.ReductionToOneDevice(accumulation_fn=_add_n()),
}
CHOICES = dict(ON_ANY_BACKEND, **(TENSORFLOW_ONLY if BACKEND == "tensorflow" else {}))


# -- the values -------------------------------------------------------------


def test_values_mirror_tf_distribute():
    assert keras_dist.NcclAllReduce().num_packs == 1
    assert keras_dist.HierarchicalCopyAllReduce(num_packs=0).num_packs == 0
    one = keras_dist.ReductionToOneDevice(reduce_to_device="/job:localhost/replica:0/task:0/device:GPU:1")
    assert one.reduce_to_device == "gpu:1" and one.accumulation_fn is None
    assert keras_dist.NcclAllReduce(2) == keras_dist.NcclAllReduce(num_packs=2)
    assert keras_dist.NcclAllReduce(2) != keras_dist.HierarchicalCopyAllReduce(2)
    assert repr(keras_dist.HierarchicalCopyAllReduce(0)) == "HierarchicalCopyAllReduce(num_packs=0)"
    for ops in (keras_dist.NcclAllReduce(), keras_dist.HierarchicalCopyAllReduce(), one):
        assert isinstance(ops, keras_dist.CrossDeviceOps)
        assert hash(ops) == hash(type(ops)(*ops._values()))


@pytest.mark.parametrize("num_packs", [-1, True, 1.0, "2", None])
@pytest.mark.parametrize("kind", [keras_dist.NcclAllReduce, keras_dist.HierarchicalCopyAllReduce])
def test_num_packs_must_be_a_non_negative_integer(kind, num_packs):
    with pytest.raises(ValueError, match=rf"{kind.__name__}\(num_packs=...\) must be an integer >= 0"):
        kind(num_packs=num_packs)


def test_reduction_to_one_device_arguments_are_checked():
    with pytest.raises(ValueError, match="Cannot parse device name 'gpu0'"):
        keras_dist.ReductionToOneDevice(reduce_to_device="gpu0")
    with pytest.raises(TypeError, match="Device names must be strings"):
        keras_dist.ReductionToOneDevice(reduce_to_device=0)
    with pytest.raises(TypeError, match="accumulation_fn=...\\) must be a callable"):
        keras_dist.ReductionToOneDevice(accumulation_fn=1)


def test_the_base_class_is_not_a_choice():
    with pytest.raises(TypeError, match="CrossDeviceOps is the base class"):
        keras_dist.CrossDeviceOps()


# -- the strategy takes them ------------------------------------------------


def test_nccl_needs_gpus():
    with pytest.raises(ValueError, match=r"NcclAllReduce runs NCCL, which needs GPUs.*HierarchicalCopyAllReduce"):
        keras_dist.MirroredStrategy(cross_device_ops=keras_dist.NcclAllReduce())


#: The variants of a choice (other pack counts, another device, another sum)
#: are make test-extended's; make test runs each kind once.
_VARIANT = pytest.mark.extended("a variant of a choice make test runs (its default arguments)")
VARIANTS = {"HierarchicalCopyAllReduce(2)", "HierarchicalCopyAllReduce(3)", "ReductionToOneDevice(cpu:3)", "ReductionToOneDevice(add_n)"}


@pytest.mark.parametrize(
    "choice", [pytest.param(choice, marks=_VARIANT) if choice in VARIANTS else choice for choice in sorted(CHOICES)]
)
def test_each_choice_trains_like_one_device(choice):
    strategy = keras_dist.MirroredStrategy(cross_device_ops=CHOICES[choice]())  # 4 replicas
    x, y = make_data(43)  # batches of 10 on 4 replicas, a partial last batch of 3
    reference, distributed = twin(strategy, optimizer="sgd", batch_norm=True)
    expected = reference.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    actual = distributed.fit(x, y, batch_size=10, epochs=2, shuffle=False, verbose=0).history
    assert max_weight_diff(reference, distributed) <= 1e-6
    for epoch in range(2):
        assert_same_logs(
            {k: v[epoch] for k, v in expected.items()}, {k: v[epoch] for k, v in actual.items()}, atol=1e-6
        )


@pytest.mark.parametrize("choice", sorted(ON_ANY_BACKEND))
def test_replica_context_all_reduce_with_each_choice(choice):
    strategy = keras_dist.MirroredStrategy(cross_device_ops=ON_ANY_BACKEND[choice]())
    batches = strategy.experimental_distribute_dataset([np.arange(8, dtype="float32").reshape(8, 1)])
    (batch,) = list(batches)

    def step(rows):
        context = keras_dist.get_replica_context()
        return context.all_reduce("SUM", keras.ops.sum(rows))

    totals = strategy.experimental_local_results(strategy.run(step, args=(batch,)))
    assert [float(keras.ops.convert_to_numpy(t)) for t in totals] == [28.0] * len(totals)


@pytest.mark.skipif(BACKEND != "jax", reason="what XLA can and cannot do")
def test_jax_refuses_what_xla_cannot_do():
    with pytest.raises(ValueError, match=r"num_packs=2\) cannot be honoured on JAX.*num_packs=0"):
        keras_dist.MirroredStrategy(cross_device_ops=keras_dist.HierarchicalCopyAllReduce(num_packs=2))
    for ops in (
        keras_dist.ReductionToOneDevice(reduce_to_device="cpu:0"),
        keras_dist.ReductionToOneDevice(accumulation_fn=sum),
    ):
        with pytest.raises(ValueError, match=r"TensorFlow-engine settings.*ReductionToOneDevice\(\) on JAX"):
            keras_dist.MirroredStrategy(cross_device_ops=ops)


@pytest.mark.skipif(BACKEND != "tensorflow", reason="tf.distribute's own limits")
def test_tensorflow_refuses_what_tf_distribute_gets_wrong():
    import tensorflow as tf

    # TF's hierarchical copy drops a replica's values with an odd device count
    with pytest.raises(ValueError, match=r"needs an even number of devices.*has 3"):
        keras_dist.MirroredStrategy(["cpu:0", "cpu:1", "cpu:2"], cross_device_ops=keras_dist.HierarchicalCopyAllReduce())
    keras_dist.MirroredStrategy(["cpu:0"], cross_device_ops=keras_dist.HierarchicalCopyAllReduce())
    with pytest.raises(ValueError, match=r"\['cpu:7'\] are not visible"):
        keras_dist.MirroredStrategy(cross_device_ops=keras_dist.ReductionToOneDevice("cpu:7"))
    # tf's own NcclAllReduce is taken as keras_dist's (tests/test_tf_objects.py): NCCL needs GPUs
    with pytest.raises(ValueError, match=r"NcclAllReduce runs NCCL, which needs GPUs"):
        keras_dist.MirroredStrategy(cross_device_ops=tf.distribute.NcclAllReduce())
