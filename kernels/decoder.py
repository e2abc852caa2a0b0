"""Triton kernels of the GPU decode path's decoder layer (``models/fused.py``): few launches per
layer, each reading its operands once.

- ``rms_norm``: the residual add and the next RMSNorm in one pass;
- ``rope_write``: RoPE (after Qwen3's per-head RMSNorm) of the packed q / k / v projection, q to
  a buffer, k and v straight into the static KV cache at each sequence's slots;
- ``attention``: GQA over each sequence's live cache prefix, read once per KV head for all of
  its query heads and the T new rows (causal among themselves); long caches are split over the
  sequence (flash-decoding) and the splits merged by ``_merge_kernel``;
- ``silu_mul``: SiLU(gate) · up of the packed gate / up projection.

Rounding follows Hugging Face's modules op for op (each op's result in the model's dtype, the
norms and softmax in fp32), so in fp32 the layer matches the PyTorch one to summation order and
in bf16 it differs only where the attention's accumulation does. The PyTorch layer
(``models/target.run_layers``) is the reference: ``tests/parity/test_fused_decoder.py``.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _rms_norm_kernel(
    x_ptr, delta_ptr, weight_ptr, sum_ptr, out_ptr, eps, H: tl.constexpr, BLOCK: tl.constexpr,
    ADD: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)
    mask = cols < H
    dtype = out_ptr.dtype.element_ty
    x = tl.load(x_ptr + row * H + cols, mask=mask, other=0.0)
    if ADD:  # the residual stream, rounded as the model's own add
        delta = tl.load(delta_ptr + row * H + cols, mask=mask, other=0.0)
        x = (x.to(tl.float32) + delta.to(tl.float32)).to(dtype)
        tl.store(sum_ptr + row * H + cols, x, mask=mask)
    xf = x.to(tl.float32)
    rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=0) / H + eps)
    normed = (xf * rstd).to(dtype).to(tl.float32)
    weight = tl.load(weight_ptr + cols, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + row * H + cols, (weight * normed).to(dtype), mask=mask)


def rms_norm(
    x: torch.Tensor, weight: torch.Tensor, eps: float, delta: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(s, norm(s))`` with ``s = x + delta`` (or ``x``) over the last dim of ``x [..., H]``."""
    h = x.shape[-1]
    rows = x.numel() // h
    x = x.contiguous()
    out = torch.empty_like(x)
    total = x if delta is None else torch.empty_like(x)
    _rms_norm_kernel[(rows,)](
        x,
        x if delta is None else delta.contiguous(),
        weight,
        total,
        out,
        eps,
        H=h,
        BLOCK=triton.next_power_of_2(h),
        ADD=delta is not None,
    )
    return total, out


