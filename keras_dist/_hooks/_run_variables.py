"""`assign_add`/`assign_sub` inside `strategy.run`.

Keras implements them as ``assign(v + x)``, which loses the increment that
tf.distribute aggregates across replicas: a "sum" variable must get v + the
sum of the replicas' x, not the sum of the replicas' v + x (on TensorFlow,
Keras 3 does exactly that: 4 replicas adding 1 to 10 gave 44, not 14).
Inside `run` the adapter applies the increment with tf's semantics
(`BackendAdapter.assign_delta_in_replica`); everywhere else Keras' own
method runs unchanged.

On a parameter server, inside a function the coordinator scheduled, a
write (`assign` too) is applied once even when the function runs again
after its worker died (`BackendAdapter.assign_on_ps`).
"""

from __future__ import annotations

from keras_dist.backends import get_adapter


def wrap_assign_delta(sign: int):
    """Wrapper maker for `Variable.assign_add` (sign 1) / `assign_sub` (-1)."""

    def make(original):
        def assign_delta(self, value):
            new = get_adapter().assign_delta_in_replica(self, value, sign)
            return original(self, value) if new is None else new

        return assign_delta

    return make


def wrap_assign(original):
    """Wrapper for `Variable.assign`: a ps variable written in a scheduled
    function, once; elsewhere Keras' own."""

    def assign(self, value):
        assign_on_ps = get_adapter().assign_on_ps  # an optional capability
        new = None if assign_on_ps is None else assign_on_ps(self, value)
        return original(self, value) if new is None else new

    return assign
