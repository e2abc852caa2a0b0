"""Triton ``VerifyResample``: verify γ greedy drafts and emit the next tokens in one LM-head stream.

Terms are those of ``flashspec_export.reference.verify_resample`` (the specification). The rows
of ``hidden [N, γ + 1, H]`` are flattened to ``R = N · (γ + 1)``; row ``r = n · (γ + 1) + i``.

Stage 1 (``_verify_tiles_kernel``), grid ``(row blocks, vocabulary splits)``: a program owns
``BLOCK_N`` flattened rows and a contiguous run of ``BLOCK_V``-id tiles. Per tile it forms the
fp32 logits ``hidden_block · lm_head_tileᵀ / scale`` (``scale = T``, or 1 for greedy rows) and
folds them into running values per row (with ``EPI_ROWS`` below ``BLOCK_N``, for launches of
fewer rows than tl.dot's 16, only the block's first ``EPI_ROWS`` rows are loaded and scored):

- ``best_score, best_index``: the two-level sample over the run's 64-id blocks
  (``kernels/block_sample.py``): the best block score and its pick, the lowest block on ties
  (greedy rows: ``argmax_v l_v``, lowest index on ties);
- with ``RETURN_LOGPROBS`` only: ``best_logit`` (``l(y)``) and the online softmax ``m, s``
  (``s = Σ exp(l_v - m)`` rescaled by ``exp(m_old - m_new)``); without it no ``exp`` is spent
  per logit.

The noise is generated in registers: the row keys on ``STREAM_GUMBEL`` and ``STREAM_PICK`` once
per program, then one ``token_bits`` of each per 64-id block (the block's Gumbel and uniform).
Memory traffic: the LM head is read once per row block (once in all when ``R <= BLOCK_N``); the
hidden block is re-read per tile from L2; per (row, split) two scalars are written (five with
log-probabilities). No vocabulary-sized tensor exists outside registers.

Stage 2 (``_verify_finalize_kernel``), one program per sequence: reduces the splits like the
reference ``finalize`` (best score with the lowest split on ties; with log-probabilities
``M = max m``, ``S = Σ s · exp(m - M)``, ``LSE = M + log S``), accepts the draft ``x = d[n, i]``
iff ``x == y_i``, and writes ``y_0 .. y_k`` (k leading accepts), ``num_emitted`` and the
log-probabilities. No host synchronisation.

The reference reduces per-tile summaries of 4096 ids; the splits here differ, so ``LSE`` may
differ from it in the last ulps of fp32. Tokens agree except at near-ties.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.block_sample import SAMPLE_BLOCK, tile_block_sample
from flashspec_export.kernels.noise import (
    STREAM_GUMBEL,
    STREAM_PICK,
    exponential_race,
    gumbel_from_bits,
    math_exp,
    math_log,
    row_keys,
    token_bits,
    use_libdevice,
)
from flashspec_export.kernels.order_keys import (
    EMPTY_KEY,
    EMPTY_VALUE_KEY,
    FULL_KEY,
    decode_key,
    decode_value_key,
    order_key,
    value_key,
)
from flashspec_export.kernels.tiles import (
    KernelConfig,
    check_device,
    dot_options,
    dot_tile,
    hand_in_config,
    resolve_config,
)
from flashspec_export.ops.workspace import launch_workspace
from flashspec_export.reference import truncation
from flashspec_export.reference import verify_resample as reference
from flashspec_export.reference.verify_resample import VerifyResult

# Float fields of the stage-1 workspace [NUM_FIELDS, R, S] (the last three only written with
# log-probabilities); the index field is a separate int32 [R, S] tensor.
NUM_FLOAT_FIELDS = 4
_BEST_SCORE, _BEST_LOGIT, _MAX, _SUM_EXP = range(NUM_FLOAT_FIELDS)
F_BEST_SCORE: tl.constexpr = tl.constexpr(_BEST_SCORE)
F_BEST_LOGIT: tl.constexpr = tl.constexpr(_BEST_LOGIT)
F_MAX: tl.constexpr = tl.constexpr(_MAX)
F_SUM_EXP: tl.constexpr = tl.constexpr(_SUM_EXP)
GREEDY_BELOW: tl.constexpr = tl.constexpr(reference.GREEDY_BELOW)  # T below it: a greedy row


@triton.jit
def _first_rows(acc, EPI_ROWS: tl.constexpr):
    """The first ``EPI_ROWS`` rows of ``acc [BLOCK_N, BLOCK_V]`` (the others are padding): the
    sum over the row groups of its ``[BLOCK_N / EPI_ROWS, EPI_ROWS, BLOCK_V]`` view with the
    other groups as -0.0, which leaves every value, signed zeros included, unchanged."""
    BLOCK_N: tl.constexpr = acc.shape[0]
    BLOCK_V: tl.constexpr = acc.shape[1]
    groups = tl.reshape(acc, [BLOCK_N // EPI_ROWS, EPI_ROWS, BLOCK_V])
    first = tl.arange(0, BLOCK_N // EPI_ROWS)[:, None, None] == 0
    return tl.sum(tl.where(first, groups, -0.0), 0)


@triton.jit
def _allowed(allowed_ptr, rows, row_ok, tile, num_words, BLOCK_V: tl.constexpr):
    """[ROWS, BLOCK_V] bool: the tile's ids allowed by the rows' masks, from the tile's
    ``BLOCK_V / 32`` words per row (bit j of word w allows id 32·w + j)."""
    word = tile * (BLOCK_V // 32) + tl.arange(0, BLOCK_V // 32)
    ok = row_ok[:, None] & (word[None, :] < num_words)
    words = tl.load(
        allowed_ptr + rows.to(tl.int64)[:, None] * num_words + word[None, :], mask=ok, other=0
    )
    bits = (words[:, :, None] >> tl.arange(0, 32)[None, None, :]) & 1
    return tl.reshape(bits, [rows.shape[0], BLOCK_V]) != 0


_HAND_IN_CAP: tl.constexpr = hopper_tiles.HAND_IN_CAP


@triton.jit
def _hand_in_tile(keep, dots, cols, rows, count_ptr, hand_in_ptr):
    """The portable kernel's hand-in of a tile (``hopper_tiles._hand_in_chunk``'s): the order
    keys of the raw ``dots [ROWS, BLOCK_V]`` that ``keep`` (at or above the row's threshold,
    allowed, finite) appended to their rows' keys (``hand_in_ptr [R, HAND_IN_CAP]``, in no order)
    at the slots one relaxed atomic per row hands out (``count_ptr [R]``); counts past
    HAND_IN_CAP keep counting and store nothing (stage 2 then does not settle the row)."""
    take = keep.to(tl.int32)
    count = tl.sum(take, 1)
    base = tl.atomic_add(count_ptr + rows, count, mask=count > 0, sem="relaxed")
    slot = base[:, None] + tl.cumsum(take, 1) - take
    offsets = rows.to(tl.int64)[:, None] * _HAND_IN_CAP + slot
    tl.store(
        hand_in_ptr + offsets, order_key(dots, cols[None, :]), mask=keep & (slot < _HAND_IN_CAP)
    )


@triton.jit(do_not_specialize=["num_rows", "gamma", "num_splits", "tiles_per_split"])
def _verify_tiles_kernel(
    hidden_ptr,  # [N, γ + 1, H]
    lm_head_ptr,  # [V, H]
    temperature_ptr,  # [N] float32
    seed_ptr,  # [N] int64
    positions_ptr,  # [N] int64
    ws_float_ptr,  # [4, R, S] float32: best_score, best_logit, max, sum_exp
    ws_index_ptr,  # [R, S] int32: best_index
    truncated_ptr,  # [N] int32: 1 where top-k / top-p apply (HAND_IN only)
    allowed_ptr,  # [R, W] int32 allowed-token bit masks (only with MASKED)
    threshold_ptr,  # [R] float32: the dot a row hands in from (HAND_IN only; NaN: none)
    count_ptr,  # [R] int32: keys handed in, zero before the launch (HAND_IN only)
    hand_in_ptr,  # [R, HAND_IN_CAP] int64 out: the handed-in keys (HAND_IN only)
    num_rows,  # R = N · (γ + 1)
    gamma,
    vocab_size,
    num_splits,
    tiles_per_split,
    num_words,  # W = ceil(vocab_size / 32)
    stride_hn,
    stride_hi,
    stride_hh,
    stride_vv,
    stride_vh,
    HIDDEN_SIZE: tl.constexpr,  # fixed per model: the dot's loop bound
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
    EPI_ROWS: tl.constexpr,  # rows the epilogue scores: BLOCK_N, or fewer when R is below it
    MASKED: tl.constexpr = False,  # apply allowed_tokens (read once per tile)
    HAND_IN: tl.constexpr = False,  # hand in every dot at or above the row's threshold
):
    pid_r = tl.program_id(0)
    pid_s = tl.program_id(1)

    # ---- the dot's BLOCK_N rows (tl.dot's 16-row minimum): those past EPI_ROWS load zeros
    dot_rows = pid_r * BLOCK_N + tl.arange(0, BLOCK_N)
    dot_seq = dot_rows // (gamma + 1)
    dot_ok = (dot_rows < num_rows) & (tl.arange(0, BLOCK_N) < EPI_ROWS)
    row_off = (
        dot_seq.to(tl.int64) * stride_hn
        + (dot_rows - dot_seq * (gamma + 1)).to(tl.int64) * stride_hi
    )  # [BLOCK_N]

    # ---- per-row state of the scored rows, loaded once: sequence n, draft position i,
    # temperature, noise keys
    rows = pid_r * BLOCK_N + tl.arange(0, EPI_ROWS)
    row_ok = rows < num_rows
    seq = rows // (gamma + 1)
    pos_i = rows - seq * (gamma + 1)
    temperature = tl.load(temperature_ptr + seq, mask=row_ok, other=1.0)
    greedy = temperature < GREEDY_BELOW  # reference.verify_resample.GREEDY_BELOW
    scale = tl.where(greedy, 1.0, temperature)  # logits = dot / T, or the raw dot (greedy)
    seed = tl.load(seed_ptr + seq, mask=row_ok, other=0)
    position = tl.load(positions_ptr + seq, mask=row_ok, other=0) + pos_i
    g_a, g_b = row_keys(seed, position, STREAM_GUMBEL)  # [EPI_ROWS] uint32 each
    u_a, u_b = row_keys(seed, position, STREAM_PICK)
    # A block of greedy rows only (T = 0 serving) skips the noise: its scores are the logits;
    # so does a block whose sampled rows are all truncated (their winner is taken from the
    # hand-in in stage 2, ``_truncated_summaries``).
    sampled = row_ok & (temperature >= GREEDY_BELOW)
    if HAND_IN:
        sampled &= tl.load(truncated_ptr + seq, mask=row_ok, other=0) == 0
        theta = tl.load(threshold_ptr + rows, mask=row_ok, other=float("nan"))  # NaN: none
        any_hand_in = tl.max(tl.where(theta == theta, 1, 0), 0) > 0
    any_sampled = tl.max(tl.where(sampled, 1, 0), 0) > 0

    m = tl.full([EPI_ROWS], float("-inf"), tl.float32)
    s = tl.zeros([EPI_ROWS], tl.float32)
    best_score = tl.full([EPI_ROWS], float("-inf"), tl.float32)
    best_index = tl.full([EPI_ROWS], -1, tl.int32)
    best_logit = tl.zeros([EPI_ROWS], tl.float32)

    # A fixed trip count: the last split may run past the vocabulary; its tiles are fully
    # masked, load nothing, and change no running value.
    for j in range(0, tiles_per_split):
        tile = pid_s * tiles_per_split + j
        tile_valid = tile * BLOCK_V < vocab_size
        cols, col_ok, acc = dot_tile(
            hidden_ptr,
            lm_head_ptr,
            row_off,
            dot_ok,
            tile,
            vocab_size,
            stride_vv,
            stride_hh,
            stride_vh,
            HIDDEN_SIZE,
            DOT_PRECISION,
            DOT_IN_FP32,
            BLOCK_N,
            BLOCK_V,
            BLOCK_H,
        )  # [BLOCK_N, BLOCK_V] fp32
        if EPI_ROWS < BLOCK_N:
            acc = _first_rows(acc, EPI_ROWS)  # [EPI_ROWS, BLOCK_V]
        # IEEE division, as the reference's `logits / scale` (not a reciprocal multiply).
        logits = tl.math.div_rn(acc, scale[:, None])
        # padded ids and NaN logits: -inf (never sampled, exp = 0; reference.no_nan)
        valid = col_ok[None, :] & (logits == logits)
        if MASKED:
            valid &= _allowed(allowed_ptr, rows, row_ok, tile, num_words, BLOCK_V)
        logits = tl.where(valid, logits, float("-inf"))
        if HAND_IN:  # noqa: SIM102 (constexpr, then a runtime branch)
            if any_hand_in:
                _hand_in_tile(valid & (acc >= theta[:, None]), acc, cols, rows, count_ptr,
                              hand_in_ptr)  # fmt: skip

        # The two-level sample: per 64-id block an exp per logit, running sums and one hash
        # pair; greedy rows take the argmax of their logits.
        tile_best, tile_arg = tl.max(logits, 1, return_indices=True,
                                     return_indices_tie_break_left=True)  # fmt: skip
        if any_sampled:
            sampled_best, _, sampled_arg = tile_block_sample(
                logits, tile * (BLOCK_V // SAMPLE_BLOCK), g_a, g_b, u_a, u_b, LIBDEVICE
            )
            tile_best = tl.where(greedy, tile_best, sampled_best)
            tile_arg = tl.where(greedy, tile_arg, sampled_arg)
        take = (tile_best > best_score) | ((best_index < 0) & tile_valid)
        best_score = tl.where(take, tile_best, best_score)
        best_index = tl.where(take, tile * BLOCK_V + tile_arg, best_index)
        if RETURN_LOGPROBS:
            tile_logit = tl.sum(
                tl.where(tl.arange(0, BLOCK_V)[None, :] == tile_arg[:, None], logits, 0.0), 1
            )
            best_logit = tl.where(take, tile_logit, best_logit)
            # Online softmax; m_ref stands in for m_new = -inf (nothing valid seen yet) so that
            # exp(-inf - -inf) never occurs: s stays 0.
            m_new = tl.maximum(m, tl.max(logits, 1))
            m_ref = tl.where(m_new == float("-inf"), 0.0, m_new)
            s = s * tl.exp(m - m_ref) + tl.sum(tl.exp(logits - m_ref[:, None]), 1)
            m = m_new

    plane = num_rows * num_splits
    ws_off = rows * num_splits + pid_s
    tl.store(ws_float_ptr + F_BEST_SCORE * plane + ws_off, best_score, mask=row_ok)
    tl.store(ws_index_ptr + ws_off, best_index, mask=row_ok)
    if RETURN_LOGPROBS:
        tl.store(ws_float_ptr + F_BEST_LOGIT * plane + ws_off, best_logit, mask=row_ok)
        tl.store(ws_float_ptr + F_MAX * plane + ws_off, m, mask=row_ok)
        tl.store(ws_float_ptr + F_SUM_EXP * plane + ws_off, s, mask=row_ok)


@triton.jit(do_not_specialize=["num_rows", "gamma", "num_splits", "stride_dn"])
def _verify_finalize_kernel(
    ws_float_ptr,  # [4, R, S] float32
    ws_index_ptr,  # [R, S] int32
    draft_ptr,  # [N, γ] int64
    tokens_ptr,  # [N, γ + 1] int64 out
    num_emitted_ptr,  # [N] int64 out
    logprobs_ptr,  # [N, γ + 1] float32 out (only with RETURN_LOGPROBS)
    num_rows,
    gamma,
    num_splits,
    stride_dn,
    stride_di,
    RETURN_LOGPROBS: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    BLOCK_R: tl.constexpr,  # >= γ + 1
    BLOCK_S: tl.constexpr,  # >= S
):
    n = tl.program_id(0)
    i = tl.arange(0, BLOCK_R)  # draft position
    split = tl.arange(0, BLOCK_S)
    row_ok = i <= gamma
    mask = row_ok[:, None] & (split[None, :] < num_splits)
    plane = num_rows * num_splits
    off = (n * (gamma + 1) + i)[:, None] * num_splits + split[None, :]  # [BLOCK_R, BLOCK_S]

    # ---- y_i: the best split's candidate (the lowest split on ties, as the reference's tiles)
    score = tl.load(ws_float_ptr + F_BEST_SCORE * plane + off, mask=mask, other=float("-inf"))
    _, best_split = tl.max(score, 1, return_indices=True, return_indices_tie_break_left=True)
    chosen = split[None, :] == best_split[:, None]
    index = tl.load(ws_index_ptr + off, mask=mask, other=0)
    y = tl.sum(tl.where(chosen, index, 0), 1).to(tl.int64)  # [BLOCK_R]

    # ---- accept drafts left to right while x == y: k = the first rejected position (γ if none)
    has_draft = i < gamma
    draft = tl.load(draft_ptr + n * stride_dn + i * stride_di, mask=has_draft, other=-1)
    accept = has_draft & (draft == y)
    k = tl.min(tl.where(accept, BLOCK_R, i), 0)  # row γ never accepts, so k <= γ

    # ---- emit y_0 .. y_k (the accepted drafts, then the recovered or bonus token), then -1
    tl.store(tokens_ptr + n * (gamma + 1) + i, tl.where(i <= k, y, -1), mask=row_ok)
    tl.store(num_emitted_ptr + n, (k + 1).to(tl.int64))
    if RETURN_LOGPROBS:
        m = tl.load(ws_float_ptr + F_MAX * plane + off, mask=mask, other=float("-inf"))
        s = tl.load(ws_float_ptr + F_SUM_EXP * plane + off, mask=mask, other=0.0)
        big_m = tl.where(row_ok, tl.max(m, 1), 0.0)  # padding rows: 0, never -inf - -inf
        total = tl.where(row_ok, tl.sum(s * math_exp(m - big_m[:, None], LIBDEVICE), 1), 1.0)
        lse = big_m + math_log(total, LIBDEVICE)
        logit = tl.load(ws_float_ptr + F_BEST_LOGIT * plane + off, mask=mask, other=0.0)
        best_logit = tl.sum(tl.where(chosen, logit, 0.0), 1)
        logprobs = tl.where(i <= k, best_logit - lse, 0.0)
        tl.store(logprobs_ptr + n * (gamma + 1) + i, logprobs, mask=row_ok)


# The finalize's block of draft positions: at least 4, so that γ = 0..3 share one compiled kernel
# (kernels/aot.py compiles 4 and 8, as the library picks them).
FINALIZE_MIN_ROWS = 4


def finalize_warps(block_r: int, block_s: int) -> int:
    """The finalize's warps for a ``[block_r, block_s]`` block: about 8 summaries per thread,
    4 to 16 warps. One program holds a sequence's whole block, so its load and reduction are
    latency: at the Hopper path's split counts (H100, γ 3, docs/bench/finalize_variants_h100.log)
    4 warps of BLOCK_R 8 took 8.0 µs at 1002 splits and 15.1 at 2048; 16 warps of BLOCK_R 4,
    3.2 and 4.4."""
    return min(16, max(4, block_r * block_s // 256))


class VerifyWorkspace(NamedTuple):
    """Stage-1 summaries: ``floats [4, R, S]`` float32 and ``index [R, S]`` int32."""

    floats: torch.Tensor
    index: torch.Tensor


def make_workspace(rows: int, num_splits: int, device: torch.device) -> VerifyWorkspace:
    """Allocate a workspace for ``rows = N · (γ + 1)`` flattened rows and ``num_splits`` splits."""
    return VerifyWorkspace(
        torch.empty((NUM_FLOAT_FIELDS, rows, num_splits), dtype=torch.float32, device=device),
        torch.empty((rows, num_splits), dtype=torch.int32, device=device),
    )


def verify_resample(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    *,
    return_logprobs: bool = False,
    config: KernelConfig | None = None,
    workspace: VerifyWorkspace | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    allowed_tokens: torch.Tensor | None = None,
    settle_only: bool = False,
) -> VerifyResult:
    """Verify γ greedy drafts per sequence and emit the next tokens (Triton, two launches).

    Parameters
    ----------
    hidden : [N, γ + 1, H] float32 / bfloat16 / float16
    lm_head : [V, H], same dtype as ``hidden``
    draft_tokens : [N, γ] int64, ids in [0, vocab_size)
    temperature : [N] float32, >= 0 (0: greedy target)
    seed : [N] int64, >= 0
    positions : [N] int64, absolute position of row 0 (keys the noise)
    vocab_size : logical vocabulary; LM-head rows >= vocab_size are padding
    return_logprobs : also return the target log-probabilities of the emitted tokens
    config : launch configuration (default: ``choose_config`` for ``N · (γ + 1)`` rows)
    workspace : stage-1 buffers from ``make_workspace(N · (γ + 1), config.num_splits, device)``;
        default: views of one buffer per (device, stream), fresh during CUDA-graph capture
        (``flashspec_export.ops.workspace``)
    top_k : [N] int64 (0: off), top_p : [N] float32 in (0, 1] (1: off), allowed_tokens :
        [N, γ + 1, ceil(vocab_size / 32)] int32 bit masks — the truncation of
        ``reference/truncation.py``, fused: the mask is read once per tile (by the Hopper kernel
        too); top-k / top-p: each truncated row hands in its dots above a threshold
        (``_hand_in_thresholds``), stage 2 settles the kept set from them
        (``_truncated_summaries``), and a sequence whose kept set they do not settle is
        recomputed materialised, after one flag read back to the host
    settle_only : return ``(result, unsettled [R] bool)``: with top-k / top-p, instead of
        recomputing the unsettled rows' sequences (no host read: CUDA-graph capturable; their
        entries in ``result`` are then not the op's). For benchmarks and fallback statistics.

    Returns
    -------
    VerifyResult(tokens [N, γ + 1] int64, num_emitted [N] int64, logprobs [N, γ + 1] or None)
    """
    check_device(hidden)
    n, width, hidden_size = hidden.shape
    gamma = width - 1
    rows = n * width
    device = hidden.device
    # The [R, H] rows as one view (row r = n · (γ + 1) + i), for the Hopper kernel's TMA.
    hidden2d = hidden.view(rows, hidden_size) if hidden.is_contiguous() else None
    if config is None and (top_k is not None or top_p is not None):
        config = hand_in_config(rows, hidden_size, vocab_size, lm_head.dtype, device)
    config = resolve_config("verify_resample", hidden2d, lm_head, rows, vocab_size, config)
    truncating = top_k is not None or top_p is not None
    if config.epi_rows and rows > config.epi_rows:
        raise ValueError(
            f"config.epi_rows: {config.epi_rows} scores at most that many rows, got "
            f"N·(γ+1) = {rows}; use 0 (every row of the block)"
        )
    splits = config.num_splits
    if workspace is None:
        workspace = VerifyWorkspace(
            *launch_workspace(
                device,
                "verify_resample",
                ((NUM_FLOAT_FIELDS, rows, splits), torch.float32),
                ((rows, splits), torch.int32),
            )
        )
    if workspace.floats.shape != (NUM_FLOAT_FIELDS, rows, splits) or workspace.index.shape != (
        rows,
        splits,
    ):
        raise ValueError(
            f"workspace: expected make_workspace({rows}, {splits}) (N·(γ+1) rows, num_splits)"
        )
    temperature, seed, positions = (t.contiguous() for t in (temperature, seed, positions))
    # γ = 0 has no drafts to read; any int64 tensor stands in for the (never loaded) pointer.
    # The drafts' unit stride is specialised on (1 also for γ = 0), the row stride γ is not.
    drafts = draft_tokens if gamma > 0 else seed
    stride_dn, stride_di = draft_tokens.stride() if gamma > 0 else (0, 1)
    libdevice = use_libdevice(hidden)
    if allowed_tokens is not None:
        allowed_tokens = allowed_tokens.contiguous()  # read as [R, W] rows

    tokens = torch.empty((n, width), dtype=torch.int64, device=device)
    num_emitted = torch.empty(n, dtype=torch.int64, device=device)
    logprobs = (
        torch.empty((n, width), dtype=torch.float32, device=device) if return_logprobs else None
    )

    # Top-k / top-p: every truncated row hands in its dots at or above a threshold
    # (``_hand_in_thresholds``).
    hand_in = None
    if truncating:
        truncated, counts, keys = launch_workspace(
            device,
            "verify_hand_in",
            ((n,), torch.int32),
            ((rows,), torch.int32),
            ((rows, hopper_tiles.HAND_IN_CAP), torch.int64),
        )
        rows2d = hidden2d if hidden2d is not None else hidden.reshape(rows, hidden_size)
        thresholds = _hand_in_thresholds(
            rows2d, lm_head, vocab_size, top_k, top_p, width, allowed_tokens, truncated, counts
        )
        hand_in = (truncated, thresholds, counts, keys)
    if config.hopper is not None:
        floats = workspace.floats
        summaries = (floats[_BEST_SCORE], workspace.index, *floats[_BEST_LOGIT : _SUM_EXP + 1])
        hopper_tiles.launch(
            hidden2d,
            lm_head,
            vocab_size,
            summaries,
            verify=True,
            # top-p's normaliser is the LSE of every allowed token (top-k's: of its kept set)
            return_logprobs=return_logprobs or top_p is not None,
            temperature=temperature,
            seed=seed,
            positions=positions,
            gamma=gamma,
            allowed_tokens=allowed_tokens,
            hand_in=hand_in,
            config=config.hopper,
        )
    else:
        tiles_per_split = triton.cdiv(triton.cdiv(vocab_size, config.block_v), splits)
        unread = seed  # a placeholder for the pointers a variant never reads
        _verify_tiles_kernel[(triton.cdiv(rows, config.block_n), splits)](
            hidden,
            lm_head,
            temperature,
            seed,
            positions,
            workspace.floats,
            workspace.index,
            truncated if truncating else unread,
            allowed_tokens if allowed_tokens is not None else unread,
            *(hand_in[1:] if hand_in is not None else (unread,) * 3),
            rows,
            gamma,
            vocab_size,
            splits,
            tiles_per_split,
            truncation.words_for(vocab_size),
            *hidden.stride(),
            *lm_head.stride(),
            HIDDEN_SIZE=hidden_size,
            **dot_options(hidden),
            LIBDEVICE=libdevice,
            # top-p's normaliser is the LSE of every allowed token (top-k's: of its kept set)
            RETURN_LOGPROBS=return_logprobs or top_p is not None,
            BLOCK_N=config.block_n,
            BLOCK_V=config.block_v,
            BLOCK_H=config.block_h,
            EPI_ROWS=config.epi_rows or config.block_n,
            MASKED=allowed_tokens is not None,
            HAND_IN=hand_in is not None,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    if truncating:
        unsettled = _truncated_summaries(
            workspace, keys, counts, thresholds, truncated, top_k, top_p, temperature, seed,
            positions, return_logprobs=return_logprobs,
        )  # fmt: skip
    block_r = max(FINALIZE_MIN_ROWS, triton.next_power_of_2(width))
    block_s = triton.next_power_of_2(splits)
    _verify_finalize_kernel[(n,)](
        workspace.floats,
        workspace.index,
        drafts,
        tokens,
        num_emitted,
        logprobs if return_logprobs else tokens,  # placeholder pointer, never written
        rows,
        gamma,
        splits,
        stride_dn,
        stride_di,
        RETURN_LOGPROBS=return_logprobs,
        LIBDEVICE=libdevice,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        num_warps=finalize_warps(block_r, block_s),
    )
    result = VerifyResult(tokens, num_emitted, logprobs)
    if not truncating:
        return (
            (result, torch.zeros(rows, dtype=torch.bool, device=device)) if settle_only else result
        )
    if not settle_only and bool(unsettled.any()):
        seqs = unsettled.view(n, width).any(dim=1).nonzero().squeeze(1)
        _recompute(result, seqs, hidden, lm_head, draft_tokens, temperature, seed, positions,
                   vocab_size, return_logprobs, top_k, top_p, allowed_tokens)  # fmt: skip
    return (result, unsettled) if settle_only else result


# Kept tokens a truncated row may have and be settled by its hand-in (the k <= 1024); a
# larger kept set is recomputed materialised.
MAX_KEPT = 1024
# the largest key of a -inf logit
_NEG_INF_LAST: tl.constexpr = tl.constexpr(((-(2**31) + 2**23 - 1) << 32) | (2**31 - 1))
FLT_MAX: tl.constexpr = tl.constexpr(3.4028234663852886e38)  # the largest finite float32


# The hand-in threshold per truncated row (either tile kernel): from the logits of every
# HAND_IN_STRIDE-th id (1/128 of the LM head read again, ``sampled_logits``), the value about
# HAND_IN_TARGET (top-k: 8 · k, at least HAND_IN_MIN) of the row's logits lie above. The threshold
# only sets how many keys a row hands in: stage 2 settles the row exactly from whatever it gets,
# or sends it to the recompute (fewer than k above it, more than HAND_IN_CAP, a nucleus past them).
# Settled on the stdlib-tiny logits at 64 and 128 rows: top-k 20-100 and top-p 0.8-0.9 every row,
# top-p 0.95 at T 1 all but 1 of 4096 (docs/bench/truncation_settle_bf16_h200.log).
HAND_IN_STRIDE = 128
HAND_IN_TARGET = 2048
HAND_IN_MIN = 1024


def _hand_in_thresholds(
    hidden2d: torch.Tensor,
    lm_head: torch.Tensor,
    vocab_size: int,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    width: int,
    allowed_tokens: torch.Tensor | None,
    truncated: torch.Tensor,
    counts: torch.Tensor,
) -> torch.Tensor:
    """[R] float32: the dot from which each truncated row hands in (NaN for the other rows;
    -FLT_MAX, every finite dot, where the sampled ids hold too few allowed finite logits); on the
    way ``truncated [N]`` int32 (1 where top-k or top-p applies) is written and the hand-in's
    ``counts [R]`` int32 zeroed. Two launches: ``sampled_logits``, then
    ``_hand_in_threshold_kernel``."""
    rows = hidden2d.shape[0]
    partials = sampled_logits(hidden2d, lm_head, vocab_size)
    thresholds = torch.empty(rows, dtype=torch.float32, device=hidden2d.device)
    num_sampled = partials.shape[2]
    placeholder = truncated  # never read without MASKED / TOP_K / TOP_P
    _hand_in_threshold_kernel[(rows,)](
        partials,
        allowed_tokens if allowed_tokens is not None else placeholder,
        top_k.contiguous() if top_k is not None else placeholder,
        top_p.contiguous() if top_p is not None else placeholder,
        truncated,
        thresholds,
        counts,
        rows,
        width,
        vocab_size,
        truncation.words_for(vocab_size),
        num_sampled,
        partials.shape[0],
        TOP_K=top_k is not None,
        TOP_P=top_p is not None,
        MASKED=allowed_tokens is not None,
        BLOCK=max(triton.next_power_of_2(num_sampled), HAND_IN_TARGET // HAND_IN_STRIDE),
        STRIDE=HAND_IN_STRIDE,
        TARGET=HAND_IN_TARGET,
        MIN_TARGET=HAND_IN_MIN,
        DEPTH=HAND_IN_TARGET // HAND_IN_STRIDE,
    )
    return thresholds


# The sampled logits' launch, by rows up to the key: (BLOCK_R, BLOCK_S, BLOCK_K, K_SPLITS,
# num_warps, num_stages). H200, Llama-3-8B head: 3.4-3.6 µs at 1-16 rows, 4.6-6.2 at 32-128,
# 10.0 at 256, 15.5 at 512 (cuBLAS 4.3-8.9, 9.9-13.5, 17.3, 25.0;
# docs/bench/sampled_logits_tune{.py,_h200.log}).
SAMPLED_TUNED = (
    (16, (16, 32, 128, 8, 4, 3)),
    (128, (64, 32, 128, 4, 4, 3)),
    (256, (64, 32, 128, 2, 4, 3)),
    (None, (64, 64, 128, 1, 4, 3)),
)
# The most K_SPLITS a launch takes: the threshold kernel sums that many partials at most.
MAX_K_SPLITS: tl.constexpr = tl.constexpr(8)


def sampled_logits(
    hidden2d: torch.Tensor, lm_head: torch.Tensor, vocab_size: int, tune: tuple | None = None
) -> torch.Tensor:
    """[K_SPLITS, R, ceil(vocab_size / HAND_IN_STRIDE)] float32 whose sum over the first axis is
    ``hidden2d @ lm_head[:vocab_size:HAND_IN_STRIDE].T``, the logits of every HAND_IN_STRIDE-th
    id: one launch of many programs, each a block of rows and ids over one of K_SPLITS runs of
    the hidden size (cuBLAS gives this strided GEMM few CTAs: 4-25 µs at 1-512 rows on an H200,
    against 3.4-15.5). ``tune``: a ``SAMPLED_TUNED`` row's launch instead (benchmarks)."""
    rows, hidden_size = hidden2d.shape
    num_sampled = triton.cdiv(vocab_size, HAND_IN_STRIDE)
    if tune is None:
        tune = next(t for limit, t in SAMPLED_TUNED if limit is None or rows <= limit)
    block_r, block_s, block_k, k_splits, num_warps, num_stages = tune
    block_r = min(block_r, max(16, triton.next_power_of_2(rows)))
    k_splits = min(k_splits, triton.cdiv(hidden_size, block_k))
    if k_splits > MAX_K_SPLITS:
        raise ValueError(f"tune: K_SPLITS {k_splits} past the threshold's {MAX_K_SPLITS.value}")
    out = torch.empty((k_splits, rows, num_sampled), dtype=torch.float32, device=hidden2d.device)
    grid = (triton.cdiv(num_sampled, block_s), triton.cdiv(rows, block_r), k_splits)
    _sampled_logits_kernel[grid](
        hidden2d,
        lm_head,
        out,
        rows,
        num_sampled,
        hidden_size,
        hidden2d.stride(0),
        lm_head.stride(0),
        triton.cdiv(triton.cdiv(hidden_size, block_k), k_splits) * block_k,
        **dot_options(hidden2d),
        STRIDE=HAND_IN_STRIDE,
        BLOCK_R=block_r,
        BLOCK_S=block_s,
        BLOCK_K=block_k,
        num_warps=num_warps,
        num_stages=num_stages,
    )
    return out


