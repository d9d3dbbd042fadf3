"""Worker: tensorflow.org `tutorials/distribute/multi_worker_with_ctl`'s
`main.py` (its `mnist.py` is mnist.py here), as written but for these
changes:

- renamed: `tf.distribute` -> `keras_dist`, `tf.keras` -> `keras`, and
  `tf.nn.compute_average_loss`/`scale_regularization_loss` -> keras_dist's;
- Keras 3 spellings where Keras 3 requires them:
  `reduction=tf.keras.losses.Reduction.NONE` -> `reduction="none"`,
  `train_accuracy.reset_states()` -> `reset_state()`;
- at the end, a report for the test: `OUT_DIR/worker<i>.json` with the
  printed epoch lines, the epoch and step counters and a hash of the
  weights.

    TF_CONFIG=... mw_ctl_tutorial.py OUT_DIR

TensorFlow backend only: the step is `tf.function`/`GradientTape` code.
"""

import hashlib
import os
import json
import sys

import numpy as np
import tensorflow as tf
import keras

import keras_dist
import mnist
from multiprocessing import util

per_worker_batch_size = 64
tf_config = json.loads(os.environ["TF_CONFIG"])
num_workers = len(tf_config["cluster"]["worker"])
global_batch_size = per_worker_batch_size * num_workers

num_epochs = 3
num_steps_per_epoch = 70


# Checkpoint saving and restoring
def _is_chief(task_type, task_id, cluster_spec):
    return (
        task_type is None
        or task_type == "chief"
        or (task_type == "worker" and task_id == 0 and "chief" not in cluster_spec.as_dict())
    )


def _get_temp_dir(dirpath, task_id):
    base_dirpath = "workertemp_" + str(task_id)
    temp_dir = os.path.join(dirpath, base_dirpath)
    tf.io.gfile.makedirs(temp_dir)
    return temp_dir


def write_filepath(filepath, task_type, task_id, cluster_spec):
    dirpath = os.path.dirname(filepath)
    base = os.path.basename(filepath)
    if not _is_chief(task_type, task_id, cluster_spec):
        dirpath = _get_temp_dir(dirpath, task_id)
    return os.path.join(dirpath, base)


checkpoint_dir = os.path.join(util.get_temp_dir(), "ckpt")

# Define Strategy
strategy = keras_dist.MultiWorkerMirroredStrategy()

with strategy.scope():
    # Model building/compiling need to be within `tf.distribute.Strategy.scope`.
    multi_worker_model = mnist.build_cnn_model()

    multi_worker_dataset = strategy.distribute_datasets_from_function(
        lambda input_context: mnist.dataset_fn(global_batch_size, input_context)
    )
    optimizer = keras.optimizers.RMSprop(learning_rate=0.001)
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")


@tf.function
def train_step(iterator):
    """Training step function."""

    def step_fn(inputs):
        """Per-Replica step function."""
        x, y = inputs
        with tf.GradientTape() as tape:
            predictions = multi_worker_model(x, training=True)
            per_example_loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, reduction="none")(
                y, predictions
            )
            loss = keras_dist.compute_average_loss(per_example_loss)
            model_losses = multi_worker_model.losses
            if model_losses:
                loss += keras_dist.scale_regularization_loss(tf.add_n(model_losses))

        grads = tape.gradient(loss, multi_worker_model.trainable_variables)
        optimizer.apply_gradients(zip(grads, multi_worker_model.trainable_variables))
        train_accuracy.update_state(y, predictions)

        return loss

    per_replica_losses = strategy.run(step_fn, args=(next(iterator),))
    return strategy.reduce(keras_dist.ReduceOp.SUM, per_replica_losses, axis=None)


epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="epoch")
step_in_epoch = tf.Variable(initial_value=tf.constant(0, dtype=tf.dtypes.int64), name="step_in_epoch")

task_type, task_id, cluster_spec = (
    strategy.cluster_resolver.task_type,
    strategy.cluster_resolver.task_id,
    strategy.cluster_resolver.cluster_spec(),
)

checkpoint = tf.train.Checkpoint(model=multi_worker_model, epoch=epoch, step_in_epoch=step_in_epoch)

write_checkpoint_dir = write_filepath(checkpoint_dir, task_type, task_id, cluster_spec)
checkpoint_manager = tf.train.CheckpointManager(checkpoint, directory=write_checkpoint_dir, max_to_keep=1)

# Restoring the checkpoint
latest_checkpoint = tf.train.latest_checkpoint(checkpoint_dir)
if latest_checkpoint:
    checkpoint.restore(latest_checkpoint)

lines = []  # (the test's report)
# Resume our CTL training
while epoch.numpy() < num_epochs:
    iterator = iter(multi_worker_dataset)
    total_loss = 0.0
    num_batches = 0

    while step_in_epoch.numpy() < num_steps_per_epoch:
        total_loss += train_step(iterator)
        num_batches += 1
        step_in_epoch.assign_add(1)

    train_loss = total_loss / num_batches
    print("Epoch: %d, accuracy: %f, train_loss: %f." % (epoch.numpy(), train_accuracy.result(), train_loss))
    lines.append([int(epoch.numpy()), float(train_accuracy.result()), float(train_loss)])

    train_accuracy.reset_state()

    checkpoint_manager.save()
    if not _is_chief(task_type, task_id, cluster_spec):
        tf.io.gfile.rmtree(write_checkpoint_dir)

    epoch.assign_add(1)
    step_in_epoch.assign(0)

# ---- the test's report
weights = multi_worker_model.get_weights()
report = {
    "task": [task_type, task_id],
    "epochs": lines,
    "counters": [int(epoch.numpy()), int(step_in_epoch.numpy()), int(optimizer.iterations.numpy())],
    "chief_checkpoint": sorted(os.listdir(checkpoint_dir)) if _is_chief(task_type, task_id, cluster_spec) else None,
    "non_chief_temp_dir_left": None if _is_chief(task_type, task_id, cluster_spec) else os.path.exists(write_checkpoint_dir),
    "weights_sha256": hashlib.sha256(b"".join(np.ascontiguousarray(w).tobytes() for w in weights)).hexdigest(),
}
path = os.path.join(sys.argv[1], f"worker{tf_config['task']['index']}.json")
with open(path + ".tmp", "w") as handle:
    json.dump(report, handle)
os.replace(path + ".tmp", path)
