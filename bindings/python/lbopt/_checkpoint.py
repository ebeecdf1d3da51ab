"""The checkpoint form of a param's states: what optimizer.state_dict() holds for every param, one layout whatever
the sharding, so that a checkpoint moves between one process and any FSDP2 mesh in both directions
(torch.distributed.checkpoint compares the global shapes it saved with those it loads into before lbopt sees
anything).

In memory, a state covers what this process steps (the param, or a DTensor's local shard), packed and flat, with
blocks starting at its first element. A checkpoint must not depend on that cut, so each quantized moment is saved
as two tensors of global shapes that depend on the param alone, its rows being its dim 0 (a 0-d param is one row):
  * <moment>_codes: uint8, shaped like the param, the code of each element (4-bit codes unpacked, one per
    byte: a cut may fall between the two codes of a byte; packed codes would change the global shape that
    checkpoints written by lbopt 0.3 have);
  * <moment>_scales: float32 [rows, 1 + K], one row per row of the param: column 0 the first row of the piece
    (shard, or the whole param) the row was in when saved, columns 1.. the scales of the blocks that overlap
    the row, in order (K = ceil((row size - 1) / block) + 1 is the most blocks a row can overlap,
    whatever the cut; unused entries 0; lbopt 0.3 wrote NaN there).
fp32 states are float32 tensors shaped like the param. Blocks follow row-major order (the caller re-lays out
states kept in another order first). For a DTensor param these are DTensors with its mesh and
placements, so each rank saves and loads its own rows; for a plain param, plain tensors. Loaded where the rows
are cut as when saved, codes and scales are put back as they were (bit-identical continuation); otherwise every
element is decoded with the scale of the block it was in and encoded into this process's blocks, by each rank
for its own rows: nothing is gathered. Params sharded on another dim than 0 (tensor parallel) with quantized
states are refused here.
"""
import sys
from typing import NamedTuple

import torch

from . import _abi
from ._import import unpack
from .functional import KINDS


class Reblocked(NamedTuple):
    """A moment of a checkpoint cut differently than this process's state: decoded, for the caller to encode."""
    name: str  # the state's name (exp_avg, momentum_buffer, ...)
    moment: int  # its lbopt_moment (which codebook)
    values: torch.Tensor  # float32 values of the local tensor in row-major order, flat


class _Geometry(NamedTuple):
    """How a param's quantized states are checkpointed by rows."""
    row_size: int  # elements in a row (dim 0 indexes the rows)
    block: int  # elements of a block of scales
    max_blocks: int  # the most blocks a row can overlap, whatever the cut: the scale columns per row


def dtensor_type():
    return getattr(sys.modules.get("torch.distributed.tensor"), "DTensor", None)  # loaded iff one can exist


def is_dtensor(t):
    cls = dtensor_type()
    return cls is not None and isinstance(t, cls)


def _rows(shape):
    return shape[0] if len(shape) else 1


def _row_offset(p):
    """The first row of the param that this process holds."""
    if not is_dtensor(p):
        return 0
    from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

    return compute_local_shape_and_global_offset(p.shape, p.device_mesh, p.placements)[1][0]


