"""The truncation's order as one int64 key per (logit, id), shared by the portable kernels' hand-in
(``verify_resample``) and the Hopper kernel's (``hopper_tiles``).

``reference/truncation.py`` orders tokens by descending logit, then ascending id. A key holds the
logit's fp32 bits mapped monotonically to int32 in its high word (-0.0 as +0.0, so that equal
logits tie) and ``2**31 - 1 - id`` in its low word, so a larger key comes earlier. ``EMPTY_KEY``
is below every key (a -inf logit's included); ``FULL_KEY`` above every key.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

EMPTY_KEY: tl.constexpr = tl.constexpr(-(2**63))
FULL_KEY: tl.constexpr = tl.constexpr(2**63 - 1)
LOW_WORD: tl.constexpr = tl.constexpr(2**31 - 1)
EMPTY_VALUE_KEY: tl.constexpr = tl.constexpr(-(2**31))  # below every ``value_key``


@triton.jit
def value_key(logits):
    """int32 keys of fp32 ``logits`` in their order (a key's high word): larger = larger, -0.0
    as +0.0; -inf's key is above ``EMPTY_VALUE_KEY``."""
    finite_zero = tl.where(logits == 0.0, 0.0, logits)  # named: the interpreter's .to needs it
    bits = finite_zero.to(tl.int32, bitcast=True)
    return tl.where(bits >= 0, bits, bits ^ LOW_WORD)


@triton.jit
def decode_value_key(ordered):
    """The fp32 logits of int32 ``value_key`` keys."""
    bits = tl.where(ordered >= 0, ordered, ordered ^ LOW_WORD)
    return bits.to(tl.float32, bitcast=True)


@triton.jit
def order_key(logits, ids):
    """int64 order keys of fp32 ``logits`` at int ``ids`` (broadcast): larger = earlier."""
    low = LOW_WORD - ids
    return (value_key(logits).to(tl.int64) << 32) | low.to(tl.int64)


@triton.jit
def decode_key(keys):
    """(logit fp32, id int64) of int64 order keys (``order_key``'s inverse, as ``decode_keys``;
    the low word of a key is ``2**31 - 1 - id`` >= 0, so its bit 31 is clear)."""
    logit = decode_value_key((keys >> 32).to(tl.int32))
    low = keys & LOW_WORD
    return logit, -low + LOW_WORD  # 2**31 - 1 - low (the interpreter: the tensor first)


def decode_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(logit float32, id int64) of int64 order keys (``order_key``'s inverse)."""
    ordered = (keys >> 32).to(torch.int32)
    bits = torch.where(ordered >= 0, ordered, ordered ^ (2**31 - 1))
    return bits.view(torch.float32), (2**31 - 1) - (keys & (2**32 - 1))
