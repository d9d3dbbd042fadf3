"""PyTorch: every process of a `fit`/`evaluate` step holds the same global
batch, checked inside a collective the step already makes.

Each process hashes its global batch (each input's shape, dtype and a
stride of its bytes) to `_HASH_BYTES` bytes h_1..h_K (each 0-255), and sends [h, h*h] with the
step's gradient sum (before the optimizer applies it) or, in a step with
no gradients, with its metric variables' sum. All processes hold the same
h exactly when N * sum(h*h) == sum(h)**2 for every k (Cauchy-Schwarz,
equality only for equal terms); the sums are integers below 2**24, exact in
float32 whatever the order of the additions, so every process reaches the
same verdict and raises the same error before any weight changes. Two
different batches pass only if all K hashes collide (2**-64).

    check = BatchCheck(batch, "train")
    values = grads + [check.values(device)]      # one all-reduce for both
    summed = all_reduce_sum(values)
    check.verify(summed.pop())                   # ValueError where batches differ
"""

from __future__ import annotations

import hashlib

import keras
import numpy as np
import torch

#: Bytes of the batch's hash each step sends (and their squares).
_HASH_BYTES = 8
#: Elements of each input the hash reads (a stride through it).
_FINGERPRINT_SAMPLES = 4096
#: The most processes whose sums of squared bytes stay exact in float32
#: (N * 255**2 < 2**24); a larger job sends them in float64.
_FLOAT32_EXACT_PROCESSES = 256


def digest(batch) -> bytes:
    """`_HASH_BYTES` bytes that differ between two different global batches:
    a hash of each input's shape and dtype and of the bytes of a stride
    through it (`_FINGERPRINT_SAMPLES` elements; NaN is data, equal where
    its bytes are). Inputs that are not numbers (strings, objects) count
    by their shape alone."""
    hasher = hashlib.blake2b(digest_size=_HASH_BYTES)
    for leaf in keras.tree.flatten(batch):
        if leaf is None:
            continue
        if not isinstance(leaf, torch.Tensor):
            leaf = np.asarray(leaf)
            if not (np.issubdtype(leaf.dtype, np.number) or leaf.dtype == np.bool_):
                hasher.update(repr(("rows", tuple(leaf.shape))).encode())
                continue
        hasher.update(repr((tuple(leaf.shape), str(leaf.dtype))).encode())
        flat = leaf.reshape(-1)
        sample = flat[:: max(1, flat.shape[0] // _FINGERPRINT_SAMPLES)]
        if isinstance(sample, torch.Tensor):
            sample = sample.detach().cpu().contiguous().numpy()
        hasher.update(np.ascontiguousarray(sample).tobytes())
    return hasher.digest()


def differing_batches_message(kind: str) -> str:
    return (
        f"The workers' global batches differ at this {kind} step: each worker must pass the same data in the "
        "same order (every worker takes its own rows of each global batch). Shuffled or random input must be "
        "drawn alike on every worker: seed each the same (keras.utils.set_random_seed(seed)) before creating "
        "the strategy, or after it on every worker alike, or pass shuffle=False."
    )


class BatchCheck:
    """One step's same-batch check, to be sent with a collective the step
    makes (`fold`), or alone (`verify_alone`) where it made none."""

    def __init__(self, batch, kind: str, num_processes: int):
        self.kind = kind
        self.num_processes = num_processes
        self.dtype = torch.float32 if num_processes <= _FLOAT32_EXACT_PROCESSES else torch.float64
        self._hashes = torch.tensor(list(digest(batch)), dtype=torch.float64)
        self.done = False
        self.travelling = False  # sent in a collective not yet waited for (`_reducer`)

    def values(self, device) -> torch.Tensor:
        """[h, h*h], to be summed over the processes with the step's values."""
        return torch.cat([self._hashes, self._hashes * self._hashes]).to(dtype=self.dtype, device=device)

    def verify(self, summed) -> None:
        """The verdict from the sums of every process's `values`: one
        ValueError, the same on every process, where the batches differ."""
        self.done = True
        summed = summed.detach().to(device="cpu", dtype=torch.float64)
        first, second = summed[:_HASH_BYTES], summed[_HASH_BYTES:]
        if not torch.equal(self.num_processes * second, first * first):
            raise ValueError(differing_batches_message(self.kind))

    def fold(self, values: list, all_reduce_sum, device) -> list:
        """`all_reduce_sum(values)` with this check sent along (one
        collective where `values` are of the check's dtype and device),
        verified before the sums are returned."""
        if self.done or self.travelling:
            return all_reduce_sum(values)
        summed = all_reduce_sum(list(values) + [self.values(device)])
        self.verify(summed.pop())
        return summed

    def verify_alone(self, all_reduce_sum, device) -> None:
        """For a step that made no collective this check could travel with."""
        if not (self.done or self.travelling):
            (summed,) = all_reduce_sum([self.values(device)])
            self.verify(summed)
