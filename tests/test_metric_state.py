"""keras_dist._metric_state: metric variables and logs over all replicas,
the core pieces both backends' per-replica steps call with their own
all-reduce. Here the replicas are simulated: each replica's call records
what it would all-reduce, and a second call gets the sums."""

import numpy as np
import pytest
import keras

from keras_dist import _metric_state

REPLICAS = 3


class _Variable:
    def __init__(self, aggregation):
        self.aggregation = aggregation


VARIABLES = [_Variable(a) for a in ("sum", "mean", "only_first_replica", "none")]


def _over_replicas(values_by_replica, starts=None):
    """What combine_by_aggregation gives on each replica."""
    recorded = []

    def record(parts):
        recorded.append([np.asarray(p) for p in parts])
        return parts

    for replica, values in enumerate(values_by_replica):
        _metric_state.combine_by_aggregation(
            VARIABLES, values, record, keras.ops.convert_to_tensor(replica == 0), REPLICAS, starts=starts
        )
    sums = [sum(parts[k] for parts in recorded) for k in range(len(recorded[0]))]
    return [
        [
            np.asarray(v)
            for v in _metric_state.combine_by_aggregation(
                VARIABLES, values, lambda parts: sums, keras.ops.convert_to_tensor(replica == 0), REPLICAS, starts=starts
            )
        ]
        for replica, values in enumerate(values_by_replica)
    ]


def _values(replica):
    return [keras.ops.convert_to_tensor(np.float32(10 * (replica + 1) + k)) for k in range(len(VARIABLES))]


def test_each_aggregation_when_every_replica_holds_its_own_part():
    """TensorFlow's sync-on-read metric variables: "sum" is the sum."""
    combined = _over_replicas([_values(r) for r in range(REPLICAS)])
    for replica, (total, mean, first, own) in enumerate(combined):
        assert total == 10 + 20 + 30
        assert mean == pytest.approx((11 + 21 + 31) / 3)
        assert first == 12
        assert own == 10 * (replica + 1) + 3


def test_each_aggregation_when_every_replica_started_from_the_same_values():
    """JAX's replicated state: "sum" is the start plus every replica's change."""
    starts = [keras.ops.convert_to_tensor(np.float32(5.0))] * len(VARIABLES)
    combined = _over_replicas([_values(r) for r in range(REPLICAS)], starts=starts)
    for total, mean, first, _ in combined:
        assert total == 5 + (10 - 5) + (20 - 5) + (30 - 5)
        assert mean == pytest.approx((11 + 21 + 31) / 3)
        assert first == 12


def test_a_mean_keeps_its_dtype():
    (mean,) = _metric_state.combine_by_aggregation(
        [_Variable("mean")], [keras.ops.convert_to_tensor(np.int32(7))], lambda parts: [parts[0] * 2], True, 2
    )
    assert keras.backend.standardize_dtype(mean.dtype) == "int32" and int(mean) == 7


def test_no_aggregated_variable_makes_no_all_reduce():
    def refuse(parts):
        raise AssertionError("all-reduced")

    values = [keras.ops.convert_to_tensor(1.0)]
    assert _metric_state.combine_by_aggregation([_Variable("none")], values, refuse, True, 2) == values


def test_global_logs():
    metric = keras.metrics.Mean()
    metric.update_state(1.0)
    halved = lambda value: value / 2  # noqa: E731  (the "mean over replicas" of two)
    logs = _metric_state.global_logs(
        {"loss": 4.0, "mean": 0.0},
        metric.variables,
        lambda: [keras.ops.convert_to_tensor(9.0), keras.ops.convert_to_tensor(3.0)],
        lambda: {"mean": metric.result()},
        halved,
    )
    assert float(logs["mean"]) == 3.0 and float(logs["loss"]) == 2.0
    assert float(metric.result()) == 1.0  # read as if assigned: unchanged
    assert _metric_state.global_logs((4.0, [2.0]), [], None, None, halved) == (2.0, [1.0])
