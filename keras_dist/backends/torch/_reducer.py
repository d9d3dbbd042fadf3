"""PyTorch: fit's gradient sum overlapped with the backward pass, as DDP's
reducer does it, from torch's own pieces: a post-accumulate-grad hook on
each trainable parameter and asynchronous, bucketed `dist.all_reduce`.

The buckets are the model's trainable parameters in reverse order (the
order backward produces their gradients), cut at `bytes_per_pack`
(`CommunicationOptions`; 0: DDP's defaults, 1 MiB for the first bucket and
25 MiB after), fixed per model, so every process sums the same buckets in
the same order. A bucket is launched once each of its gradients has been
accumulated and every earlier bucket launched; the optimizer's apply
(`sum_gradients_for_apply`) waits for them and takes each gradient's sum,
the same values as one packed sum. The step's same-batch check
(`_batch_check`) travels in the first bucket. Where a step's gradients are
not the parameters' `.grad` of one backward pass (a custom `train_step`
that changes them, or calls backward twice), the buckets are drained and
the gradients summed as before, in one packed all-reduce.

    reducer = reducer_for(model, bytes_per_pack=0)
    with training_step(reducer, check):
        model.train_step(data)        # apply -> take(grads) -> the sums
"""

from __future__ import annotations

import threading
import weakref

import torch
import torch.distributed as dist

#: DDP's bucket sizes (torch.distributed's `_DEFAULT_FIRST_BUCKET_BYTES`
#: and `bucket_cap_mb=25`).
FIRST_BUCKET_BYTES = 1024 * 1024
BUCKET_BYTES = 25 * 1024 * 1024


def bucket_indices(parameters, bytes_per_pack: int = 0) -> list[list[int]]:
    """Parameter indices in buckets: reverse order, one dtype and device per
    bucket, each closed once it holds its size in bytes."""
    buckets, current, size, key = [], [], 0, None
    for index in reversed(range(len(parameters))):
        parameter = parameters[index]
        this_key = (parameter.dtype, parameter.device)
        if current and this_key != key:
            buckets.append(current)
            current, size = [], 0
        key = this_key
        current.append(index)
        size += parameter.numel() * parameter.element_size()
        cap = bytes_per_pack or (FIRST_BUCKET_BYTES if not buckets else BUCKET_BYTES)
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


class _Reduction:
    """One backward pass's buckets in flight."""

    def __init__(self, reducer, check):
        self.reducer = reducer
        self.check = check
        self.counts = [0] * len(reducer.parameters)
        self.ready = [0] * len(reducer.buckets)
        self.next = 0  # the next bucket to launch
        self.in_flight = []  # (bucket, flat buffer, work, whether it carries the check)
        self.stale = False

    def accumulated(self, index: int) -> None:
        self.counts[index] += 1
        if self.counts[index] > 1:  # a second backward before the apply: the sums are not the grads
            self.stale = True
            return
        self.ready[self.reducer.bucket_of[index]] += 1
        buckets = self.reducer.buckets
        while self.next < len(buckets) and self.ready[self.next] == len(buckets[self.next]):
            self._launch()

    def _launch(self) -> None:
        bucket, self.next = self.next, self.next + 1
        parameters = self.reducer.parameters
        indices = self.reducer.buckets[bucket]
        first = parameters[indices[0]]
        parts = [
            (parameters[i].grad if parameters[i].grad is not None else torch.zeros_like(parameters[i])).reshape(-1)
            for i in indices
        ]
        carries = False
        if self.check is not None and not self.check.done and not self.check.travelling:
            values = self.check.values(first.device)
            if values.dtype == first.dtype:
                parts.append(values)
                carries = self.check.travelling = True
        flat = torch.cat(parts).detach()
        work = dist.all_reduce(flat, op=dist.ReduceOp.SUM, async_op=True)
        self.in_flight.append((bucket, flat, work, carries))

    def finish(self) -> dict[int, torch.Tensor] | None:
        """Every bucket launched (one not ready with zeros for a gradient
        missing here) and waited for; the sums by parameter index, or None
        where they are not this backward's gradients (`stale`). The check
        is verified first: a ValueError before any sum is returned."""
        while self.next < len(self.reducer.buckets):
            self._launch()
        in_flight, self.in_flight = self.in_flight, []
        sums = {}
        for bucket, flat, work, carries in in_flight:
            work.wait()
            offset = 0
            for index in self.reducer.buckets[bucket]:
                parameter = self.reducer.parameters[index]
                sums[index] = flat[offset : offset + parameter.numel()].view_as(parameter)
                offset += parameter.numel()
            if carries:
                self.check.travelling = False
                self.check.verify(flat[offset:])
        return None if self.stale else sums


