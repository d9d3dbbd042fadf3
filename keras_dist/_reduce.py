"""`ReduceOp`: how values from several replicas are combined."""

from __future__ import annotations

import enum

from keras_dist import _foreign


class ReduceOp(enum.Enum):
    """How to combine per-replica values (tf.distribute names).

    >>> ReduceOp.from_value("sum") is ReduceOp.SUM
    True
    """

    SUM = "SUM"
    MEAN = "MEAN"

    @classmethod
    def from_value(cls, value: "ReduceOp | str") -> "ReduceOp":
        """Accepts a `ReduceOp`, the strings "SUM"/"MEAN" (any case), or on
        the TensorFlow backend `tf.distribute.ReduceOp.SUM`/`MEAN`."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str):
            try:
                return cls[value.upper()]
            except KeyError:
                pass
        translated = _foreign.accept(value, "reduce_op")
        if isinstance(translated, cls):
            return translated
        raise ValueError(
            f"Unknown reduce op {value!r}. Use keras_dist.ReduceOp.SUM or "
            "keras_dist.ReduceOp.MEAN (or the strings 'SUM' / 'MEAN')."
        )


def check_summable(reduce_op: ReduceOp, num_replicas: int) -> None:
    """tf refuses to SUM a value the strategy never distributed over several
    replicas (which copies would it add?); every backend says so the same way."""
    if reduce_op is ReduceOp.SUM and num_replicas > 1:
        raise ValueError(
            f"Cannot SUM a value that is not distributed across {num_replicas} "
            "replicas (tf refuses it too: it is not a PerReplica value). Reduce "
            "what strategy.run returned, or use ReduceOp.MEAN, which gives the value back."
        )
