"""PyTorch: the collectives keras_dist needs, from `torch.distributed`.

Sums that gradients flow through (BatchNormalization's global moments, an
`all_reduce` inside `strategy.run`) use `torch.distributed.nn`'s
differentiable ones; the rest the plain ones. Lists of tensors travel
packed: one flat buffer per dtype and device, one all-reduce each.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from keras_dist._values import uneven_gather_message


def world_size() -> int:
    return dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1


def _packed(values, reduce_one):
    values = list(values)
    out = list(values)
    groups = {}
    for index, value in enumerate(values):
        if value is None:
            continue
        groups.setdefault((value.dtype, value.device), []).append(index)
    for indices in groups.values():
        flat = torch.cat([values[i].reshape(-1) for i in indices])
        total = reduce_one(flat)
        offset = 0
        for i in indices:
            size = values[i].numel()
            out[i] = total[offset : offset + size].reshape(values[i].shape)
            offset += size
    return out


def _summable(tensor):
    return tensor.to(torch.int32) if tensor.dtype == torch.bool else tensor


def all_reduce_sum(values, differentiable: bool = False):
    """Every value summed over the job's processes (one all-reduce per dtype);
    `values` unchanged in a process of its own."""
    values = [None if v is None else _summable(torch.as_tensor(v)) for v in values]
    if world_size() == 1:
        return values
    if differentiable:
        return _packed(values, _SumOverProcesses.apply)
    return _packed(values, _summed)


def _summed(flat):
    flat = flat.detach().clone()
    dist.all_reduce(flat, op=dist.ReduceOp.SUM)
    return flat


class _SumOverProcesses(torch.autograd.Function):
    """`dist.all_reduce` (sum) that gradients flow through: the gradient of
    a sum over the processes is the sum of their gradients."""

    @staticmethod
    def forward(ctx, flat):
        return _summed(flat)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad)


class _GatherOverProcesses(torch.autograd.Function):
    """`dist.all_gather` of equal-shaped tensors, stacked in rank order, that
    gradients flow through (each process's part gets the sum over the
    processes of its slice's gradient)."""

    @staticmethod
    def forward(ctx, tensor):
        parts = [torch.empty_like(tensor) for _ in range(world_size())]
        dist.all_gather(parts, tensor.contiguous())
        return torch.stack(parts)

    @staticmethod
    def backward(ctx, grad):
        return _summed(grad)[dist.get_rank()]


def all_reduce(values, op: str, differentiable: bool = False):
    """"SUM", "MEAN", "MAX" or "MIN" of every value over the job."""
    if op == "SUM":
        return all_reduce_sum(values, differentiable)
    if op == "MEAN":
        n = world_size()
        return [None if v is None else v / n for v in all_reduce_sum(values, differentiable)]
    reduce_op = {"MAX": dist.ReduceOp.MAX, "MIN": dist.ReduceOp.MIN}[op]
    out = []
    for value in values:
        value = torch.as_tensor(value).detach().clone()
        if world_size() > 1:
            dist.all_reduce(value, op=reduce_op)
        out.append(value)
    return out


#: What a NaN compares as in `same_on_every_process` (NaN equals nothing,
#: itself included; a NaN on every process is the same value there).
_NAN_STANDS_FOR = 1.2345e300


def same_on_every_process(tensor) -> bool:
    """Whether `tensor` is equal on every process (one all-reduce: the max
    of it and of its negation give the largest and the smallest at once)."""
    tensor = torch.as_tensor(tensor).detach().to(torch.float64).reshape(-1)
    tensor = torch.nan_to_num(tensor, nan=_NAN_STANDS_FOR, posinf=float("inf"), neginf=float("-inf"))
    (extremes,) = all_reduce([torch.cat([tensor, -tensor])], "MAX")
    return torch.equal(extremes[: tensor.numel()], -extremes[tensor.numel() :])


#: The dtypes `all_gather_rows` tells apart in its shape exchange.
_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.int16,
           torch.int8, torch.uint8, torch.bool, torch.complex64, torch.complex128)


