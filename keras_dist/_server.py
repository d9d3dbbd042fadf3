"""`keras_dist.Server`: one task's server in a parameter-server cluster
(tf.distribute.Server's names and arguments); the engine's own server
(`BackendAdapter.create_server`)."""

from __future__ import annotations

from typing import Any, Optional

from keras_dist import _foreign


class Server:
    """An in-process server for one task of a cluster, as `tf.distribute.Server`.

    Worker and ps tasks of a `ParameterServerStrategy` run one and wait
    (`keras-dist launch --ps M` does it for you, with
    `python -m keras_dist.serve`):

    ```text  (needs a cluster: run under `keras-dist launch --workers N --ps M`)
    resolver = keras_dist.cluster_resolver.TFConfigClusterResolver()
    server = keras_dist.Server(resolver.cluster_spec(), job_name=resolver.task_type,
                               task_index=resolver.task_id, protocol="grpc")
    server.join()
    ```

    `server_or_cluster_def` is a `keras_dist.cluster_resolver.ClusterSpec`, a
    dict of job name to addresses (on TensorFlow also a `tf.train.ClusterSpec`).
    On JAX no server process exists: workers and parameter servers are Ray
    actors the strategy starts, and this raises NotImplementedError.
    """

    def __init__(
        self,
        server_or_cluster_def: Any,
        job_name: Optional[str] = None,
        task_index: Optional[int] = None,
        protocol: Optional[str] = None,
        config: Any = None,
        start: bool = True,
    ):
        from keras_dist.backends import get_adapter
        from keras_dist.cluster_resolver import ClusterSpec

        spec = ClusterSpec(_foreign.accept(server_or_cluster_def, "cluster_spec"))
        jobs = spec.jobs
        if job_name is None:
            if len(jobs) != 1:
                raise ValueError(
                    f"keras_dist.Server: job_name is required when the cluster has several jobs ({jobs})."
                )
            job_name = jobs[0]
        if job_name not in jobs:
            raise ValueError(f"keras_dist.Server: job_name {job_name!r} is not a job of the cluster {jobs}.")
        if task_index is None:
            if spec.num_tasks(job_name) != 1:
                raise ValueError(
                    f"keras_dist.Server: task_index is required when job {job_name!r} has several tasks."
                )
            task_index = spec.task_indices(job_name)[0]
        if isinstance(task_index, bool) or not isinstance(task_index, int) or task_index not in spec.task_indices(job_name):
            raise ValueError(
                f"keras_dist.Server: task_index {task_index!r} is not a task of job "
                f"{job_name!r} (tasks: {spec.task_indices(job_name)})."
            )
        if protocol not in (None, "grpc"):
            raise ValueError(f"keras_dist.Server: protocol must be 'grpc' (or None), got {protocol!r}.")
        if not isinstance(start, bool):
            raise TypeError(f"keras_dist.Server: start must be True or False, got {start!r}.")
        self._job_name, self._task_index = job_name, task_index
        adapter = get_adapter()
        if adapter.create_server is None:  # an optional capability
            raise NotImplementedError(
                f"keras_dist.Server is not supported on the {adapter.name} backend: "
                + adapter.unsupported.get("create_server", "it runs no server processes.")
            )
        self._engine = adapter.create_server(spec.as_dict(), job_name, task_index, protocol, config, start)

    @property
    def target(self) -> str:
        """The address sessions connect to ("grpc://host:port")."""
        return self._engine.target

    def start(self) -> None:
        """Starts the server (when made with start=False)."""
        self._engine.start()

    def join(self) -> None:
        """Blocks until the server stops (for ever: ps and worker tasks end by being stopped)."""
        self._engine.join()

    def __repr__(self) -> str:
        return f"Server(job_name={self._job_name!r}, task_index={self._task_index})"
