"""The two-pass baseline of ``scripts/bench_kernels.py``: cuBLAS writes the logits, then ONE fused
Triton kernel reads them once and takes each row's Gumbel-max sample with Philox noise
(``tl.rand``), the design of FlashInfer's ``sampling_from_logits``; a draft is accepted iff it
equals its row's sample (the coupled rule with another noise function).

The sampling kernel splits a row's vocabulary over programs when there are fewer rows than twice
the SMs, and the programs of a row meet in one 64-bit ``atomic_max`` of (score, lowest id)
packed so that integer order is score order, ties to the lower id: no second kernel, no
host synchronisation. It is what a careful engineer would write instead of fusing the sampler
into the LM-head GEMM, so the fused op's lead over it is the lead that fusion buys.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashspec_export.reference.sampled_verify import select_emitted
from flashspec_export.reference.verify_resample import count_accepted

BLOCK_V = 1024
_EMPTY = -(2**63)  # below every packed (score, id)


@triton.jit
def _gumbel_max_kernel(
    logits_ptr,  # [R, V_pad] bf16 / fp16 / fp32
    inv_temperature_ptr,  # [R] float32
    best_ptr,  # [R] int64: packed (score, 2^31 - 1 - id), atomically maxed
    stride_row,
    vocab_size,
    ids_per_split,
    seed,
    BLOCK_V: tl.constexpr,
):
    row = tl.program_id(0)
    start = tl.program_id(1) * ids_per_split
    stop = tl.minimum(start + ids_per_split, vocab_size)
    inv_t = tl.load(inv_temperature_ptr + row)
    best = tl.full([BLOCK_V], float("-inf"), tl.float32)
    best_id = tl.zeros([BLOCK_V], tl.int32)
    for first in range(start, stop, BLOCK_V):
        ids = first + tl.arange(0, BLOCK_V)
        ok = ids < stop
        logit = tl.load(logits_ptr + row.to(tl.int64) * stride_row + ids, mask=ok, other=0.0)
        u = tl.rand(seed, row * vocab_size + ids)  # Philox, [0, 1)
        score = logit.to(tl.float32) * inv_t - tl.log(-tl.log(u))
        score = tl.where(ok, score, float("-inf"))
        take = score > best  # each lane's ids ascend: strict keeps the lowest
        best = tl.where(take, score, best)
        best_id = tl.where(take, ids, best_id)
    top = tl.max(best, 0)
    top_id = tl.min(tl.where(best == top, best_id, 2**31 - 1), 0)
    bits = top.to(tl.int32, bitcast=True)
    ordered = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)  # float order as signed int order
    packed = (ordered.to(tl.int64) << 32) | (2**31 - 1 - top_id).to(tl.int64)
    tl.atomic_max(best_ptr + row, packed)


def gumbel_max(logits: torch.Tensor, temperature: torch.Tensor, vocab_size: int, seed: int):
    """``argmax_v (logits[r, v] / T_r + g_r,v)`` per row of ``logits [R, V_pad]`` over the first
    ``vocab_size`` ids (lowest id on ties), ``g`` Gumbel noise from Philox keyed by ``seed``, row
    and id; ``temperature [R] > 0``. Returns [R] int64."""
    rows = logits.shape[0]
    sms = (
        torch.cuda.get_device_properties(logits.device).multi_processor_count
        if (logits.is_cuda)
        else 1
    )
    splits = max(1, min(triton.cdiv(vocab_size, 4 * BLOCK_V), triton.cdiv(2 * sms, rows)))
    ids_per_split = triton.cdiv(triton.cdiv(vocab_size, splits), BLOCK_V) * BLOCK_V
    best = torch.full((rows,), _EMPTY, dtype=torch.int64, device=logits.device)
    grid = (rows, triton.cdiv(vocab_size, ids_per_split))
    _gumbel_max_kernel[grid](
        logits,
        (1.0 / temperature).float().contiguous(),
        best,
        logits.stride(0),
        vocab_size,
        ids_per_split,
        seed,
        BLOCK_V=BLOCK_V,
        num_warps=4,
    )
    return (2**31 - 1) - (best & 0xFFFFFFFF)


def two_pass_verify(hidden, lm_head, drafts, temperature, vocab_size: int, seed: int = 0):
    """VerifyResample the two-pass way: ``hidden [N, γ+1, H] @ lm_head [V_pad, H]ᵀ`` by cuBLAS
    into logits of hidden's dtype, the one sampling kernel, then accept the drafts equal to their
    row's sample. Returns (tokens [N, γ+1], num_emitted [N])."""
    n, width, hidden_size = hidden.shape
    logits = hidden.reshape(-1, hidden_size) @ lm_head.T  # [R, V_pad]: the whole padded head
    y = gumbel_max(logits, temperature.repeat_interleave(width), vocab_size, seed)
    y = y.reshape(n, width)
    k = count_accepted(drafts == y[:, : width - 1])
    return select_emitted(k, drafts, y, fill=-1), k + 1