#: Dimensions `_every_process_shape` sends in its one all-gather; a
#: higher rank on any process takes a second one.
_SHAPE_SLOTS = 8


def _every_process_shape(tensor):
    """Every process's (dtype code, shape) of `tensor`, in rank order: one
    all-gather of (rank, dtype code, the first _SHAPE_SLOTS sizes), the
    only collective `predict`'s per-step gather adds for this check; a
    second, of the whole shapes, where some rank is higher."""
    n = world_size()
    device = tensor.device
    dtype_code = _DTYPES.index(tensor.dtype) if tensor.dtype in _DTYPES else len(_DTYPES)
    head = torch.full((2 + _SHAPE_SLOTS,), -1, dtype=torch.int64, device=device)
    head[0], head[1] = tensor.ndim, dtype_code
    head[2 : 2 + min(tensor.ndim, _SHAPE_SLOTS)] = torch.tensor(tensor.shape[:_SHAPE_SLOTS], dtype=torch.int64)
    heads = [torch.empty_like(head) for _ in range(n)]
    dist.all_gather(heads, head)
    longest = max(int(h[0]) for h in heads)
    if longest <= _SHAPE_SLOTS:
        return [(int(h[1]), tuple(int(d) for d in h[2 : 2 + int(h[0])])) for h in heads]
    shape = torch.full((longest,), -1, dtype=torch.int64, device=device)
    shape[: tensor.ndim] = torch.tensor(tensor.shape, dtype=torch.int64)
    shapes = [torch.empty_like(shape) for _ in range(n)]
    dist.all_gather(shapes, shape)
    return [(int(h[1]), tuple(int(d) for d in s[: int(h[0])])) for h, s in zip(heads, shapes)]


def all_gather_rows(tensor, axis: int, differentiable: bool = False):
    """Every process's `tensor` concatenated along `axis` in rank order.

    The processes' sizes along `axis` may differ (padded to travel, the
    padding cut off again); their dtypes, ranks and other sizes must agree,
    or every process raises the same ValueError naming each one's shape
    (checked before any value travels).
    """
    tensor = torch.as_tensor(tensor)
    n = world_size()
    if n == 1:
        return tensor
    if tensor.ndim == 0:
        tensor = tensor.reshape(1)
        axis = 0
    shapes = _every_process_shape(tensor)
    rank = tensor.ndim
    same_rank = all(len(shape) == rank for _, shape in shapes)  # the same answer on every process
    if same_rank and not -rank <= axis < rank:
        raise ValueError(f"gather axis {axis} is out of range for values of rank {rank}.")
    message = uneven_gather_message(axis, [
        (f"process {i}", shape, _DTYPES[code] if code < len(_DTYPES) else "another dtype")
        for i, (code, shape) in enumerate(shapes)
    ])
    if message is not None:
        raise ValueError(message)
    axis = axis % rank
    sizes = [shape[axis] for _, shape in shapes]
    longest = max(sizes)
    if tensor.shape[axis] < longest:
        pad_shape = list(tensor.shape)
        pad_shape[axis] = longest - tensor.shape[axis]
        tensor = torch.cat([tensor, tensor.new_zeros(pad_shape)], dim=axis)
    if differentiable:
        parts = list(_GatherOverProcesses.apply(tensor))
    else:
        parts = [torch.empty_like(tensor) for _ in range(n)]
        dist.all_gather(parts, tensor.contiguous())
    parts = [part.narrow(axis, 0, rows) for part, rows in zip(parts, sizes)]
    return torch.cat(parts, dim=axis)


def broadcast_from_first(values):
    """Rank 0's values of these tensors, on every process."""
    if world_size() == 1:
        return list(values)
    out = []
    for value in values:
        value = torch.as_tensor(value).detach().clone().contiguous()
        dist.broadcast(value, src=0)
        out.append(value)
    return out
