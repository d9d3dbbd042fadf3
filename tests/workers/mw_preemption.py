"""A worker of a preempt-and-resume job, run by `keras-dist launch -n 2
--max-restarts 1`: a custom training loop under MultiWorkerMirroredStrategy,
each step through `PreemptionCheckpointHandler.run`, with the handler's
defaults (SIGTERM, `sys.exit(42)`).

The test sends SIGTERM to one worker while the first attempt trains (each
step sleeps SLEEP seconds in that attempt, so it is mid-training); every
worker must save at the same step and exit 42, and the launcher restarts
the job. The second attempt restores the checkpoint, trains to STEPS, then
trains the same model again without interruption (same strategy, same
initial weights, same batches) and compares the weights.

Files in OUT_DIR (`<a>` the attempt, `<i>` the worker index):
- `pid<a>_<i>`: this process's id, once it trains;
- `progress<a>_<i>`: the run calls done so far (rewritten every step);
- `result<a>_<i>.json`: what it found at start and how training ended;
- `exit<a>_<i>.json`: the code it exited with and its run calls then,
  written by the last exit handler, after the backend has shut down.

argv: OUT_DIR KIND ("model" | "tf_checkpoint") [STEPS, default 40] [DEVICES_PER_WORKER, default 2]
      [SLEEP, default 0.1]
"""

import atexit
import json
import os
import sys
import time

