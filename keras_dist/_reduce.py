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
