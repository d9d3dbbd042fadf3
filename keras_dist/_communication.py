"""Cross-worker communication options (tf.distribute names)."""

from __future__ import annotations

import dataclasses
import enum
from typing import Optional


class PeerWorkerError(RuntimeError):
    """A collective failed because another worker of the job died or hung.

    Raised by `fit`/`evaluate`/`predict` under MultiWorkerMirroredStrategy
    when the engine reports the failure (TF: the collective's
    ``timeout_seconds``; JAX terminates the process itself when the
    coordination service stops hearing from a peer). Restart the whole job
    and resume with ``keras.callbacks.BackupAndRestore``::

        keras-dist launch -n 2 --max-restarts 3 train.py
    """


class CommunicationImplementation(enum.Enum):
    """Which collective implementation to use across workers.

    AUTO lets the backend choose (JAX: gloo on CPU, NCCL on GPU; TF: its
    own choice); RING asks for ring all-reduce (gloo on JAX CPU); NCCL asks
    for NCCL and needs GPUs.
    """

    AUTO = "AUTO"
    RING = "RING"
    NCCL = "NCCL"


@dataclasses.dataclass(frozen=True)
class CommunicationOptions:
    """Options for cross-worker collectives.

    Args:
        bytes_per_pack: split gradients into packs of about this many bytes
            for the all-reduce; 0 lets the engine decide.
        timeout_seconds: give up (with an error) when a peer does not
            answer within this many seconds; None waits for the engine's
            default.
        implementation: a `CommunicationImplementation`.

    ```python
    options = keras_dist.CommunicationOptions(timeout_seconds=60)
    ```
    """

    bytes_per_pack: int = 0
    timeout_seconds: Optional[float] = None
    implementation: CommunicationImplementation = CommunicationImplementation.AUTO

    def __post_init__(self):
        if not isinstance(self.bytes_per_pack, int) or self.bytes_per_pack < 0:
            raise ValueError(
                f"bytes_per_pack must be an integer >= 0, got {self.bytes_per_pack!r}."
            )
        if self.timeout_seconds is not None and not self.timeout_seconds > 0:
            raise ValueError(
                f"timeout_seconds must be positive or None, got {self.timeout_seconds!r}."
            )
        if not isinstance(self.implementation, CommunicationImplementation):
            raise ValueError(
                "implementation must be a keras_dist.CommunicationImplementation, "
                f"got {self.implementation!r}."
            )