def _geometry(p, kind, what):
    """The _Geometry of a param whose quantized states are checkpointed by rows."""
    if is_dtensor(p) and (p.dim() == 0 or any(pl.is_shard() and pl.dim != 0 for pl in p.placements)):
        raise ValueError(f"lbopt: {what}: a sharded checkpoint of {p.dim()}-d param with placements "
                         f"{tuple(p.placements)} and quantized states needs dim-0 sharding (fully_shard's); "
                         f"keep its states in fp32 (keep_fp32) or save a full state dict")
    rows = _rows(p.shape)
    size = p.numel() // rows if rows else 0
    block = _abi.layout(kind, 0).block_size
    return _Geometry(size, block, (max(size, 1) - 1 + block - 1) // block + 1)


def _global(local, p, shape=None):
    """local as the checkpoint tensor of param p: a DTensor like p (of global shape `shape`) or local itself."""
    if not is_dtensor(p):
        return local
    shape = p.shape if shape is None else torch.Size(shape)
    stride = torch.empty(shape, device="meta").stride()
    return dtensor_type().from_local(local, p.device_mesh, p.placements, run_check=False, shape=shape,
                                     stride=stride)


def local_tensor(t):
    """A DTensor's local shard, or the tensor itself."""
    return t.to_local() if is_dtensor(t) else t


def _pack(codes, kind):
    if kind != _abi.STATE_4BIT:
        return codes
    if codes.numel() % 2:
        codes = torch.cat((codes, codes.new_zeros(1)))
    return (codes[0::2] << 4) | codes[1::2]


def check_scales(scales, key, what):
    """Refuses block scales that no step writes: a NaN, infinite or negative scale would decode its whole block to
    NaN or flip its signs at the next step (a never-stepped state holds zeros)."""
    if not bool((torch.isfinite(scales) & (scales >= 0)).all()):
        raise ValueError(f"lbopt: saved {key} of {what} holds a scale that is negative or not finite")


def _scale_table(scales, rows, size, block, k):
    """The scales of a piece's blocks by rows of `size` elements: row r's column 1 + j holds the scale of the j-th
    block that the row touches (columns past its last block hold 0), column 0 left for the row offset."""
    table = torch.zeros((rows, 1 + k), dtype=torch.float32, device=scales.device)
    r = torch.arange(rows, device=scales.device)
    first, last = (r * size) // block, ((r + 1) * size - 1) // block
    for j in range(k):
        blk = first + j
        ok = blk <= last
        table[ok, 1 + j] = scales[blk[ok]]
    return table


def to_checkpoint(state, p, local, what, moments):
    """The checkpoint entry of param p from its state (tensors over `local`, the tensor stepped for p, in
    row-major order)."""
    out = {k: v for k, v in state.items() if not torch.is_tensor(v)}
    kind = KINDS[state["state_kind"]]
    for name in moments:
        if name + "_codes" not in state:
            continue
        codes = state[name + "_codes"]
        if kind == _abi.STATE_FP32:
            out[name + "_codes"] = _global(codes.view(local.shape), p)
            continue
        size, block, k = _geometry(p, kind, what)
        out[name + "_codes"] = _global(unpack(codes, kind)[:local.numel()].view(local.shape), p)
        table = _scale_table(state[name + "_scales"], _rows(local.shape), size, block, k)
        table[:, 0] = float(_row_offset(p))
        out[name + "_scales"] = _global(table, p, (_rows(p.shape), 1 + k))
    return out


def is_checkpoint(entry, p):
    """Whether a saved lbopt entry for param p is in the checkpoint form (else: the flat in-memory form that
    lbopt 0.3 saved for plain params)."""
    states = {k: v for k, v in entry.items() if k.endswith(("_codes", "_scales")) and torch.is_tensor(v)}
    if any(is_dtensor(v) for v in states.values()):
        return True
    return all(v.dim() == 2 if k.endswith("_scales") else tuple(v.shape) == tuple(p.shape) for k, v in states.items())


def from_checkpoint(entry, p, local, state, what, moments, codebook, added=()):
    """Fill `state` (fresh tensors of this optimizer's kind over `local`, row-major) from a checkpoint entry, as
    loaded for this process (DTensors on this mesh for a DTensor param). codebook(kind, moment) gives lbopt's
    code values. added: the moments a setting turned on since may leave out of the entry (they stay zero).
    Returns the moments cut differently when saved (a list of Reblocked), for the caller to encode."""
    kind = KINDS[state["state_kind"]]
    reblock = []
    for name, moment in moments:
        if name + "_codes" not in state:
            continue
        if name in added and name + "_codes" not in entry and name + "_scales" not in entry:
            continue
        saved = entry.get(name + "_codes")
        if saved is None or tuple(saved.shape) != tuple(p.shape):
            raise ValueError(f"lbopt: the checkpoint's {name} of {what} is missing or of another global shape")
        codes = local_tensor(saved)
        if codes.numel() != local.numel():
            raise ValueError(f"lbopt: the checkpoint's {name} of {what} has {codes.numel()} local elements, the "
                             f"param {local.numel()}")
        codes = codes.reshape(-1)
        if kind == _abi.STATE_FP32:
            state[name + "_codes"].copy_(codes)
            continue
        size, block, k = _geometry(p, kind, what)
        table = entry.get(name + "_scales")
        table = None if table is None else local_tensor(table)
        rows = _rows(local.shape)
        if table is None or tuple(table.shape) != (rows, 1 + k):
            raise ValueError(f"lbopt: the checkpoint's {name}_scales of {what} has local shape "
                             f"{None if table is None else tuple(table.shape)}, expected {(rows, 1 + k)}")
        start = _row_offset(p)
        first_rows = table[:, 0]  # per row, the first row of the piece it was saved in
        row = start + torch.arange(rows, device=table.device)
        valid = (torch.isfinite(first_rows) & (first_rows == first_rows.round()) & (first_rows >= 0)
                 & (first_rows <= row))
        offset = (row - torch.where(valid, first_rows, row).long()) * size  # each row's first element in its piece
        span = (offset + size - 1) // block - offset // block  # the row's blocks there: columns 1 .. 1 + span
        if not bool((valid & (span < k)).all()):
            raise ValueError(f"lbopt: the checkpoint's {name}_scales of {what} holds row offsets (its column 0) "
                             f"that no save writes")
        used = torch.arange(k, device=table.device) <= span[:, None]
        check_scales(table[:, 1:][used], name + "_scales", what)
        past = table[:, 1:][~used]  # columns past a row's last block: 0, or NaN as lbopt 0.3 wrote them
        if not bool(((past == 0) | torch.isnan(past)).all()):
            raise ValueError(f"lbopt: the checkpoint's {name}_scales of {what} holds a scale past a row's last block")
        codes = codes.to(torch.uint8)
        if bool((first_rows == start).all()):  # cut where it was saved: put codes and scales back
            n_blocks = state[name + "_scales"].numel()
            kb = torch.arange(n_blocks, device=codes.device) * block
            r = kb // size
            scales = table[r, 1 + kb // block - (r * size) // block]
            if not torch.equal(_scale_table(scales, rows, size, block, k)[:, 1:][used], table[:, 1:][used]):
                raise ValueError(f"lbopt: the checkpoint's {name}_scales of {what} holds two values for the scale "
                                 f"of a block that spans rows")
            state[name + "_scales"].copy_(scales)
            state[name + "_codes"].copy_(_pack(codes, kind))
            continue
        # another cut: decode each element with the scale of its saved block, encode into this process's blocks
        i = torch.arange(local.numel(), device=codes.device)
        r, col = i // size, i % size
        scale = table[r, 1 + (offset[r] + col) // block - offset[r] // block]
        values = (codebook(kind, moment).to(codes.device)[codes.long()] if kind != _abi.STATE_FP8
                  else codes.view(torch.float8_e4m3fn).to(torch.float32)) * scale
        reblock.append(Reblocked(name, moment, values))
    return reblock
