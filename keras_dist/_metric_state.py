"""Metric variables and logs over all replicas, from one replica's step.

Inside a per-replica step each replica's metric variables have seen only
its rows. These pieces give what one device has after the global batch,
in Keras ops, with the backend's all-reduce passed in (as
`_moments.global_moments` takes it):

    values = combine_by_aggregation(variables, local, all_reduce_sum,
                                    is_first_replica, num_replicas, starts=old)
    logs = global_logs(logs, variables, lambda: values, model.get_metrics_result, mean)
"""

from __future__ import annotations

from typing import Callable, Sequence

import keras
from keras import ops


def combine_by_aggregation(
    variables: Sequence,
    values: Sequence,
    all_reduce_sum: Callable[[list], list],
    is_first_replica,
    num_replicas: int,
    starts: Sequence | None = None,
) -> list:
    """Each variable's value over all replicas, by its `aggregation`.

    - "sum": `start` plus every replica's `value - start` (`starts` None:
      every replica holds only its own part, the sum of the values);
    - "mean": the mean of the replicas' values;
    - "only_first_replica": replica 0's value;
    - anything else: this replica's value, as is.

    One call of `all_reduce_sum` (a list of tensors in, their sums over
    the replicas out) for all of them. `is_first_replica` is a boolean
    scalar tensor.
    """
    values = list(values)
    combined = list(values)
    summed = [i for i, v in enumerate(variables) if v.aggregation == "sum"]
    averaged = [i for i, v in enumerate(variables) if v.aggregation == "mean"]
    first = [i for i, v in enumerate(variables) if v.aggregation == "only_first_replica"]
    if not (summed or averaged or first):
        return combined
    parts = (
        [values[i] if starts is None else values[i] - starts[i] for i in summed]
        + [values[i] for i in averaged]
        + [ops.where(is_first_replica, values[i], ops.zeros_like(values[i])) for i in first]
    )
    reduced = iter(all_reduce_sum(parts))
    for i in summed:
        total = next(reduced)
        combined[i] = total if starts is None else starts[i] + total
    for i in averaged:
        combined[i] = ops.cast(ops.divide(next(reduced), num_replicas), keras.backend.standardize_dtype(values[i].dtype))
    for i in first:
        combined[i] = next(reduced)
    return combined


def global_logs(logs, variables: Sequence, combined: Callable[[], list], metric_results, mean_over_replicas):
    """The logs of the global batch, from one replica's step.

    A dict of logs (Keras' own steps): each metric's result computed from
    the metric variables' `combined()` values (read as if assigned: no
    variable changes), every other entry averaged over the replicas. Any
    other structure (a custom `train_step`'s own): every leaf averaged.
    """
    if not isinstance(logs, dict):
        return keras.tree.map_structure(mean_over_replicas, logs)
    with keras.StatelessScope(state_mapping=list(zip(variables, combined()))):
        results = metric_results()
    return {key: results[key] if key in results else mean_over_replicas(value) for key, value in logs.items()}
