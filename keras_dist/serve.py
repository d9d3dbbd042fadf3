"""`python -m keras_dist.serve`: run this task's `keras_dist.Server` (from
TF_CONFIG) until stopped: the worker and ps processes of a
`ParameterServerStrategy` cluster. `keras-dist launch --ps M` starts them."""

from __future__ import annotations

import sys


def main() -> int:
    from keras_dist._server import Server
    from keras_dist.cluster_resolver import TFConfigClusterResolver

    resolver = TFConfigClusterResolver()
    if resolver.task_type not in ("worker", "ps"):
        print(
            f"keras_dist.serve runs a 'worker' or 'ps' task; TF_CONFIG names {resolver.task_type!r}.",
            file=sys.stderr,
        )
        return 2
    from keras_dist import _heartbeat

    _heartbeat.mark_join("joining")
    server = Server(resolver.cluster_spec(), job_name=resolver.task_type, task_index=resolver.task_id, protocol="grpc")
    _heartbeat.mark_join("joined")  # the launcher says when every server is up
    server.join()
    return 0


if __name__ == "__main__":
    sys.exit(main())
