"""Optimizer states saved by other libraries, converted into lbopt states by lbopt.torch's load_state_dict.

Recognized, per param entry of a state dict, for the states the loading optimizer uses:
  * torch.optim.AdamW / Adam (and torchao's plain states of small params): exp_avg, exp_avg_sq [, max_exp_avg_sq]
    as float tensors shaped like the param;
  * torchao AdamW4bit / AdamW8bit / AdamWFp8: exp_avg, exp_avg_sq as tensor subclasses carrying codes, scale and
    (4- and 8-bit) qmap;
  * bitsandbytes AdamW8bit / Adam8bit (state1, state2 uint8 codes, absmax1, absmax2, qmap1, qmap2) and their
    32-bit variants (state1, state2 float32), flat or under "__bnb_optimizer_quant_state__" (bitsandbytes >= 0.45);
  * any other state as a float tensor under its lbopt name (torch.optim.SGD's momentum_buffer).
Where a saved moment is already in the target kind's format (torchao's codebooks and blocks are lbopt's, and
bitsandbytes' 8-bit blockwise maps are lbopt's 8-bit maps) its codes and scales are copied as they are; otherwise
it is decoded to float32 and encoded into the target kind. Neither torchao nor bitsandbytes is imported here:
their objects are read through their attributes.
"""
from typing import NamedTuple, Optional

import torch

from . import _abi
from ._torch_views import tensor_view

_BNB_NESTED = "__bnb_optimizer_quant_state__"
# The number of the bitsandbytes state (state1, absmax1, qmap1, ...) that holds each AdamW moment; torch.optim and
# torchao save every state under lbopt's name of it.
_BNB_INDEX = {"exp_avg": "1", "exp_avg_sq": "2"}
_SOURCE_KIND = {16: _abi.STATE_4BIT, 256: _abi.STATE_8BIT}  # codebook size -> lbopt kind with that codebook


class Plain(NamedTuple):
    """A saved moment held as float values shaped like the param (torch.optim, torchao's small params)."""
    values: torch.Tensor


class Coded(NamedTuple):
    """A saved moment held as codes and per-block scales (torchao's low-bit states, bitsandbytes' 8-bit ones)."""
    kind: int  # the lbopt state kind with the same code format
    codes: torch.Tensor  # uint8 (4-bit codes two to a byte, float8 codes as their bytes)
    scales: torch.Tensor
    qmap: Optional[torch.Tensor]  # the codebook; None for float8 codes


def is_foreign(entry, names):
    """Whether a saved per-param entry comes from another optimizer (lbopt's own entries name their kind); names:
    the states of the optimizer loading it."""
    return isinstance(entry, dict) and "state_kind" not in entry and (
        any(n in entry for n in names) or "state1" in entry or _BNB_NESTED in entry)


def moments(entry, what, names):
    """{lbopt state name: Plain or Coded} and the saved step of a foreign entry, for the states `names` of the
    optimizer loading it: AdamW's moments in any format above; any other state as a float tensor under its own
    name (torch.optim.SGD's momentum_buffer)."""
    out = {}
    bnb = entry.get(_BNB_NESTED, entry)
    for name in names:
        value, bnb_index = entry.get(name), _BNB_INDEX.get(name)
        if value is None and bnb_index is not None:
            value = bnb.get("state" + bnb_index)
            if value is not None and value.dtype == torch.uint8:
                absmax, qmap = bnb.get("absmax" + bnb_index), bnb.get("qmap" + bnb_index)
                if absmax is None or qmap is None:
                    raise ValueError(f"lbopt: the bitsandbytes state{bnb_index} of {what} has no absmax or qmap")
                out[name] = Coded(_abi.STATE_8BIT, value, absmax, qmap)
                continue
        if value is None:
            continue
        if hasattr(value, "codes") and hasattr(value, "scale"):  # a torchao low-bit state
            codes = value.codes
            if codes.dtype == torch.float8_e4m3fn:
                out[name] = Coded(_abi.STATE_FP8, codes.view(torch.uint8), value.scale, None)
            else:
                kind = _SOURCE_KIND.get(value.qmap.numel())
                if kind is None:
                    raise ValueError(f"lbopt: {name} of {what} has a codebook of {value.qmap.numel()} entries")
                out[name] = Coded(kind, codes, value.scale, value.qmap)
        elif torch.is_tensor(value) and value.is_floating_point():
            out[name] = Plain(value)
        else:
            raise ValueError(f"lbopt: {name} of {what} is a {type(value).__name__}, not a state this library reads")
    if not out:
        raise ValueError(f"lbopt: the saved state of {what} holds no moments lbopt can read")
    return out, entry.get("step", bnb.get("step"))


def unpack(codes, kind):
    """One code per element: 4-bit bytes split into their two nibbles (element 2i in the high one)."""
    return torch.stack((codes >> 4, codes & 15), 1).reshape(-1) if kind == _abi.STATE_4BIT else codes


def _codebook(kind, moment):
    """lbopt's codebook of a kind and lbopt_moment as float32 values (each code decoded with scale 1)."""
    n = 16 if kind == _abi.STATE_4BIT else 256
    codes = torch.arange(n, dtype=torch.uint8)
    if kind == _abi.STATE_4BIT:
        codes = (codes[0::2] << 4) | codes[1::2]
    values = torch.empty(n)
    views = [tensor_view(codes), tensor_view(torch.ones(1)), tensor_view(values)]  # alive across the call
    state = _abi.State(views[0].ptr, views[1].ptr)
    _abi.check(_abi.lib.lbopt_dequantize(kind, moment, state, views[2].ptr, None))
    return values


_CODEBOOKS = {}


def codebook(kind, moment):
    key = (kind, moment)
    if key not in _CODEBOOKS:
        _CODEBOOKS[key] = _codebook(kind, moment)
    return _CODEBOOKS[key]


def decode(source, numel, what, name):
    """A saved moment as float32 values in row-major order of the param (torchao and bitsandbytes flatten
    row-major), checked against the param's element count."""
    if isinstance(source, Plain):
        values = source.values
        if values.numel() != numel:
            raise ValueError(f"lbopt: {name} of {what} has {values.numel()} elements, the param {numel}")
        return values.detach().to(torch.float32).reshape(-1)
    scales, qmap = source.scales, source.qmap
    codes = unpack(source.codes.reshape(-1), source.kind)
    if codes.numel() < numel or codes.numel() > numel + 1 or scales.numel() == 0:
        raise ValueError(f"lbopt: {name} of {what} has {codes.numel()} codes, the param {numel} elements")
    codes = codes[:numel].long()
    block = -(-numel // scales.numel())
    values = (qmap.to(torch.float32)[codes] if qmap is not None
              else codes.to(torch.uint8).view(torch.float8_e4m3fn).to(torch.float32))
    return values * scales.to(torch.float32).repeat_interleave(block)[:numel]


def copyable(source, kind, moment, numel):
    """Whether a coded source is already an lbopt state of `kind` and lbopt_moment `moment` for a row-major param:
    same codebook, same blocks, same packing."""
    if not isinstance(source, Coded) or source.kind != kind or kind == _abi.STATE_FP32:
        return False
    lay = _abi.layout(kind, numel)
    return (source.codes.numel() == lay.codes_numel and source.scales.numel() == lay.scales_numel
            and (source.qmap is None or torch.equal(source.qmap.to(torch.float32).cpu(), codebook(kind, moment))))