@triton.jit(do_not_specialize=["rows", "num_sampled"])  # H and its split: 16-aligned loads
def _sampled_logits_kernel(
    hidden_ptr,  # [R, H] rows of unit stride
    head_ptr,  # [V, H] rows of unit stride
    out_ptr,  # [K_SPLITS, R, num_sampled] float32 out
    rows,
    num_sampled,
    hidden_size,
    stride_hr,
    stride_vr,
    k_run,  # hidden elements per split, a multiple of BLOCK_K
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    STRIDE: tl.constexpr,
    BLOCK_R: tl.constexpr,
    BLOCK_S: tl.constexpr,
    BLOCK_K: tl.constexpr,
):
    """A ``[BLOCK_R, BLOCK_S]`` block of split ``program_id(2)``'s partial sampled logits: rows
    ``BLOCK_R · program_id(1)`` on against the LM-head rows ``STRIDE · s`` for the block's ``s``,
    over the hidden elements ``k_run · program_id(2)`` to the next split's."""
    s = tl.program_id(0) * BLOCK_S + tl.arange(0, BLOCK_S)
    r = tl.program_id(1) * BLOCK_R + tl.arange(0, BLOCK_R)
    k = tl.arange(0, BLOCK_K)
    first = tl.program_id(2) * k_run
    a_ptrs = hidden_ptr + r.to(tl.int64)[:, None] * stride_hr + k[None, :]
    b_ptrs = head_ptr + (s * STRIDE).to(tl.int64)[None, :] * stride_vr + k[:, None]
    acc = tl.zeros([BLOCK_R, BLOCK_S], dtype=tl.float32)
    for k0 in range(first, tl.minimum(first + k_run, hidden_size), BLOCK_K):
        k_ok = k0 + k < hidden_size
        a = tl.load(a_ptrs + k0, mask=(r < rows)[:, None] & k_ok[None, :], other=0.0)
        b = tl.load(b_ptrs + k0, mask=(s < num_sampled)[None, :] & k_ok[:, None], other=0.0)
        if DOT_IN_FP32:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc = tl.dot(a, b, acc, input_precision=DOT_PRECISION)
    out = out_ptr + (tl.program_id(2) * rows + r).to(tl.int64)[:, None] * num_sampled + s[None, :]
    tl.store(out, acc, mask=(r < rows)[:, None] & (s < num_sampled)[None, :])


