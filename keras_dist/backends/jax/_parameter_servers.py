"""ParameterServerStrategy's coordinator on jax (being built: issue #14)."""

from __future__ import annotations

_NOT_YET = (
    "ParameterServerStrategy is not available on the jax backend yet (issue #14)."
)


def create_coordinator(strategy):
    raise NotImplementedError(_NOT_YET)


def schedule(coordinator, fn, args, kwargs):
    raise NotImplementedError(_NOT_YET)


def fetch(coordinator, remote_value):
    raise NotImplementedError(_NOT_YET)


def join(coordinator):
    raise NotImplementedError(_NOT_YET)


def done(coordinator):
    raise NotImplementedError(_NOT_YET)


def create_per_worker_dataset(coordinator, dataset_fn):
    raise NotImplementedError(_NOT_YET)


def create_server(cluster, job_name, task_index, protocol, config, start):
    raise NotImplementedError(
        "keras_dist.Server: on JAX, workers and parameter servers are Ray actors "
        "the strategy starts; no server process is needed."
    )
