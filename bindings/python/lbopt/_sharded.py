"""The sharded checkpoint form of the states of DTensor params (FSDP2, HSDP): what optimizer.state_dict() holds
for them, so that torch.distributed.checkpoint saves each rank's part and loads it on any other mesh.

Each rank's states cover its local shard, with blocks starting at the shard's first element. A checkpoint must
not depend on that cut, so each quantized moment is saved as two DTensors with the param's mesh and placements
and mesh-independent global shapes:
  * <moment>_codes: uint8, shaped like the param, one code per element (4-bit codes unpacked, one per byte);
  * <moment>_scales: float32 [rows, 1 + K], one row per row of the param (its dim 0): column 0 the first row of
    the shard the row was in when saved, columns 1.. the scales of the blocks that overlap the row, in order
    (K = ceil((row size - 1) / block) + 1 is the most blocks a row can overlap, whatever the cut; unused
    entries NaN).
fp32 states are saved as float32 DTensors shaped like the param. Loaded on the same cut, codes and scales are
put back as they were (bit-identical continuation); on another cut every element is decoded with the scale of
the block it was in and encoded into the new local blocks, on each rank for its own shard: nothing is
gathered. Params sharded on another dim than 0 (tensor parallel) with quantized states are refused here.
"""
import sys

import torch

from . import _abi
from ._import import unpack
from .functional import KINDS


def dtensor_type():
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # loaded iff one can exist


def is_dtensor(t):
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def _row_offset(p):
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)[1][0]


def _geometry(p, kind, what):
    """(row size L, block B, K) of a quantized DTensor param sharded on dim 0 only."""
    if p.dim() == 0 or any(pl.is_shard() and pl.dim != 0 for pl in p.placements):
        raise ValueError(f"lbopt: {what}: a sharded checkpoint of {p.dim()}-d param with placements "
                         f"{tuple(p.placements)} and quantized states needs dim-0 sharding (fully_shard's); "
                         f"keep its states in fp32 (keep_fp32) or save a full state dict")
    rows = p.shape[0]
    size = p.numel() // rows if rows else 0
    block = _abi.layout(kind, 0).block_size
    return size, block, (max(size, 1) - 1 + block - 1) // block + 1


def _like_param(local, p, shape=None):
    cls = dtensor_type()
    shape = p.shape if shape is None else torch.Size(shape)
    stride = torch.empty(shape, device="meta").stride()
    return cls.from_local(local, p.device_mesh, p.placements, run_check=False, shape=shape, stride=stride)


def _pack(codes, kind):
    if kind != _abi.STATE_4BIT:
        return codes
    if codes.numel() % 2:
        codes = torch.cat((codes, codes.new_zeros(1)))
    return (codes[0::2] << 4) | codes[1::2]


def to_checkpoint(state, p, local, what, moments):
    """state (local tensors) as the sharded checkpoint entry of DTensor param p."""
    out = {k: v for k, v in state.items() if not torch.is_tensor(v)}
    if out.get("dim_order", tuple(range(local.dim()))) != tuple(range(local.dim())):
        raise ValueError(f"lbopt: {what}: the local shard is not row-major")
    kind = KINDS[state["state_kind"]]
    for name in moments:
        if name + "_codes" not in state:
            continue
        codes = state[name + "_codes"]
        if kind == _abi.STATE_FP32:
            out[name + "_codes"] = _like_param(codes.view(local.shape), p)
            continue
        size, block, k = _geometry(p, kind, what)
        out[name + "_codes"] = _like_param(unpack(codes, kind)[:local.numel()].view(local.shape), p)
        rows = local.shape[0]
        scales = state[name + "_scales"]
        table = torch.full((rows, 1 + k), float("nan"), dtype=torch.float32, device=codes.device)
        table[:, 0] = float(_row_offset(p))
        r = torch.arange(rows, device=codes.device)
        first, last = (r * size) // block, ((r + 1) * size - 1) // block
        for j in range(k):
            blk = first + j
            ok = blk <= last
            table[ok, 1 + j] = scales[blk[ok]]
        out[name + "_scales"] = _like_param(table, p, (p.shape[0], 1 + k))
    return out


def is_checkpoint(entry):
    return any(is_dtensor(v) for v in entry.values())


def from_checkpoint(entry, p, local, state, what, moments, codebook):
    """Fill `state` (fresh local tensors of this optimizer's kind, row-major) from a sharded checkpoint entry,
    as loaded by DCP onto this mesh. codebook(kind, second) gives lbopt's code values. Returns the moments cut
    differently when saved, as (name, moment, float32 values of the local shard) for the caller to encode."""
    kind = KINDS[state["state_kind"]]
    reblock = []
    for name, moment in moments:
        if name + "_codes" not in state:
            continue
        saved = entry.get(name + "_codes")
        if saved is None or tuple(saved.shape) != tuple(p.shape):
            raise ValueError(f"lbopt: the checkpoint's {name} of {what} is missing or of another global shape")
        codes = saved.to_local().reshape(-1)
        if codes.numel() != local.numel():
            raise ValueError(f"lbopt: the checkpoint's {name} of {what} has {codes.numel()} local elements, the "
                             f"shard {local.numel()}")
        if kind == _abi.STATE_FP32:
            state[name + "_codes"].copy_(codes)
            continue
        size, block, k = _geometry(p, kind, what)
        table = entry[name + "_scales"].to_local()
        if table.shape != (local.shape[0], 1 + k):
            raise ValueError(f"lbopt: the checkpoint's {name}_scales of {what} has local shape "
                             f"{tuple(table.shape)}, expected {(local.shape[0], 1 + k)}")
        start = _row_offset(p)
        codes = codes.to(torch.uint8)
        if bool((table[:, 0] == start).all()):  # cut where it was saved: put codes and scales back
            n_blocks = state[name + "_scales"].numel()
            kb = torch.arange(n_blocks, device=codes.device) * block
            r = kb // size
            state[name + "_scales"].copy_(table[r, 1 + kb // block - (r * size) // block])
            state[name + "_codes"].copy_(_pack(codes, kind))
            continue
        # another cut: decode each element with the scale of its saved block, encode into this shard's blocks
        i = torch.arange(local.numel(), device=codes.device)
        r, col = i // size, i % size
        offset = (start + r - table[r, 0].long()) * size
        scale = table[r, 1 + (offset + col) // block - offset // block]
        values = (codebook(kind, moment == _abi.MOMENT_SECOND).to(codes.device)[codes.long()] if kind != _abi.STATE_FP8
                  else codes.view(torch.float8_e4m3fn).to(torch.float32)) * scale
        reblock.append((name, moment, values.view(local.shape)))
    return reblock
