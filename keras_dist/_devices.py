"""Device names: parse the usual spellings into one canonical form.

Canonical form is ``"<type>:<index>"`` in lower case, e.g. ``"cpu:1"`` or
``"gpu:0"``. Accepted spellings include ``"cpu:1"``, ``"/gpu:0"``,
``"GPU:0"``, ``"/device:CPU:0"`` and
``"/job:localhost/replica:0/task:0/device:GPU:0"``.
"""

from __future__ import annotations

import re
from typing import Iterable, Sequence

_DEVICE_RE = re.compile(
    r"^(?:/job:[^/]+(?:/replica:\d+)?(?:/task:\d+)?)?"
    r"(?:/?device:)?/?(?P<type>[a-zA-Z_]+):(?P<index>\d+)$"
)

ACCELERATOR_TYPES = ("gpu", "tpu")


#: The documented test hook: with this environment variable set to "1",
#: TPUStrategy accepts this host's CPU devices where it finds no TPU, and
#: runs the same machinery over them (the tests' way to exercise it).
TPU_ON_CPU_ENV = "KERAS_DIST_TPU_ON_CPU"


def canonical_device(name: str) -> str:
    """Returns the canonical ``"type:index"`` form of a device name.

    >>> canonical_device("/job:localhost/replica:0/task:0/device:GPU:0")
    'gpu:0'
    """
    if not isinstance(name, str):
        raise TypeError(
            f"Device names must be strings like 'cpu:0' or '/gpu:1'; got "
            f"{name!r} of type {type(name).__name__}."
        )
    match = _DEVICE_RE.match(name.strip())
    if match is None:
        raise ValueError(
            f"Cannot parse device name {name!r}. Use a form like 'cpu:0', "
            "'/gpu:1' or '/job:localhost/replica:0/task:0/device:GPU:0'."
        )
    return f"{match['type'].lower()}:{int(match['index'])}"


def more_cpu_replicas_hint() -> str:
    """How to get several CPU replicas on this backend (the sentence that
    ends the errors and notes about too few devices)."""
    from keras_dist.backends import backend_name

    if backend_name() == "torch":  # a replica is a process there
        return (
            "On the torch backend a replica is a process: run several with `keras-dist launch -n N --backend torch "
            "script.py` (or torchrun --nproc-per-node N) and keras_dist.MultiWorkerMirroredStrategy() in the script."
        )
    return (
        "To simulate several CPU devices call keras_dist.simulate_cpu_devices(n) before the backend starts "
        "(right after the imports, before any computation)."
    )


def resolve_devices(
    requested: Iterable[str] | None, visible: Sequence[str]
) -> tuple[str, ...]:
    """Validates requested devices against the visible ones.

    With ``requested=None`` returns all visible accelerators, or all visible
    CPU devices where there is no accelerator.
    """
    visible = tuple(visible)
    if requested is None:
        accelerators = tuple(
            d for d in visible if d.split(":")[0] in ACCELERATOR_TYPES
        )
        chosen = accelerators or tuple(
            d for d in visible if d.startswith("cpu:")
        )
        if not chosen:
            raise ValueError(f"No usable devices found; visible: {visible}.")
        return chosen
    if isinstance(requested, str):
        requested = [requested]
    chosen = tuple(canonical_device(d) for d in requested)
    if not chosen:
        raise ValueError(
            "`devices` is empty. Pass at least one device, or devices=None "
            f"for all local devices. Visible devices: {list(visible)}."
        )
    missing = [d for d in chosen if d not in visible]
    if missing:
        raise ValueError(
            f"Device(s) {missing} are not visible to this process. Visible "
            f"devices: {list(visible)}. {more_cpu_replicas_hint()}"
        )
    if len(set(chosen)) != len(chosen):
        raise ValueError(f"Duplicate devices in {list(chosen)}.")
    return chosen
