"""Ray's lifecycle for the JAX parameter-server engine: importing it (or one
clear error naming the extra), starting it quietly, and stopping the
started clusters at exit while Ray is still up. The coordinator's side is
`_parameter_servers`; the actors are `_ray_actors`."""

from __future__ import annotations

import atexit
import contextlib
import logging
import warnings
import weakref

_NO_RAY = (
    "ParameterServerStrategy on the JAX backend runs its workers and "
    "parameter servers as Ray actors, and Ray is not installed: "
    'pip install "keras-dist[ray]"'
)


def check_ray_installed() -> None:
    """When the strategy is made: Ray is there to import (not imported yet:
    that, and starting it, wait for the first use)."""
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ImportError(_NO_RAY)


def _ray():
    try:
        import ray
    except ImportError as error:
        raise ImportError(_NO_RAY) from error
    return ray


def _ray_is_up() -> bool:
    """Whether Ray is connected. Every call this module makes after Ray may
    have stopped is guarded by it: Ray's `get`, `kill` and `.remote` start a
    new local Ray when none is up (auto-init), which at interpreter exit
    left a half-made driver that Ray's C++ exit handler tore down with
    SIGSEGV."""
    return _ray().is_initialized()


_RAY_DOWN = (
    "Ray was shut down after this ParameterServerStrategy started its actors, and its "
    "workers and parameter servers went with it. Call coordinator.join() before "
    "ray.shutdown(), and make a new strategy to train again."
)


class _DropRayNotice(logging.Filter):
    """Ray's notice that it turned token authentication on by default
    (authentication stays on; only the notice is dropped)."""

    def filter(self, record):
        return not record.getMessage().startswith("Token authentication is enabled for this Ray cluster")


@contextlib.contextmanager
def _quiet_ray_start():
    """Starting the strategy's own local Ray without the notices a user
    cannot act on: Ray's token-authentication notice, and JAX's warning that
    `os.fork()` was called in a multithreaded process (Ray starts its
    servers with subprocess, a fork followed at once by exec, which is
    safe)."""
    logger = logging.getLogger("ray._private.authentication.authentication_token_setup")
    notice = _DropRayNotice()
    logger.addFilter(notice)
    try:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=r"os\.fork\(\) was called", category=RuntimeWarning)
            yield
    finally:
        logger.removeFilter(notice)


#: The started clusters, stopped by `_stop_clusters_at_exit` (weakly held).
_LIVE_CLUSTERS: "weakref.WeakSet" = weakref.WeakSet()  # of _parameter_servers.Cluster


_exit_hook_registered = False


def _stop_clusters_at_exit() -> None:
    for cluster in list(_LIVE_CLUSTERS):
        cluster.shutdown()


def _register_exit_hook() -> None:
    """atexit runs hooks last-registered first, and Ray registers its own
    shutdown when `ray` is imported; registered after that import, this
    hook stops the clusters while Ray is still up. (A `weakref.finalize`
    alone runs after Ray's shutdown whenever any finalizer existed before
    `ray` was imported, e.g. a `tempfile.TemporaryDirectory`.)"""
    global _exit_hook_registered
    if not _exit_hook_registered:
        _ray()
        atexit.register(_stop_clusters_at_exit)
        _exit_hook_registered = True


def _actors():
    _ray()
    from keras_dist.backends.jax import _ray_actors

    return _ray_actors
