"""TensorFlow's checkpoints for `PreemptionCheckpointHandler`: a
`tf.train.Checkpoint` or `tf.train.CheckpointManager`, kept as tf's handler
keeps them.

The run count travels inside the checkpoint, in a variable attached to it as
`checkpointed_runs` (tf's name). A `tf.train.Checkpoint` gets a
`tf.train.CheckpointManager` over `checkpoint_dir` keeping one checkpoint
(tf's); a given manager keeps its own policy. tf commits a checkpoint by
rewriting its `checkpoint` state file atomically once the data is written,
so a process killed mid-write leaves the previous one. A non-chief writes
through a manager of its own over the private directory it is given.
"""

from __future__ import annotations

import os

import tensorflow as tf

from keras_dist._checkpoint_stores import CheckpointStore
from keras_dist._preemption import TerminationConfig

#: The checkpoint's attribute holding the run count (tf's name for it).
_RUNS = "checkpointed_runs"
_RUNS_KEY = f"{_RUNS}/.ATTRIBUTES/VARIABLE_VALUE"


class TFCheckpointStore(CheckpointStore):
    def __init__(self, value):
        self._value = value
        self._manager = None
        self._checkpoint = None
        self._runs = None

    def open(self, checkpoint_dir):
        if isinstance(self._value, tf.train.CheckpointManager):
            self._manager = self._value
            self._checkpoint = self._value.checkpoint
        else:
            if not checkpoint_dir:
                raise ValueError(
                    "PreemptionCheckpointHandler: when a tf.train.Checkpoint is passed, a "
                    "checkpoint_dir must be passed as well (as tf requires)."
                )
            self._checkpoint = self._value
            self._manager = tf.train.CheckpointManager(self._value, os.fspath(checkpoint_dir), max_to_keep=1)
        self.directory = self._manager.directory
        runs = getattr(self._checkpoint, _RUNS, None)
        if runs is None:
            runs = tf.Variable(0, dtype=tf.int64, trainable=False, name=_RUNS)
            setattr(self._checkpoint, _RUNS, runs)
        self._runs = runs

    def latest(self):
        path = self._manager.latest_checkpoint
        if path is None:
            return None
        reader = tf.train.load_checkpoint(path)
        runs = int(reader.get_tensor(_RUNS_KEY)) if reader.has_tensor(_RUNS_KEY) else 0
        return runs, os.path.basename(path)

    def restore(self, name):
        self._checkpoint.restore(os.path.join(self.directory, name))

    def note_runs(self, runs):
        self._runs.assign(runs)

    def save(self, runs, directory, args, kwargs):
        self._runs.assign(runs)
        manager = self._manager
        if directory is not None:
            manager = tf.train.CheckpointManager(self._checkpoint, directory, max_to_keep=1)
        return manager.save(*args, **kwargs)


def checkpoint_store(value):
    """keras_dist's store for tf's checkpoint objects, or None."""
    if isinstance(value, (tf.train.Checkpoint, tf.train.CheckpointManager)):
        return TFCheckpointStore(value)
    return None


def termination_config(value):
    """keras_dist's TerminationConfig for tf's, the same four fields."""
    if isinstance(value, tf.distribute.experimental.TerminationConfig):
        return TerminationConfig(
            termination_watcher_fn=value.termination_watcher_fn,
            exit_fn=value.exit_fn,
            grace_period=value.grace_period,
            save_fn=value.save_fn,
        )
    return None