@triton.jit(do_not_specialize=["rows", "width", "vocab_size", "num_words", "num_sampled", "splits"])
def _hand_in_threshold_kernel(
    sample_ptr,  # [SPLITS, R, num_sampled] partial logits of ids 0, STRIDE, 2 · STRIDE, ...
    allowed_ptr,  # [R, num_words] int32 allowed-token bit masks (MASKED only)
    top_k_ptr,  # [N] int64 (TOP_K only)
    top_p_ptr,  # [N] float32 (TOP_P only)
    truncated_ptr,  # [N] int32 out: 1 where top-k (k > 0) or top-p (p < 1) applies
    out_ptr,  # [R] float32 out
    count_ptr,  # [R] int32 out: zero (the hand-in's counts, before the tile pass)
    rows,
    width,  # γ + 1
    vocab_size,
    num_words,
    num_sampled,
    splits,  # partial sums per logit
    TOP_K: tl.constexpr,
    TOP_P: tl.constexpr,
    MASKED: tl.constexpr,
    BLOCK: tl.constexpr,  # at least num_sampled and DEPTH (a power of 2)
    STRIDE: tl.constexpr,
    TARGET: tl.constexpr,
    MIN_TARGET: tl.constexpr,
    DEPTH: tl.constexpr,  # TARGET // STRIDE: the deepest rank taken
):
    """One row: its sampled logits (the partials summed in split order; forbidden ids and NaN as
    -inf); the threshold is the one of rank ``target · num_sampled / vocab_size`` (target: 8 · k
    for top-k, at least MIN_TARGET; TARGET otherwise; at most DEPTH and num_sampled), so that
    about ``target`` of the row's dots lie above it: the DEPTH largest by ``top_sorted``, a
    bitonic top-k (a full sort of 2048 logits took 34 µs a launch on an H200)."""
    r = tl.program_id(0)
    n = r // width
    i = tl.arange(0, BLOCK)
    ok = i < num_sampled
    if TOP_K:
        k = tl.load(top_k_ptr + n)
    if TOP_P:
        p = tl.load(top_p_ptr + n)
    # the partials summed in split order, their loads unrolled so that all are in flight at once
    # (a runtime loop waited for each in turn); the splits past ``splits`` add nothing
    x = tl.zeros([BLOCK], tl.float32)
    for split in tl.static_range(MAX_K_SPLITS):
        row = (split * rows + r).to(tl.int64) * num_sampled
        live = ok & (tl.full([BLOCK], split, tl.int32) < splits)
        x += tl.load(sample_ptr + row + i, mask=live, other=0.0)
    x = tl.where(ok, x, float("-inf"))
    if MASKED:
        ids = i * STRIDE
        word = tl.load(allowed_ptr + r.to(tl.int64) * num_words + ids // 32, mask=ok, other=0)
        x = tl.where(((word >> (ids % 32)) & 1) != 0, x, float("-inf"))
    x = tl.where(x == x, x, float("-inf"))
    target = tl.full([], TARGET, tl.int64)
    on = tl.full([], 0, tl.int1)
    if TOP_K:
        target = tl.where(k > 0, tl.minimum(tl.maximum(8 * k, MIN_TARGET), TARGET), target)
        on |= k > 0
    if TOP_P:
        on |= p < 1.0
    rank = tl.minimum(tl.maximum(target * num_sampled // vocab_size, 1), num_sampled)
    rank = tl.minimum(rank, DEPTH)
    # the values alone (int32 keys: half the shuffles of (value, id) keys; the rank's value is
    # the same, ties or not)
    top = top_sorted(value_key(x)[None, :], DEPTH)  # [1, DEPTH], largest first
    kth = tl.max(tl.where(tl.arange(0, DEPTH)[None, :] == rank - 1, top, EMPTY_VALUE_KEY), 1)
    theta = tl.maximum(tl.max(decode_value_key(kth), 0), -FLT_MAX)
    tl.store(out_ptr + r, tl.where(on, theta, float("nan")))
    tl.store(count_ptr + r, 0)
    if r == n * width:
        tl.store(truncated_ptr + n, on.to(tl.int32))


@triton.constexpr_function
def _log2(n):
    return n.bit_length() - 1


@triton.jit
def _pair_side(n_dims: tl.constexpr, axis: tl.constexpr):
    """0 / 1: the side of each element's pair along hypercube ``axis`` (counted from the
    innermost), as a ``[2] * n_dims`` hypercube: bit ``axis`` of the element's flat index. (Not a
    ``[2]`` range reshaped to broadcast: Triton 3.6 fails to lay out that shape on sm_90 when the
    hypercube has fewer elements than the program has threads.)"""
    side = (tl.arange(0, 2**n_dims) >> axis) & 1
    return tl.reshape(side, [2] * n_dims)


@triton.jit
def _compare_and_swap(h, flip, axis: tl.constexpr):
    """One step of a bitonic network on the integer hypercube ``h``: each pair along ``axis`` put
    in ascending order, or descending where ``flip`` (broadcast) is 1. An element's partner is
    the pair's sum minus itself (the sum wraps around, exactly): one add-reduction per pair, where
    ``tl.sort`` takes an xor-reduction — the same shuffles on a GPU, but a reduction the Triton
    interpreter runs vectorised (its xor-reduction loops in Python, element by element)."""
    n_dims: tl.constexpr = _log2(h.numel)
    partner = tl.sum(h, n_dims - 1 - axis, keep_dims=True) - h
    right = _pair_side(n_dims, axis)
    return tl.where((h > partner) != (flip ^ right).to(tl.int1), partner, h)


@triton.jit
def _bitonic_merge(h, stage: tl.constexpr, order: tl.constexpr):
    """Merge the hypercube's bitonic runs of ``2**stage``: ascending (``order`` 0), descending
    (1), or alternating run by run (2)."""
    n_dims: tl.constexpr = _log2(h.numel)
    flip = _pair_side(n_dims, stage) if order == 2 else order
    for i in tl.static_range(stage):
        h = _compare_and_swap(h, flip, stage - 1 - i)
    return h


@triton.jit
def top_sorted(x, K: tl.constexpr):
    """The ``K`` largest integer keys (int32 or int64) of each row of ``x [ROWS, B]``, largest
    first (``B``, ``K``
    powers of two, ``2 <= K <= B``): ``tl.topk``'s bitonic top-k — runs of ``K`` sorted
    alternately, then halved by pairwise max and merged again — with the add-reduction
    compare-and-swap above. ``log K · (log K + 1) / 2`` steps over all ``ROWS · B`` keys, then
    ``log K`` per halving."""
    ROWS: tl.constexpr = x.shape[0]
    LOG_B: tl.constexpr = _log2(x.shape[1])
    LOG_K: tl.constexpr = _log2(K)
    h = tl.reshape(x, [2] * _log2(x.numel))
    for i in tl.static_range(1, LOG_K + 1):
        h = _bitonic_merge(h, i, 2 if i < LOG_B else 1)
    for i in tl.static_range(LOG_K + 1, LOG_B + 1):
        h = tl.max(h, _log2(h.numel) - 1 - LOG_K)
        h = _bitonic_merge(h, LOG_K, 2 if i < LOG_B else 1)
    return tl.reshape(h, [ROWS, K])


@triton.jit
def _selection_cut(x, on, need, most):
    """A cut of each row of ``x [ROWS, B]`` among its keys ``on`` (more than ``need`` of them;
    rows with none: unspecified) above which lie their ``need`` largest: ``(cut, exact)``. Not
    exact: ``need`` to ``most`` of them are above the cut. Exact (more than ``most`` keys tied on
    the high word at the boundary): the cut is their ``need``-th largest, fewer lie above it.
    Bisection on the high word (the logit's order; one compare and one add-reduction over the
    row a step) until at most ``most`` keys are above — a few steps when ``most`` is twice
    ``need`` — then, only when exact, on the low word (the id) among the keys tied on it."""
    high = (x >> 32).to(tl.int32)
    lo = tl.min(tl.where(on, high, 2**31 - 1), 1)  # count(high >= lo) = all >= need
    hi = tl.max(tl.where(on, high, -(2**31)), 1)
    count = tl.sum(on.to(tl.int32), 1)  # [ROWS]: the keys with high >= lo
    while tl.max(((lo < hi) & (count > most)).to(tl.int32), 0) > 0:
        go = (lo < hi) & (count > most)
        mid = ((lo.to(tl.int64) + hi.to(tl.int64) + 1) >> 1).to(tl.int32)
        c = tl.sum((on & (high >= mid[:, None])).to(tl.int32), 1)
        up = go & (c >= need)
        lo, count = tl.where(up, mid, lo), tl.where(up, c, count)
        hi = tl.where(go & (c < need), mid - 1, hi)
    exact = count > most
    cut = (lo.to(tl.int64) << 32) - 1
    if tl.max(exact.to(tl.int32), 0) > 0:  # keys tied at the boundary: split on the id
        tie = on & exact[:, None] & (high == lo[:, None])
        need = need - tl.sum((on & (high > lo[:, None])).to(tl.int32), 1)  # of the tied keys
        low = x - (high.to(tl.int64) << 32)  # the low word, unsigned: [0, 2**32)
        lo_w = tl.min(tl.where(tie, low, 2**32), 1)
        hi_w = tl.max(tl.where(tie, low, -1), 1)
        while tl.max((lo_w < hi_w).to(tl.int32), 0) > 0:
            mid = (lo_w + hi_w + 1) >> 1
            ok = tl.sum((tie & (low >= mid[:, None])).to(tl.int32), 1) >= need
            lo_w, hi_w = tl.where(ok, mid, lo_w), tl.where(ok, hi_w, mid - 1)
        cut = tl.where(exact, (lo.to(tl.int64) << 32) | lo_w, cut)
    return cut, exact


@triton.jit
def _top_k_kept(handed, tau, known_all, k, num_kept):
    """Top-k over keys in no order, ``handed [ROWS, B]``: ``(kept, top_k_on, top_k_known)``, the
    known keys (above ``tau``, of finite logits; ``known_all`` of them a row) at or above their
    ``k``-th largest (a cut by bisection, ``_selection_cut`` with need = most = k; all of them
    where k is 0 or at least their count), whether k > 0, and whether the k lie within the
    ``num_kept`` largest known keys (the row's top-k settled)."""
    known = (handed > tau[:, None]) & (handed > _NEG_INF_LAST)
    top_k_on = k > 0
    over = top_k_on & (known_all > k)  # [ROWS]: more known keys than k
    cut, _ = _selection_cut(handed, known & over[:, None], k, k)
    kept = known & tl.where(over[:, None], handed >= cut[:, None], True)
    return kept, top_k_on, top_k_on & (k <= tl.minimum(known_all, num_kept))


# Stage 2's sums over the handed-in keys, whose order is the tile pass's atomics', are exact:
# each term in [0, 1] truncated to a multiple of 2**-40 and added as an int64 (at most 2**52 for
# the hand-in's 4096 keys), so they do not depend on that order and two runs, the Triton backend
# and the CUDA library, keep the same nucleus and give the same LSE bit for bit (float sums in the
# atomics' order moved a top-p boundary token between two runs: 1 row of 129 at p 0.95).
FIXED_ONE: tl.constexpr = tl.constexpr(2.0**40)
NO_LIMIT: tl.constexpr = tl.constexpr(2**63 - 1)  # ``_sample_walk``'s limit that keeps every key


@triton.jit
def _fixed_terms(w, keep):
    """``(terms, any_nan)`` of ``w [ROWS, B]`` over ``keep``: the terms (in [0, 1], or NaN; the
    stage-1 normaliser's up to the ids of a split, their sum up to V < 2**22) truncated to int64
    units of 2**-40 (0 off ``keep`` and at NaN), so that their sums are exact, and per row
    whether one was NaN."""
    nan = keep & (w != w)
    fixed = (tl.where(keep & ~nan, w, 0.0) * FIXED_ONE).to(tl.int64)
    return fixed, tl.max(nan.to(tl.int32), 1) > 0


@triton.jit
def _fixed_total(w, keep):
    """The exact sum of ``_fixed_terms`` per row, rounded once to float32 (NaN where a term
    was)."""
    fixed, nan = _fixed_terms(w, keep)
    return tl.where(nan, float("nan"), tl.sum(fixed, 1).to(tl.float32) * (1.0 / FIXED_ONE))


@triton.jit
def _kept_probs(logit, keep, top, top_k_on, m, s, TOP_K: tl.constexpr, LIBDEVICE: tl.constexpr):
    """``[ROWS, B]``: the probabilities of the kept keys ``keep`` of logits ``logit`` (0
    elsewhere) as the reference's softmax forms them, ``exp(l - max) / Σ exp(l - max)``: over the
    kept set where top-k is on (``top``: its largest logit; ``TOP_K`` False: on no row), else
    over every allowed token (the stage-1 online sums ``m``, ``s`` of the row's splits,
    ``[ROWS, BLOCK_S]``, -inf and 0 past them); either sum exact (``_fixed_total``), so it does
    not depend on the split block."""
    big_m = tl.max(m, 1)
    finite_m = tl.where(big_m == float("-inf"), 0.0, big_m)
    every = tl.full(s.shape, 1, tl.int1)
    total = _fixed_total(s * math_exp(m - finite_m[:, None], LIBDEVICE), every)
    shift = finite_m
    if TOP_K:
        total_kept = _fixed_total(math_exp(logit - top[:, None], LIBDEVICE), keep)
        shift = tl.where(top_k_on, top, shift)
        total = tl.where(top_k_on, total_kept, total)
    total = tl.where(total == 0.0, 1.0, total)  # 0: no kept token (no 0 / 0 to mask)
    weight = math_exp(logit - shift[:, None], LIBDEVICE)
    # IEEE division, as torch's (Triton's `/` on fp32 is not correctly rounded)
    total = tl.broadcast_to(total[:, None], logit.shape)
    return tl.where(keep, tl.math.div_rn(weight, total), 0.0)


# ``_mass_cut``'s step sums each key's weight (units of 2**-40) with a count of one at bit
# MASS_BITS: its weights are probabilities, so their sum stays below 2**MASS_BITS (Σ w < 256), and
# the count of a row's keys (at most 2**15) fits above it in an int64.
_MASS_BITS = 48
MASS_BITS: tl.constexpr = tl.constexpr(_MASS_BITS)
_COUNT_ONE: tl.constexpr = tl.constexpr(1 << _MASS_BITS)  # a key's count of one
_MASS: tl.constexpr = tl.constexpr((1 << _MASS_BITS) - 1)  # the mass's bits


@triton.jit
def _mass_cut(x, on, w, p):
    """The nucleus cut of each row of ``x [ROWS, B]`` among its keys ``on`` of weights ``w``
    (probabilities: each in [0, 1], their sum below 256): ``(cut, reach)``, ``cut`` the largest
    key whose keys at or above it weigh ``p`` or more, so that the keys at or above it are those
    whose weight strictly before them (in descending key order) is below ``p``; ``reach`` False
    where all of them weigh less or a weight is NaN (``cut`` unspecified). The weights and ``p``
    in units of 2**-40, summed exactly (``_fixed_terms``): the cut does not depend on the keys'
    order. Bisection on the high word (the logit's order) of a bracket [lo, hi] with the keys at
    or above lo weighing ``p`` or more and those above hi less; a step is one sum over the row
    that gives the mass and the count of the keys at or above its midpoint, and a row stops once
    its bracket holds one key, which is then the cut (on std-4 logits 10-16 steps where the
    whole bisection takes 23-24, docs/bench/mass_cut_steps{.py,_cpu.log}). Keys tied on the
    cut's high word are then split on the low word (the id). A key whose mass before it lies
    within float rounding of ``p`` may fall on the other side than in the reference's float32
    cumulative sum."""
    high = (x >> 32).to(tl.int32)
    fixed, nan = _fixed_terms(w, on)
    p_fixed = (p * FIXED_ONE).to(tl.int64)
    counted = tl.where(on, fixed + _COUNT_ONE, 0)  # [ROWS, B]: weight and a count of one
    total = tl.sum(counted, 1)
    reach = ((total & _MASS) >= p_fixed) & ~nan  # p > 0: a row of no keys does not reach it
    lo = tl.min(tl.where(on, high, 2**31 - 1), 1)  # the keys at or above weigh all: >= p
    hi = tl.max(tl.where(on, high, -(2**31)), 1)
    n_lo = total >> MASS_BITS  # keys at or above lo
    n_hi = tl.zeros_like(n_lo)  # keys above hi
    while tl.max((reach & (lo < hi) & (n_lo - n_hi > 1)).to(tl.int32), 0) > 0:
        go = reach & (lo < hi) & (n_lo - n_hi > 1)
        mid = ((lo.to(tl.int64) + hi.to(tl.int64) + 1) >> 1).to(tl.int32)
        c = tl.sum(tl.where(high >= mid[:, None], counted, 0), 1)
        up = go & ((c & _MASS) >= p_fixed)
        down = go & ~up
        lo, n_lo = tl.where(up, mid, lo), tl.where(up, c >> MASS_BITS, n_lo)
        hi, n_hi = tl.where(down, mid - 1, hi), tl.where(down, c >> MASS_BITS, n_hi)
    # the bracket's lowest key: the cut where the bracket holds one key
    in_bracket = on & (high >= lo[:, None]) & (high <= hi[:, None])
    cut = tl.min(tl.where(in_bracket, x, 2**63 - 1), 1)
    tied = reach & (n_lo - n_hi > 1)  # keys tied on the cut's high word: split on the id
    if tl.max(tied.to(tl.int32), 0) > 0:
        above = tl.sum(tl.where(on & (high > lo[:, None]), fixed, 0), 1)
        tie = on & tied[:, None] & (high == lo[:, None])
        low = x - (high.to(tl.int64) << 32)  # the low word, unsigned: [0, 2**32)
        lo_w = tl.min(tl.where(tie, low, 2**32), 1)
        hi_w = tl.max(tl.where(tie, low, -1), 1)
        while tl.max((lo_w < hi_w).to(tl.int32), 0) > 0:
            mid = (lo_w + hi_w + 1) >> 1
            ok = above + tl.sum(tl.where(tie & (low >= mid[:, None]), fixed, 0), 1) >= p_fixed
            lo_w, hi_w = tl.where(ok, mid, lo_w), tl.where(ok, hi_w, mid - 1)
        cut = tl.where(tied, (lo.to(tl.int64) << 32) | lo_w, cut)
    return cut, reach


@triton.jit
def _noisy_keys(logit, ids, seed, position, t_row, LIBDEVICE: tl.constexpr):
    """``[ROWS, B]`` order keys of the rows' noisy scores at ``logit``, ``ids``: the logit plus
    the tile pass's Gumbel noise of (seed, position, id), the logit alone on greedy rows (T below
    GREEDY_BELOW). A larger key is a better score, ties to the lowest id."""
    key_a, key_b = row_keys(seed, position, STREAM_GUMBEL)  # [ROWS] uint32 each
    bits = token_bits(key_a[:, None], key_b[:, None], ids)  # named: the interpreter needs it
    g = gumbel_from_bits(bits, LIBDEVICE)
    greedy = t_row < GREEDY_BELOW
    score = tl.where(greedy[:, None], logit, logit + g)
    return order_key(score, ids)


@triton.jit
def _sample_walk(ranked, handed, members, first, searching, weight, limit):
    """The sample of each ``searching`` row without its truncation's cut: the key in ``handed``
    of the best-``ranked`` (``_noisy_keys``) of the row's ``members`` [ROWS, B] that the
    truncation keeps — a member is kept where the ``weight`` [ROWS, B] int64 of the members
    above it sums below the row's ``limit``, and ``first``, the row's largest member, always.
    Top-k: a weight of one, the limit k (none where k is off or past the members); top-p: the
    exact probabilities (``_fixed_terms``), the limit p. A member that fails fails with every
    member below it, so the members are walked in descending score: a step takes the
    best-ranked left, and where it is not kept drops it and every member below it (never
    ``first``, so a row stops). Three reductions a step; on std-4 logits at T 1 the first
    candidate is most often kept (a cut by bisection, ``_selection_cut`` / ``_mass_cut``, takes
    10-30 steps of two). Rows not searching: ``EMPTY_KEY``."""
    alive = members
    pick = tl.where(searching, EMPTY_KEY, EMPTY_KEY)  # [ROWS] int64
    while tl.max(searching.to(tl.int32), 0) > 0:
        best = tl.max(tl.where(alive, ranked, EMPTY_KEY), 1)
        candidate = tl.max(tl.where(alive & (ranked == best[:, None]), handed, EMPTY_KEY), 1)
        above = tl.sum(tl.where(members & (handed > candidate[:, None]), weight, 0), 1)
        kept = searching & ((candidate == first) | (above < limit))
        pick = tl.where(kept, candidate, pick)
        searching = searching & ~kept
        alive = alive & (handed > candidate[:, None])
    return pick


@triton.jit(do_not_specialize=["num_rows", "width", "num_splits", "num_kept"])
def _truncated_summaries_kernel(
    ws_float_ptr,  # [4, R, S] float32: read (max, sum_exp; TOP_P only), rewritten for settled rows
    ws_index_ptr,  # [R, S] int32: rewritten for settled rows
    keys_ptr,  # [R, BLOCK_HANDED] int64: each row's handed-in keys, in no order
    truncated_ptr,  # [N] int32: 1 where top-k / top-p apply
    top_k_ptr,  # [N] int64 (only with TOP_K)
    top_p_ptr,  # [N] float32 (only with TOP_P)
    temperature_ptr,  # [N] float32
    seed_ptr,  # [N] int64
    positions_ptr,  # [N] int64
    unsettled_ptr,  # [R] int8 out: 1 where a truncated row is not settled
    sel_ptr,  # [R, 2 · BLOCK_KEPT] int64 scratch: top-k alone, its nucleus compacted
    num_rows,  # R = N · (γ + 1)
    width,  # γ + 1
    num_splits,  # S
    num_kept,  # L = min(MAX_KEPT, BLOCK_HANDED): the keys a top-k kept set is settled in
    count_ptr,  # [R] int32: keys each row handed in
    threshold_ptr,  # [R] float32: the dot each row handed in from
    TOP_K: tl.constexpr,
    TOP_P: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    ROWS: tl.constexpr,  # rows per program: 1 on a GPU (more under the interpreter)
    BLOCK_HANDED: tl.constexpr,  # the hand-in's keys a row (HAND_IN_CAP), a power of 2
    BLOCK_KEPT: tl.constexpr,  # next_power_of_2(L), at least 2
    BLOCK_S: tl.constexpr,  # at least S: SETTLE_SPLITS, or next_power_of_2(S) past it
    RETURN_LOGPROBS: tl.constexpr = True,  # False: the sample only (no LSE, no logit, no sums)
):
    """Stage 2 of ``ROWS`` truncated rows (``_truncated_summaries``): per row, tau from its
    threshold, the kept set among the handed-in keys (top-k's by bisection, no sort), the softmax
    and nucleus over them (top-p's cut by mass, by bisection), the Gumbel-max of the nucleus (with
    ``RETURN_LOGPROBS``, the sample's logit and the nucleus's LSE too), and the rewrite of the
    row's summaries as one split. Memory traffic per truncated row: its handed-in keys (8 bytes
    each, up to its count), its max / sum_exp (8 · S; top-p only), the rewritten fields (8 · S:
    score and index; 20 · S with log-probabilities) and one flag, plus top-k's nucleus through
    the scratch (up to 16 · BLOCK_KEPT bytes written and read, L2); an untruncated row reads its
    flag and count and writes one flag."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    row_ok = r < num_rows
    n = r // width
    on = row_ok & (tl.load(truncated_ptr + n, mask=row_ok, other=0) != 0)  # [ROWS]
    count = tl.load(count_ptr + r, mask=row_ok, other=0)  # beside the flag: one round trip
    if tl.max(on.to(tl.int32), 0) == 0:  # no truncated row: its flag (and count) read
        tl.store(unsettled_ptr + r, tl.zeros([ROWS], tl.int8), mask=row_ok)
    else:
        # With top-k the keys are read in the narrowest of BLOCK_HANDED / 4, / 2 and BLOCK_HANDED
        # that holds every row's count (the rest of a row is empty): its hand-in aims at 8 · k
        # keys, at least 1024 (``_hand_in_threshold_kernel``), and the bisection's reductions run
        # over the keys read. H100, whole calls: top-k 50 1-8 µs faster at 1-128 rows (of
        # 380-425), with top-p 0.9 5-43 µs at 1-512; top-p alone (2048 keys aimed at) 3-14 µs
        # slower at 1-128 rows, so it reads them all (docs/bench/stage2_widths{.py,_h100.log}).
        count = tl.where(on, count, 0)
        most = tl.max(count, 0)
        if BLOCK_HANDED < 64 or not TOP_K:  # one width
            _settle_rows(
                r, n, on, count, ws_float_ptr, ws_index_ptr, keys_ptr, top_k_ptr, top_p_ptr,
                temperature_ptr, seed_ptr, positions_ptr, unsettled_ptr, sel_ptr, threshold_ptr,
                num_rows, width, num_splits, num_kept, TOP_K, TOP_P, LIBDEVICE, BLOCK_HANDED,
                BLOCK_HANDED, BLOCK_KEPT, BLOCK_S, RETURN_LOGPROBS,
            )  # fmt: skip
        elif most <= BLOCK_HANDED // 4:
            _settle_rows(
                r, n, on, count, ws_float_ptr, ws_index_ptr, keys_ptr, top_k_ptr, top_p_ptr,
                temperature_ptr, seed_ptr, positions_ptr, unsettled_ptr, sel_ptr, threshold_ptr,
                num_rows, width, num_splits, num_kept, TOP_K, TOP_P, LIBDEVICE, BLOCK_HANDED,
                BLOCK_HANDED // 4, BLOCK_KEPT, BLOCK_S, RETURN_LOGPROBS,
            )  # fmt: skip
        elif most <= BLOCK_HANDED // 2:
            _settle_rows(
                r, n, on, count, ws_float_ptr, ws_index_ptr, keys_ptr, top_k_ptr, top_p_ptr,
                temperature_ptr, seed_ptr, positions_ptr, unsettled_ptr, sel_ptr, threshold_ptr,
                num_rows, width, num_splits, num_kept, TOP_K, TOP_P, LIBDEVICE, BLOCK_HANDED,
                BLOCK_HANDED // 2, BLOCK_KEPT, BLOCK_S, RETURN_LOGPROBS,
            )  # fmt: skip
        else:
            _settle_rows(
                r, n, on, count, ws_float_ptr, ws_index_ptr, keys_ptr, top_k_ptr, top_p_ptr,
                temperature_ptr, seed_ptr, positions_ptr, unsettled_ptr, sel_ptr, threshold_ptr,
                num_rows, width, num_splits, num_kept, TOP_K, TOP_P, LIBDEVICE, BLOCK_HANDED,
                BLOCK_HANDED, BLOCK_KEPT, BLOCK_S, RETURN_LOGPROBS,
            )  # fmt: skip


@triton.jit
def _settle_rows(
    r,
    n,
    on,
    count,
    ws_float_ptr,
    ws_index_ptr,
    keys_ptr,
    top_k_ptr,
    top_p_ptr,
    temperature_ptr,
    seed_ptr,
    positions_ptr,
    unsettled_ptr,
    sel_ptr,
    threshold_ptr,
    num_rows,
    width,
    num_splits,
    num_kept,
    TOP_K: tl.constexpr,
    TOP_P: tl.constexpr,
    LIBDEVICE: tl.constexpr,
    CAP: tl.constexpr,  # the hand-in buffer's keys a row (its row stride)
    BLOCK_HANDED: tl.constexpr,  # the keys read a row: at least every row's count (<= CAP)
    BLOCK_KEPT: tl.constexpr,
    BLOCK_S: tl.constexpr,
    RETURN_LOGPROBS: tl.constexpr,
):
    """``_truncated_summaries_kernel``'s work on its truncated rows ``on`` (rows ``r``, their
    sequences ``n``, their hand-in ``count``), reading the first BLOCK_HANDED keys of each."""
    row_ok = r < num_rows
    split = tl.arange(0, BLOCK_S)
    split_ok = on[:, None] & (split < num_splits)[None, :]  # [ROWS, BLOCK_S]
    # ---- the threshold hand-in (``_hand_in_tile``, ``hopper_tiles._hand_in_chunk``): in no
    # order, the keys of the row's raw dots at or above its threshold theta, here rekeyed by
    # their logits dot / T. Every dot left out is below theta, so its logit is at most
    # fl(theta / T): tau is that logit's largest key; FULL_KEY (nothing known) when the row's
    # count passed the buffer or theta is NaN; EMPTY_KEY when nothing finite was left out
    # (theta -FLT_MAX keeps every finite dot). Above tau the handed-in keys are every key of
    # the row.
    theta = tl.load(threshold_ptr + r, mask=on, other=0.0)
    t_row = tl.load(temperature_ptr + n, mask=on, other=1.0)
    # every other load of the row now, in flight together (not each after the loop before it)
    seed = tl.load(seed_ptr + n, mask=on, other=0)
    position = tl.load(positions_ptr + n, mask=on, other=0) + (r - n * width)
    plane = num_rows * num_splits
    row_ws = r[:, None] * num_splits + split[None, :]  # [ROWS, BLOCK_S]
    if TOP_K:
        k = tl.load(top_k_ptr + n, mask=on, other=0)
    if TOP_P:
        p = tl.load(top_p_ptr + n, mask=on, other=1.0)
        m = tl.load(ws_float_ptr + F_MAX * plane + row_ws, mask=split_ok, other=float("-inf"))
        s = tl.load(ws_float_ptr + F_SUM_EXP * plane + row_ws, mask=split_ok, other=0.0)
    scale = tl.where(t_row < GREEDY_BELOW, 1.0, t_row)
    t = tl.arange(0, BLOCK_HANDED)
    raw = tl.load(
        keys_ptr + r.to(tl.int64)[:, None] * CAP + t[None, :],
        mask=on[:, None] & (t[None, :] < count[:, None]),
        other=EMPTY_KEY,
    )  # [ROWS, BLOCK_HANDED]
    raw_dot, raw_id = decode_key(raw)
    rekeyed = order_key(tl.math.div_rn(raw_dot, scale[:, None]), raw_id)
    handed = tl.where(raw == EMPTY_KEY, EMPTY_KEY, rekeyed)
    top_left = tl.math.div_rn(theta, scale)
    tau = tl.where(top_left == float("-inf"), EMPTY_KEY, order_key(top_left, 0))
    tau = tl.where(theta == -FLT_MAX, EMPTY_KEY, tau)
    tau = tl.where((count > CAP) | (theta != theta), FULL_KEY, tau)
    # ---- the known keys: above tau and of finite logits
    known = (handed > tau[:, None]) & (handed > _NEG_INF_LAST)
    known_all = tl.sum(known.to(tl.int32), 1)
    # every finite logit of the row was handed in, and no more than L of them
    complete = (tau == EMPTY_KEY) & (known_all <= num_kept)
    if TOP_P:
        # ---- top-p: no order needed. The kept set is top-k's cut (bisection, as for top-k
        # alone), the softmax is over it (top-k on) or over every allowed token (the stage-1
        # online sums), and the nucleus is the keys at or above the largest key whose keys at
        # or above weigh p (``_mass_cut``). Settled where k lies within the known keys, the
        # nucleus ends inside them (top-p alone), or every finite logit is known.
        logit, ids = decode_key(handed)
        if TOP_K:
            keep, top_k_on, top_k_known = _top_k_kept(handed, tau, known_all, k, num_kept)
            top = tl.max(tl.where(keep, logit, float("-inf")), 1)  # the largest kept logit
            top = tl.where(top == float("-inf"), 0.0, top)
        else:  # top-p alone: every known key is kept (no selection's reductions)
            keep = known
            top_k_on = tl.zeros_like(on)
            top_k_known = top_k_on
            top = tl.zeros_like(theta)
        probs = _kept_probs(logit, keep, top, top_k_on, m, s, TOP_K, LIBDEVICE)
        if RETURN_LOGPROBS:  # the nucleus itself: its LSE is summed below
            nucleus_cut, reach = _mass_cut(handed, keep, probs, tl.where(p < 1.0, p, 2.0))
            nucleus = keep & tl.where(reach[:, None], handed >= nucleus_cut[:, None], True)
            ends_inside = tl.max((keep & ~nucleus).to(tl.int32), 1) > 0
            any_nucleus = tl.max(nucleus.to(tl.int32), 1) > 0
            settled = (complete | top_k_known | (~top_k_on & ends_inside)) & any_nucleus
        else:
            # ---- the sample only: no cut. A kept key is in the nucleus where the mass of the
            # kept keys above it is below p (``_mass_cut``'s nucleus; the largest always is),
            # so the nucleus ends inside the kept keys where their lowest is not in it, and
            # the sample is the walk's (``_sample_walk``)
            fixed, nan = _fixed_terms(probs, keep)
            p_fixed = (tl.where(p < 1.0, p, 2.0) * FIXED_ONE).to(tl.int64)
            reach = (tl.sum(fixed, 1) >= p_fixed) & ~nan
            first = tl.max(tl.where(keep, handed, EMPTY_KEY), 1)  # the largest kept key
            last = tl.min(tl.where(keep, handed, FULL_KEY), 1)
            above_last = tl.sum(tl.where(keep & (handed > last[:, None]), fixed, 0), 1)
            ends_inside = reach & (last < first) & (above_last >= p_fixed)
            settled = (complete | top_k_known | (~top_k_on & ends_inside)) & (first > EMPTY_KEY)
            ranked = _noisy_keys(logit, ids, seed, position, t_row, LIBDEVICE)
            limit = tl.where(reach, p_fixed, NO_LIMIT)
            _, y = decode_key(_sample_walk(ranked, handed, keep, first, settled, fixed, limit))
    elif RETURN_LOGPROBS:
        # ---- top-k alone needs no order: the kept set is the known keys at or above the
        # k-th largest (a cut by bisection, ``_selection_cut`` with need = most = k), the
        # softmax is over it, and the Gumbel-max is order-free. Settled where k lies within
        # the L largest known keys, or every finite logit is known.
        logit, ids = decode_key(handed)
        nucleus, _, top_k_known = _top_k_kept(handed, tau, known_all, k, num_kept)
        any_nucleus = tl.max(nucleus.to(tl.int32), 1) > 0
        settled = (complete | top_k_known) & any_nucleus
        if BLOCK_HANDED > 2 * BLOCK_KEPT:
            # A settled row's nucleus holds at most L keys (its k <= L, or every finite key,
            # at most L): compacted through the row's scratch, so that the noise and the
            # sums below run over BLOCK_KEPT keys, not BLOCK_HANDED (an unsettled row's
            # keys past BLOCK_KEPT are dropped: its summaries are not written)
            size = tl.sum(nucleus.to(tl.int32), 1)
            spot = tl.cumsum(nucleus.to(tl.int32), 1) - 1
            row_sel = sel_ptr + r.to(tl.int64)[:, None] * (2 * BLOCK_KEPT)
            tl.store(row_sel + spot, handed, mask=nucleus & (spot < BLOCK_KEPT))
            tl.debug_barrier()  # the stores seen by every thread of the program
            j = tl.arange(0, BLOCK_KEPT)[None, :]
            nucleus = on[:, None] & (j < size[:, None])
            logit, ids = decode_key(tl.load(row_sel + j, mask=nucleus, other=EMPTY_KEY))
    else:
        # ---- top-k alone, the sample only: no kept set to sum over, so no cut. A known key
        # is kept where fewer than k known keys lie above it (or k is 0 or at least their
        # count); the sample is the walk's (``_sample_walk``). Settled as above.
        logit, ids = decode_key(handed)
        top_k_on = k > 0
        top_k_known = top_k_on & (k <= tl.minimum(known_all, num_kept))
        settled = (complete | top_k_known) & (known_all > 0)
        first = tl.max(tl.where(known, handed, EMPTY_KEY), 1)  # the largest known key
        ranked = _noisy_keys(logit, ids, seed, position, t_row, LIBDEVICE)
        one = tl.where(known, 1, 0).to(tl.int64)
        limit = tl.where(top_k_on & (known_all > k), k, NO_LIMIT)
        _, y = decode_key(_sample_walk(ranked, handed, known, first, settled, one, limit))
    tl.store(unsettled_ptr + r, (on & ~settled).to(tl.int8), mask=row_ok)

    if RETURN_LOGPROBS:
        # ---- the Gumbel-max over the nucleus with the tile pass's noise, ties to the lowest
        # id (one reduction of the order keys of (score, id): a tuple tl.reduce runs element
        # by element under the interpreter)
        ranked = _noisy_keys(logit, ids, seed, position, t_row, LIBDEVICE)
        _, y = decode_key(tl.max(tl.where(nucleus, ranked, EMPTY_KEY), 1))

    # ---- the settled rows' summaries as one split: split 0 holds the sample (score 0, its
    # index; with RETURN_LOGPROBS its logit, M = LSE, sum 1), the others are empty
    write = split_ok & settled[:, None]
    first = (split == 0)[None, :]
    ws_float = ws_float_ptr + row_ws
    tl.store(ws_float + F_BEST_SCORE * plane, tl.where(first, 0.0, float("-inf")), mask=write)
    tl.store(ws_index_ptr + row_ws, tl.where(first, y.to(tl.int32)[:, None], 0), mask=write)
    if RETURN_LOGPROBS:
        y_logit = tl.max(tl.where(nucleus & (ids == y[:, None]), logit, float("-inf")), 1)
        # the LSE's sum exact (``_fixed_total``): its terms are in [0, 1] but where the
        # largest kept logit is +inf (then the LSE is)
        kept_logit = tl.where(nucleus, logit, float("-inf"))
        top_kept = tl.max(kept_logit, 1)
        lse_max = tl.where(tl.abs(top_kept) == float("inf"), 0.0, top_kept)
        terms = math_exp(kept_logit - lse_max[:, None], LIBDEVICE)
        kept_sum = _fixed_total(terms, nucleus & (terms <= 1.0))
        kept_sum = tl.where(top_kept == float("inf"), float("inf"), kept_sum)
        kept_sum = tl.where(settled, kept_sum, 1.0)  # rows not written: no log(0)
        lse = math_log(kept_sum, LIBDEVICE) + lse_max
        tl.store(
            ws_float + F_BEST_LOGIT * plane, tl.where(first, y_logit[:, None], 0.0), mask=write
        )
        tl.store(ws_float + F_MAX * plane, tl.where(first, lse[:, None], float("-inf")), mask=write)
        tl.store(ws_float + F_SUM_EXP * plane, tl.where(first, 1.0, 0.0), mask=write)


# Stage 2 reads the stage-1 summaries of every split of a row in one block of SETTLE_SPLITS (the
# Hopper kernel's 2048 splits of Gemma-3's 262144 ids, or next_power_of_2(S) past it): past the
# row's splits the lanes are masked, a few instructions a thread against thousands, and one
# kernel serves every split count (the CUDA library compiles one per variant, not per power of 2).
SETTLE_SPLITS = 2048


def settle_shape(splits: int, cap: int = hopper_tiles.HAND_IN_CAP) -> tuple[int, dict, int]:
    """The stage-2 launch for a hand-in of up to ``cap`` keys a row (a power of 2) over
    ``splits`` splits: (L, the keys a top-k kept set is settled in; the block
    constexprs of ``_truncated_summaries_kernel``; its warps). The constexprs are the same for
    every split count up to SETTLE_SPLITS."""
    kept = min(MAX_KEPT, cap)
    constexprs = {
        "BLOCK_HANDED": triton.next_power_of_2(cap),
        "BLOCK_KEPT": max(2, triton.next_power_of_2(kept)),
        "BLOCK_S": max(SETTLE_SPLITS, triton.next_power_of_2(splits)),
    }
    # The hand-in's 4096 keys: 16 warps. Whole calls, 8 -> 16 warps: H100 top-p 0.9 1-64 rows
    # -3 to -11 µs (of 360-434), 128 rows -4, 512 rows -10 (stage2_warps_h100.log); H200 top-k
    # 1024 -8 µs at 1-16 rows (of 282-289), top-k 50 +2 µs at 1-16 rows, -2 at 128, -11 at 512;
    # 4 warps slower throughout (docs/bench/stage2_warps{.py,_h100.log,_h200.log})
    warps = min(16, max(4, constexprs["BLOCK_HANDED"] // 256))
    return kept, constexprs, warps


def _truncated_summaries(
    workspace: VerifyWorkspace,
    keys: torch.Tensor,
    counts: torch.Tensor,
    thresholds: torch.Tensor,
    truncated: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    return_logprobs: bool = True,
) -> torch.Tensor:
    """Stage 2 of the truncated rows: their kept set from the hand-in, their sample, and their
    summaries rewritten as one split (the finalize then accepts and emits as for any row). One
    launch, one program per row (a row whose sequence is not truncated reads one flag).

    Per row, the tile pass handed in the order key of every raw dot at or above the row's
    threshold theta, in no order. Every dot left out is below theta, so above the largest key of
    the logit fl(theta / T) the handed-in keys are all of the row's keys — all of the row when
    theta kept every finite dot. The kept set is settled there when top-k's k tokens lie in it, or
    (top-p alone) when the nucleus ends inside it, the normaliser then being every allowed
    token's, from the stage-1 online softmax. Probabilities are formed as the reference's softmax
    does, ``exp(l - max) / Σ exp(l - max)``. The sample is the Gumbel-max over the kept keys with
    the same noise (``reference.noise``), ties to the lowest id; the log-probability's LSE is the
    kept set's. Rows it does not settle are returned for ``_recompute``.

    The keys' order is the tile pass's atomics', so every sum over them is exact (``_fixed_terms``)
    and the result does not depend on it: two runs, or the two backends, give the same bits. The
    mass at or above a key is so summed (by bisection), not as the reference's float32 cumulative
    sum, so a token whose mass-before lies within float rounding of p may be kept by one and not
    the other.
    ``tests/parity/test_truncation_kernels.py`` holds the same steps in torch
    (``truncated_summaries_torch``) and compares the two.

    Parameters
    ----------
    workspace : the stage-1 summaries of ``R = N · (γ + 1)`` rows and S splits, rewritten in place
    keys : [R, cap] int64 — each row's handed-in keys (the first ``counts`` of them)
    counts : [R] int32 — keys handed in per row (past ``cap``: stored no more, not settled)
    thresholds : [R] float32 — the dot each row handed in from (NaN: none)
    truncated : [N] int32 — 1 where top-k or top-p applies
    top_k : [N] int64 or None, top_p : [N] float32 or None
    temperature, seed, positions : [N] (as ``verify_resample``)
    return_logprobs : also rewrite the fields the log-probabilities read (the sample's logit, the
        kept set's LSE); False: the sample alone, as the finalize then reads no more

    Returns
    -------
    unsettled : [R] bool — truncated rows whose kept set the hand-in does not settle (their
        summaries are left as they were)
    """
    n = temperature.shape[0]
    (rows, cap), splits = keys.shape, workspace.index.shape[1]
    kept, shape, num_warps = settle_shape(splits, cap)
    block_kept = shape["BLOCK_KEPT"]
    unsettled = torch.empty(rows, dtype=torch.int8, device=keys.device)
    # placeholder pointer, never read: only top-k alone with log-probabilities compacts its
    # nucleus through the scratch, and only when BLOCK_HANDED > 2 · BLOCK_KEPT
    selected = unsettled
    if top_p is None and return_logprobs and shape["BLOCK_HANDED"] > 2 * block_kept:
        (selected,) = launch_workspace(
            keys.device, "truncation_selected", ((rows, 2 * block_kept), torch.int64)
        )
    placeholder = truncated  # never read without TOP_K / TOP_P
    top_k, top_p = (None if t is None else t.contiguous() for t in (top_k, top_p))
    # One row per program on a GPU (two a program: 4-35 µs slower at 1-160 rows on an H200,
    # docs/bench/stage2_ab_h200.log); under the interpreter a block of rows (its cost is per op)
    rows_per_program = 1 if use_libdevice(keys) else min(64, triton.next_power_of_2(rows))
    _truncated_summaries_kernel[(triton.cdiv(rows, rows_per_program),)](
        workspace.floats,
        workspace.index,
        keys,
        truncated,
        top_k if top_k is not None else placeholder,
        top_p if top_p is not None else placeholder,
        temperature,
        seed,
        positions,
        unsettled,
        selected,
        rows,
        rows // n,
        splits,
        kept,
        counts,
        thresholds,
        TOP_K=top_k is not None,
        TOP_P=top_p is not None,
        LIBDEVICE=use_libdevice(keys),
        ROWS=rows_per_program,
        RETURN_LOGPROBS=return_logprobs,
        **shape,
        num_warps=num_warps,
        enable_fp_fusion=False,  # Σ s · exp(m - M) rounded as torch's product, then sum
    )
    return unsettled.view(torch.bool)


def _recompute(result, seqs, hidden, lm_head, drafts, temperature, seed, positions, vocab_size,
               return_logprobs, top_k, top_p, allowed_tokens) -> None:  # fmt: skip
    """The sequences ``seqs`` verified again by the materialised path (its exponential race in
    one launch, ``noise.exponential_race``), written into ``result``."""
    from flashspec_export.ops import standard

    def pick(t):
        return None if t is None else t[seqs]

    again = standard.verify_resample(
        hidden[seqs], lm_head, drafts[seqs], temperature[seqs], seed[seqs], positions[seqs],
        vocab_size, return_logprobs=return_logprobs, top_k=pick(top_k), top_p=pick(top_p),
        allowed_tokens=pick(allowed_tokens), race=exponential_race,
    )  # fmt: skip
    result.tokens[seqs] = again.tokens
    result.num_emitted[seqs] = again.num_emitted
    if return_logprobs:
        result.logprobs[seqs] = again.logprobs
