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
"""

from __future__ import annotations

from keras_dist import _context


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
