"""TensorFlow, one process: two logical CPU devices made by hand (not
`simulate_cpu_devices`) and an inter-op pool of THREADS (argv[1]); then
tf.distribute's pattern that hangs with too few threads (plain tf too): an
iterator over a distributed dataset made inside a tf.function, each step a
nested tf.function whose replicas all-reduce. Prints one JSON line."""

import json
import sys

import tensorflow as tf

tf.config.threading.set_inter_op_parallelism_threads(int(sys.argv[1]))
cpu = tf.config.list_physical_devices("CPU")[0]
tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)

import keras_dist  # noqa: E402

strategy = keras_dist.MirroredStrategy(["cpu:0", "cpu:1"])
try:
    with strategy.scope():  # where the engine starts
        w = tf.Variable(tf.ones((4, 1)))
except ValueError as error:
    print(json.dumps({"error": str(error)}))
    sys.exit(0)
dataset = strategy.experimental_distribute_dataset(tf.data.Dataset.from_tensor_slices(tf.ones((32, 4))).batch(8))


@tf.function
def epoch(data):
    @tf.function
    def step(x):
        context = keras_dist.get_replica_context()
        (total,) = context.all_reduce("sum", [tf.reduce_sum(x)])
        w.assign_add(tf.fill((4, 1), total / 1000.0))
        return total

    iterator = iter(data)
    for _ in range(4):
        strategy.run(step, args=(next(iterator),))


epoch(dataset)
print(json.dumps({"error": None, "w": float(w.numpy()[0, 0])}))