class Reducer:
    """A model's buckets and hooks (made once per set of trainable
    parameters); `step(check)` holds one training step's reduction."""

    def __init__(self, parameters, bytes_per_pack: int):
        self.parameters = list(parameters)
        self.buckets = bucket_indices(self.parameters, bytes_per_pack)
        self.bucket_of = {index: b for b, bucket in enumerate(self.buckets) for index in bucket}
        self.reduction = None
        self._handles = [
            parameter.register_post_accumulate_grad_hook(self._hook(index))
            for index, parameter in enumerate(self.parameters)
        ]

    def _hook(self, index: int):
        owner = weakref.ref(self)

        def accumulated(parameter):
            reducer = owner()
            reduction = None if reducer is None else reducer.reduction
            if reduction is not None:  # outside keras_dist's step: nothing
                reduction.accumulated(index)

        return accumulated

    def remove(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []

    def take(self, grads):
        """The sums of `grads` (the optimizer's list) where they are the
        parameters' gradients of this backward pass; None otherwise (the
        caller sums them itself). A new reduction follows, for a second
        backward and apply in the same step (two optimizers)."""
        reduction = self.reduction
        sums = reduction.finish()
        self.reduction = _Reduction(self, reduction.check)
        if sums is None:
            return None
        by_grad = {id(p.grad): i for i, p in enumerate(self.parameters) if p.grad is not None}
        out = []
        for grad in grads:
            if grad is None:
                out.append(None)
                continue
            index = by_grad.get(id(grad))
            if index is None:
                return None
            out.append(sums[index])
        return out


class training_step:
    """`with training_step(reducer, check):` one training step of this
    thread, its gradients summed by `reducer` (None: a model without
    trainable parameters) and `check` sent along (`current()` reads both)."""

    def __init__(self, reducer: Reducer | None, check):
        self.reducer, self.check = reducer, check

    def __enter__(self):
        if self.reducer is not None:
            self.reducer.reduction = _Reduction(self.reducer, self.check)
        self.outer = getattr(_current, "step", None)
        _current.step = self
        return self

    def __exit__(self, kind, error, traceback):
        _current.step = self.outer
        if self.reducer is None:
            return False
        reduction = self.reducer.reduction
        self.reducer.reduction = None
        if kind is None and reduction.next:  # a backward without an apply: its sums, still made on every process
            reduction.finish()
        return False


#: The training step this thread runs (None outside).
_current = threading.local()


def current() -> training_step | None:
    return getattr(_current, "step", None)


#: Each model's reducer (weakly: it goes with the model).
_reducers: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def reducer_for(model, bytes_per_pack: int) -> Reducer | None:
    """`model`'s reducer for its current trainable parameters (a new one,
    the old hooks removed, when they changed); None without any."""
    parameters = [v.value for v in model.trainable_variables]
    if not parameters:
        return None
    reducer = _reducers.get(model)
    if reducer is not None and len(reducer.parameters) == len(parameters) and all(
        a is b for a, b in zip(reducer.parameters, parameters)
    ):
        return reducer
    if reducer is not None:
        reducer.remove()
    reducer = _reducers[model] = Reducer(parameters, bytes_per_pack)
    return reducer
