"""Two in-process clusters (the tf tutorial's `create_in_process_cluster`)
in one process coordinating both: the first's 2 workers get 3 inter-op
threads each, the second's 2, too few (plain tf.distribute hangs in
`join`). Prints one JSON line: what `fit` did on each."""

import json
import socket
import time

import keras
import numpy as np
import tensorflow as tf

import keras_dist


def port():
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def cluster(threads):
    spec = keras_dist.cluster_resolver.ClusterSpec(
        {"worker": [f"localhost:{port()}" for _ in range(2)], "ps": [f"localhost:{port()}"]}
    )
    config = tf.compat.v1.ConfigProto()
    config.inter_op_parallelism_threads = threads
    for i in range(2):
        keras_dist.Server(spec, job_name="worker", task_index=i, config=config, protocol="grpc")
    keras_dist.Server(spec, job_name="ps", task_index=0, protocol="grpc")
    return keras_dist.cluster_resolver.SimpleClusterResolver(spec, rpc_layer="grpc")


def dataset_fn(context):
    x = np.random.RandomState(0).rand(64, 4).astype("float32")
    return tf.data.Dataset.from_tensor_slices((x, x.sum(1, keepdims=True))).repeat().batch(8)


def fit(threads):
    strategy = keras_dist.ParameterServerStrategy(cluster(threads))
    with strategy.scope():
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8), keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
    before = [w.copy() for w in model.get_weights()]
    start = time.time()
    try:
        model.fit(keras_dist.experimental.DatasetCreator(dataset_fn), epochs=2, steps_per_epoch=10, verbose=0)
        error = None
    except ValueError as e:
        error = str(e)
    changed = [not np.array_equal(a, b) for a, b in zip(before, model.get_weights())]
    return {"error": error, "seconds": time.time() - start, "changed": changed,
            "iterations": int(model.optimizer.iterations.numpy())}


# enough first: a process whose first cluster's workers had too few threads
# hung in the second cluster's fit too (tf's servers cannot be stopped)
enough = fit(3)
print(json.dumps({"enough": enough, "too_few": fit(2)}))
