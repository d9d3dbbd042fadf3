"""Loops over a replica's data inside `strategy.run`: Keras' recurrent layers.

On JAX, `run` maps the function over replicas with `shard_map`, which types
every value by whether it varies across replicas. An RNN's scan starts from
a state equal on every replica (zeros) and ends each step with a state made
from the replica's own rows, so JAX refused LSTM, GRU and SimpleRNN there
("scan body function carry input and carry output must have equal types").
The initial state is marked varying first (its values unchanged), through
the replica context (`ReplicaOps.loop_carry`), in the backend's generic
`rnn` and in its own `gru` (a scan of its own in recent Keras, 3.15 among
them; in older ones a NotImplementedError stub, and GRU falls back to
`rnn`).
Outside `run` Keras' own runs.

A stateful recurrent layer (`stateful=True`) keeps its state as variables
with one row per row of the global batch. Where a step splits that batch
over replicas (TensorFlow's steps, JAX's multi-process ones, `run` on
several replicas) each replica would start from every row's state: on
TensorFlow that failed deep in the graph (`BroadcastGradientArgs`), so it
is one clear error first. JAX's single-process steps see the global batch
and train it as one device does.
"""

from __future__ import annotations

from keras_dist import _context, _shard
from keras_dist.backends import backend_name


def _loop_start(state):
    """`state` fit to start a loop inside `run`; itself elsewhere."""
    context = _context.replica_context()
    return state if context is None else context._loop_carry(state)


def wrap_rnn(original):
    """Wrapper for the backend's `rnn(step_function, inputs, initial_states, ...)`."""

    def rnn(step_function, inputs, initial_states, *args, **kwargs):
        return original(step_function, inputs, _loop_start(initial_states), *args, **kwargs)

    return rnn


def wrap_gru(original):
    """Wrapper for the backend's `gru(inputs, initial_state, mask, ...)`."""

    def gru(inputs, initial_state, *args, **kwargs):
        return original(inputs, _loop_start(initial_state), *args, **kwargs)

    return gru


def _replicas_splitting_the_batch() -> int:
    """How many replicas the step being traced splits the global batch over."""
    shard = _shard.current()
    if shard is not None:
        return shard.replicas
    context = _context.replica_context()
    return 1 if context is None else context.num_replicas_in_sync


def wrap_rnn_layer_call(original):
    """Wrapper for `RNN.call`: a stateful layer split over replicas is refused."""

    def call(self, sequences, initial_state=None, *args, **kwargs):
        if getattr(self, "stateful", False) and initial_state is None:
            replicas = _replicas_splitting_the_batch()
            if replicas > 1:
                raise ValueError(
                    f"Layer '{self.name}' is stateful (stateful=True): its state holds one row per row of the global "
                    f"batch, and this step splits the batch over {replicas} replicas, which keras_dist cannot do on "
                    f"the {backend_name()} backend. Train it on one replica (OneDeviceStrategy, or a strategy of one "
                    "device), with stateful=False, or (one process) on the JAX backend, which trains it as one device."
                )
        return original(self, sequences, initial_state, *args, **kwargs)

    return call