out_dir, kind = sys.argv[1], sys.argv[2]
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 40
DEVICES = int(sys.argv[4]) if len(sys.argv) > 4 else 2
SLEEP = float(sys.argv[5]) if len(sys.argv) > 5 else 0.1
attempt = int(os.environ.get("KERAS_DIST_RESTART", "0"))
index = int(os.environ.get("KERAS_DIST_WORKER_INDEX", "0"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
checkpoint_dir = os.path.join(out_dir, "checkpoints")
ended = {"code": None, "runs": None}


def _write(name, value):
    path = os.path.join(out_dir, name)
    with open(path + ".tmp", "w") as handle:
        json.dump(value, handle)
    os.replace(path + ".tmp", path)


@atexit.register  # registered first: runs last, after the backend's own exit handlers
def _record_exit():
    if ended["code"] is not None:
        _write(f"exit{attempt}_{index}.json", ended)


import numpy as np  # noqa: E402
import keras  # noqa: E402

import keras_dist  # noqa: E402

BACKEND = keras.config.backend()
if BACKEND == "jax":
    import jax
else:
    import tensorflow as tf

keras_dist.simulate_cpu_devices(DEVICES)
strategy = keras_dist.MultiWorkerMirroredStrategy(
    communication_options=keras_dist.CommunicationOptions(timeout_seconds=60)
)
assert strategy.cluster_resolver.worker_index == index
assert strategy.num_replicas_in_sync == 2 * DEVICES

GLOBAL_BATCH = 8
rng = np.random.default_rng(0)
x = rng.normal(size=(10 * GLOBAL_BATCH, 8)).astype("float32")
y = (x[:, :1] - x[:, 2:3] > 0).astype("float32")
batches = [(x[i : i + GLOBAL_BATCH], y[i : i + GLOBAL_BATCH]) for i in range(0, len(x), GLOBAL_BATCH)]
dist_batches = list(strategy.experimental_distribute_dataset(batches))
loss_object = keras.losses.BinaryCrossentropy(reduction="none")


def make():
    """A model and its optimizer, in the scope; the same weights every time."""
    with strategy.scope():
        keras.utils.set_random_seed(7)
        model = keras.Sequential(
            [keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1, activation="sigmoid")]
        )
        optimizer = keras.optimizers.Adam(0.01)
        optimizer.build(model.trainable_variables)
        model.compile(optimizer=optimizer)  # so that the model's checkpoint holds the optimizer's state
    return model, optimizer


def train_step_for(model, optimizer):
    """One distributed step: the custom loop of guides/custom_training_loops.md."""
    if BACKEND == "tensorflow":

        def replica_step(inputs):
            features, labels = inputs
            with tf.GradientTape() as tape:
                loss = keras_dist.compute_average_loss(loss_object(labels, model(features, training=True)))
            gradients = tape.gradient(loss, model.trainable_variables)
            optimizer.apply_gradients(zip(gradients, model.trainable_variables))
            return loss

        @tf.function
        def step(dist_inputs):
            return strategy.reduce("SUM", strategy.run(replica_step, args=(dist_inputs,)), axis=None)

        return step

    groups = (model.trainable_variables, model.non_trainable_variables, optimizer.variables)

    def replica_step(state, inputs):
        trainable, non_trainable, optimizer_state = state
        features, labels = inputs

        def loss_fn(trainable):
            predictions, non_trainable_out = model.stateless_call(trainable, non_trainable, features, training=True)
            return keras_dist.compute_average_loss(loss_object(labels, predictions)), non_trainable_out

        (loss, non_trainable), gradients = jax.value_and_grad(loss_fn, has_aux=True)(trainable)
        trainable, optimizer_state = optimizer.stateless_apply(optimizer_state, gradients, trainable)
        return (trainable, non_trainable, optimizer_state), loss

    @jax.jit
    def jitted(state, dist_inputs):
        state, losses = strategy.run(replica_step, args=(state, dist_inputs))
        return state, strategy.reduce("SUM", losses, axis=None)

    def step(dist_inputs):
        state = tuple([v.value for v in group] for group in groups)
        state, loss = jitted(state, dist_inputs)
        for group, values in zip(groups, state):  # the variables hold the state at every step
            for variable, value in zip(group, values):
                variable.assign(value)
        return loss

    return step


def main():
    model, optimizer = make()
    step = train_step_for(model, optimizer)
    if kind == "model":
        checkpoint = model
    else:
        checkpoint = tf.train.Checkpoint(model=model, optimizer=optimizer)
    found = sorted(os.listdir(checkpoint_dir)) if os.path.isdir(checkpoint_dir) else []
    handler = keras_dist.experimental.PreemptionCheckpointHandler(strategy.cluster_resolver, checkpoint, checkpoint_dir)
    start = handler.total_run_calls
    result = {"worker": index, "attempt": attempt, "found": found, "start_runs": start}
    from keras_dist.backends import get_adapter

    (rows,) = get_adapter().values_from_every_worker([np.array([index, 10 + index], np.int32)])
    result["every_worker"] = rows.tolist()
    _write(f"pid{attempt}_{index}", os.getpid())
    try:
        while handler.total_run_calls < STEPS:
            handler.run(step, dist_batches[handler.total_run_calls % len(dist_batches)])
            with open(os.path.join(out_dir, f"progress{attempt}_{index}"), "w") as handle:
                handle.write(str(handler.total_run_calls))
            if attempt == 0:
                time.sleep(SLEEP)
    except SystemExit as exit_:
        ended.update(code=exit_.code, runs=handler.total_run_calls)
        raise
    result["end_runs"] = handler.total_run_calls

    # The same training without interruption, in this job: same strategy,
    # initial weights and batches.
    reference, reference_optimizer = make()
    reference_step = train_step_for(reference, reference_optimizer)
    for run in range(STEPS):
        # Read each step's loss (as a loop that logs it does): on JAX, 40
        # steps dispatched with nothing read back hung in 2 of 7 runs at
        # load average 6-11 on 2 cores (both workers blocked dispatching a
        # step, the queue of steps in flight stuck in XLA's CPU collectives);
        # reading the loss each step: 9 of 9 passed. guides/multi_worker.md.
        float(reference_step(dist_batches[run % len(dist_batches)]))
    result["weight_diff"] = max(
        float(np.max(np.abs(a - b))) for a, b in zip(model.get_weights(), reference.get_weights())
    )
    result["iterations"] = [int(keras.ops.convert_to_numpy(o.iterations)) for o in (optimizer, reference_optimizer)]
    _write(f"result{attempt}_{index}.json", result)
    ended.update(code=0, runs=handler.total_run_calls)
    print(json.dumps(result), flush=True)


main()