@triton.jit
def _rope_write_kernel(
    qkv_ptr, cos_ptr, sin_ptr, qk_norm_ptr, q_ptr, k_cache_ptr, v_cache_ptr, pos_ptr, eps, T, S,
    HEADS: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_HEADS: tl.constexpr,
    QK_NORM: tl.constexpr,
):  # fmt: skip
    row = tl.program_id(0)  # n * T + t: every head of one new token
    n, t = row // T, row % T
    dtype = q_ptr.dtype.element_ty
    head = tl.arange(0, BLOCK_HEADS)[:, None]  # q heads, then k heads, then v heads
    offs = tl.arange(0, D)[None, :]
    partner_offs = (offs + D // 2) % D
    is_q, is_k = head < HEADS, (head >= HEADS) & (head < HEADS + KV)
    is_v = (head >= HEADS + KV) & (head < HEADS + 2 * KV)
    base = qkv_ptr + row.to(tl.int64) * (HEADS + 2 * KV) * D + head * D
    x = tl.load(base + offs, mask=head < HEADS + 2 * KV, other=0.0)
    partner = tl.load(base + partner_offs, mask=is_q | is_k, other=0.0).to(tl.float32)
    if QK_NORM:  # per head, before RoPE; q's weights, then k's
        norm_ptr = qk_norm_ptr + is_k.to(tl.int32) * D
        xf = x.to(tl.float32)
        rstd = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
        weight = tl.load(norm_ptr + offs).to(tl.float32)
        normed = (weight * (xf * rstd).to(dtype).to(tl.float32)).to(dtype)
        partner_weight = tl.load(norm_ptr + partner_offs).to(tl.float32)
        partner = (partner_weight * (partner * rstd).to(dtype).to(tl.float32)).to(dtype)
        partner = partner.to(tl.float32)
    else:
        normed = x
    slot = tl.load(pos_ptr + n) + t  # the token's absolute position and cache slot
    cos = tl.load(cos_ptr + slot * D + offs).to(tl.float32)
    sin = tl.load(sin_ptr + slot * D + offs).to(tl.float32)
    rotated = tl.where(offs < D // 2, -partner, partner)
    roped = (
        (normed.to(tl.float32) * cos).to(dtype).to(tl.float32)
        + (rotated * sin).to(dtype).to(tl.float32)
    ).to(dtype)
    # q: [N, HEADS, T, D]; k (roped) and v: the caches [N, KV, S, D] at the token's slot
    tl.store(q_ptr + ((n * HEADS + head) * T + t).to(tl.int64) * D + offs, roped, mask=is_q)
    k_head = tl.where(is_k, head - HEADS, 0)
    tl.store(k_cache_ptr + ((n * KV + k_head) * S + slot).to(tl.int64) * D + offs, roped, mask=is_k)
    v_head = tl.where(is_v, head - HEADS - KV, 0)
    tl.store(v_cache_ptr + ((n * KV + v_head) * S + slot).to(tl.int64) * D + offs, x, mask=is_v)


def rope_write(
    qkv: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    positions: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    heads: int,
    qk_norm: tuple[torch.Tensor, float] | None = None,
) -> torch.Tensor:
    """RoPE of ``qkv [N, T, (heads + 2 KV) D]`` (q heads, k heads, v heads); ``cos, sin [P, D]``
    are the tables by absolute position (P > every position). k and v are written into
    ``k_cache, v_cache [N, KV, S, D]`` at slots ``positions[i]`` .. ``positions[i] + T - 1``.
    Returns q [N, heads, T, D]. ``qk_norm``: (the q_norm and k_norm weights stacked [2, D], eps),
    RMSNorm per head before RoPE (Qwen3)."""
    n, t, _ = qkv.shape
    _, kv, s, d = k_cache.shape
    q = torch.empty((n, heads, t, d), dtype=qkv.dtype, device=qkv.device)
    norm_weights, eps = qk_norm if qk_norm is not None else (cos, 0.0)
    _rope_write_kernel[(n * t,)](
        qkv.contiguous(),
        cos,
        sin,
        norm_weights,
        q,
        k_cache,
        v_cache,
        positions,
        eps,
        t,
        s,
        HEADS=heads,
        KV=kv,
        D=d,
        BLOCK_HEADS=triton.next_power_of_2(heads + 2 * kv),
        QK_NORM=qk_norm is not None,
    )
    return q


@triton.jit
def _attention_kernel(
    q_ptr, k_ptr, v_ptr, pos_ptr, out_ptr, part_ptr, stats_ptr, scale, T, S, split_len,
    HEADS: tl.constexpr, KV: tl.constexpr, D: tl.constexpr, BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr, SPLIT: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    n, kv_head, split = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    group = HEADS // KV
    rows = tl.arange(0, BLOCK_M)  # row r: query head kv_head * group + r // T, new token r % T
    head, t = kv_head * group + rows // T, rows % T
    live = rows < group * T
    dims = tl.arange(0, D)
    q_rows = ((n * HEADS + head) * T + t).to(tl.int64) * D
    q = tl.load(q_ptr + q_rows[:, None] + dims[None, :], mask=live[:, None], other=0.0)
    start = tl.load(pos_ptr + n)
    query_pos = start + t
    lo = split * split_len
    hi = tl.minimum(lo + split_len, start + T)  # the live prefix: keys before the last new token
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    cache = (n * KV + kv_head).to(tl.int64) * S * D
    for key_start in range(lo, hi, BLOCK_N):
        key_pos = key_start + tl.arange(0, BLOCK_N)
        key_live = key_pos < hi
        where = cache + key_pos[:, None].to(tl.int64) * D + dims[None, :]
        k = tl.load(k_ptr + where, mask=key_live[:, None], other=0.0)
        scores = tl.dot(q, tl.trans(k), input_precision=PRECISION) * scale
        visible = (key_pos[None, :] <= query_pos[:, None]) & key_live[None, :]
        scores = tl.where(visible, scores, float("-inf"))
        m_new = tl.maximum(m, tl.max(scores, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows with no key yet
        p = tl.exp(scores - m_safe[:, None])
        alpha = tl.exp(m - m_safe)
        total = total * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + where, mask=key_live[:, None], other=0.0)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m = m_new
    if SPLIT:  # partial (acc, max, sum) of this split: [N, KV, splits, BLOCK_M, ...]
        part = ((n * KV + kv_head) * tl.num_programs(2) + split).to(tl.int64) * BLOCK_M
        tl.store(part_ptr + (part + rows)[:, None] * D + dims[None, :], acc)
        tl.store(stats_ptr + (part + rows) * 2, m)
        tl.store(stats_ptr + (part + rows) * 2 + 1, total)
    else:  # out: [N, T, HEADS, D]
        out_rows = ((n * T + t) * HEADS + head).to(tl.int64) * D
        out = acc / total[:, None]
        tl.store(out_ptr + out_rows[:, None] + dims[None, :], out, mask=live[:, None])


@triton.jit
def _merge_kernel(
    part_ptr, stats_ptr, out_ptr, T, SPLITS, HEADS: tl.constexpr, KV: tl.constexpr,
    D: tl.constexpr, BLOCK_M: tl.constexpr,
):  # fmt: skip
    n, kv_head = tl.program_id(0), tl.program_id(1)
    group = HEADS // KV
    rows = tl.arange(0, BLOCK_M)
    head, t = kv_head * group + rows // T, rows % T
    live = rows < group * T
    dims = tl.arange(0, D)
    m = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    total = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    for split in range(0, SPLITS):
        part = ((n * KV + kv_head) * SPLITS + split).to(tl.int64) * BLOCK_M
        m_split = tl.load(stats_ptr + (part + rows) * 2)
        m_new = tl.maximum(m, m_split)
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha, beta = tl.exp(m - m_safe), tl.exp(m_split - m_safe)
        total = total * alpha + tl.load(stats_ptr + (part + rows) * 2 + 1) * beta
        split_acc = tl.load(part_ptr + (part + rows)[:, None] * D + dims[None, :])
        acc = acc * alpha[:, None] + split_acc * beta[:, None]
        m = m_new
    out_rows = ((n * T + t) * HEADS + head).to(tl.int64) * D
    tl.store(out_ptr + out_rows[:, None] + dims[None, :], acc / total[:, None], mask=live[:, None])


def attention_splits(batch: int, kv_heads: int, max_len: int, device: torch.device) -> int:
    """Splits of the sequence for flash-decoding: enough programs to fill the GPU twice over,
    each split at least 256 slots long (1 on CPU)."""
    if device.type != "cuda":
        return 1
    programs = 2 * torch.cuda.get_device_properties(device).multi_processor_count
    return max(1, min(triton.cdiv(max_len, 256), triton.cdiv(programs, batch * kv_heads)))


def attention(
    q: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    positions: torch.Tensor,
    scale: float,
    splits: int = 1,
) -> torch.Tensor:
    """Causal GQA of ``q [N, heads, T, D]`` (new tokens at ``positions[i]`` ..) over the cache
    ``[N, KV, S, D]`` (those tokens already written); reads slots ``< positions[i] + T`` only.
    Returns [N, T, heads · D]."""
    n, heads, t, d = q.shape
    _, kv, s, _ = k_cache.shape
    block_m = max(16, triton.next_power_of_2(heads // kv * t))
    out = torch.empty((n, t, heads, d), dtype=q.dtype, device=q.device)
    split_len = triton.cdiv(triton.cdiv(s, splits), 16) * 16
    if splits > 1:
        part = torch.empty((n, kv, splits, block_m, d), dtype=torch.float32, device=q.device)
        stats = torch.empty((n, kv, splits, block_m, 2), dtype=torch.float32, device=q.device)
    else:
        part = stats = out
    _attention_kernel[(n, kv, splits)](
        q,
        k_cache,
        v_cache,
        positions,
        out,
        part,
        stats,
        scale,
        t,
        s,
        split_len,
        HEADS=heads,
        KV=kv,
        D=d,
        BLOCK_M=block_m,
        BLOCK_N=min(64, max(16, triton.next_power_of_2(split_len))),
        SPLIT=splits > 1,
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32",  # fp32: no TF32 rounding
    )
    if splits > 1:
        _merge_kernel[(n, kv)](
            part, stats, out, t, splits, HEADS=heads, KV=kv, D=d, BLOCK_M=block_m
        )
    return out.view(n, t, heads * d)


@triton.jit
def _silu_mul_kernel(x_ptr, out_ptr, inner, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < inner
    dtype = out_ptr.dtype.element_ty
    gate = tl.load(x_ptr + row * 2 * inner + cols, mask=mask, other=0.0).to(tl.float32)
    up = tl.load(x_ptr + row * 2 * inner + inner + cols, mask=mask, other=0.0).to(tl.float32)
    silu = (gate / (1.0 + tl.exp(-gate))).to(dtype).to(tl.float32)
    tl.store(out_ptr + row * inner + cols, (silu * up).to(dtype), mask=mask)


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of ``gate_up [..., 2 I]`` (gate first) -> [..., I]."""
    inner = gate_up.shape[-1] // 2
    rows = gate_up.numel() // (2 * inner)
    out = torch.empty((*gate_up.shape[:-1], inner), dtype=gate_up.dtype, device=gate_up.device)
    block = min(1024, triton.next_power_of_2(inner))
    _silu_mul_kernel[(rows, triton.cdiv(inner, block))](
        gate_up.contiguous(), out, inner, BLOCK=block
    )
    return out
