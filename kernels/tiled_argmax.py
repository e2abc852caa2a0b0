"""Triton ``TiledArgmax``: greedy drafting in one stream over the LM head.

Stage 1 (``_argmax_tiles_kernel``), grid ``(row blocks, vocabulary splits)``: each program owns
``BLOCK_N`` rows of ``hidden`` and a contiguous run of ``BLOCK_V``-row tiles of ``lm_head``. Per
tile it forms the logits ``hidden_block · lm_head_tileᵀ`` in fp32 (``tl.dot`` over ``BLOCK_H``
chunks of the hidden dimension) and folds them into a running (max, index) per row. Memory
traffic: every LM-head byte is read once per row block (once in all when ``N <= BLOCK_N``); the
hidden block is re-read per tile, from L2. Per (row, split) it writes one (max, index) pair.

Stage 2 (``_argmax_finalize_kernel``): one program per ``BLOCK_N`` rows reduces the ``[N, splits]``
workspace; no host synchronisation anywhere.

Ties go to the lowest index at every level: within a tile (``tl.max(..., return_indices=True)``
keeps the first), across the tiles of a split (strict ``>``), and across splits (lowest split).

The launch configuration comes from ``choose_config``, a heuristic table shared with
``verify_resample`` (the two kernels have the same vocabulary-tiled matmul skeleton).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

# Splits per SM: enough programs to fill the GPU about twice, so the whole LM head is in flight
# in one or two waves and each program streams a long contiguous run of it.
WAVES_PER_SM = 2
# Under the interpreter (CPU) each program and each tile costs Python work; few large tiles are
# fastest, and two splits keep the split reduction exercised.
_INTERPRETER_SMS = 1


class KernelConfig(NamedTuple):
    """Launch configuration of the vocabulary-tiled kernels.

    block_n : rows of ``hidden`` per program (>= 16: ``tl.dot`` minimum), power of two
    block_v : LM-head rows (vocabulary ids) per tile, power of two
    block_h : hidden-dimension chunk of one ``tl.dot``, power of two (>= 16)
    num_splits : vocabulary splits (the second grid axis); each owns a contiguous run of tiles
    num_warps, num_stages : Triton launch options
    """

    block_n: int
    block_v: int
    block_h: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 3


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


# Tuned on an H100 (Llama-3-8B head, bf16; scripts/tune_kernels.py, docs/BENCHMARKS.md): per op,
# rows up to the key -> (BLOCK_N, BLOCK_V, num_warps, waves, num_stages), waves = programs per SM
# along the vocabulary (0: one tile per program). VerifyResample carries the Gumbel hash per
# logit, so it wants fewer logits per thread than the plain argmax. From 64 rows both want
# GEMM-shaped 128-row blocks, 4 stages and, for the wide tiles, 16 warps (32 accumulators per
# thread leave registers for the hash): docs/bench/tune_large_h100.log, verify -9% at 128 rows
# and -20% at 512 against the 8-warp 128 x 64 tile; argmax -16% at 512.
TUNED = {
    "verify_resample": (
        (16, (16, 128, 8, 2, 3)),
        (32, (32, 128, 8, 0, 3)),
        (64, (64, 64, 4, 2, 4)),
        (None, (128, 128, 16, 0, 4)),
    ),
    "tiled_argmax": (
        (16, (16, 128, 8, 2, 3)),
        (32, (32, 128, 8, 2, 3)),
        (128, (128, 128, 8, 2, 4)),
        (None, (128, 256, 16, 2, 4)),
    ),
}


def choose_config(
    op: str,
    rows: int,
    hidden_size: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device,
) -> KernelConfig:
    """Launch configuration from the tuned table (never autotuned inline).

    Parameters
    ----------
    op : "verify_resample" or "tiled_argmax"
    rows : flattened rows of ``hidden`` (``N`` for TiledArgmax, ``N · (γ + 1)`` for VerifyResample)
    hidden_size : H
    vocab_size : logical vocabulary (tiles past it are never visited)
    dtype : dtype of ``hidden`` / ``lm_head``
    device : where the kernels run (its SM count sets the number of splits)

    Returns
    -------
    KernelConfig
    """
    sixteen_bit = dtype in (torch.bfloat16, torch.float16)
    if device.type != "cuda" or triton.knobs.runtime.interpret:
        block_n = min(64, max(16, triton.next_power_of_2(rows)))
        block_v, num_warps, waves, sms = 512, 4, WAVES_PER_SM, _INTERPRETER_SMS
        block_h = min(128, max(16, triton.next_power_of_2(hidden_size)))
        num_stages = 3
    else:
        block_n, block_v, num_warps, waves, num_stages = next(
            config for limit, config in TUNED[op] if limit is None or rows <= limit
        )
        block_h = 64 if sixteen_bit else 32
        sms = _sm_count(device.index if device.index is not None else torch.cuda.current_device())
    tiles = triton.cdiv(vocab_size, block_v)
    row_blocks = triton.cdiv(rows, block_n)
    splits = tiles if waves == 0 else max(1, min(tiles, triton.cdiv(waves * sms, row_blocks)))
    # Even out the runs of tiles so that no split is empty.
    splits = triton.cdiv(tiles, triton.cdiv(tiles, splits))
    return KernelConfig(block_n, block_v, block_h, splits, num_warps, num_stages)


def check_device(hidden: torch.Tensor) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors under the interpreter."""
    if not hidden.is_cuda and not triton.knobs.runtime.interpret:
        raise ValueError(
            f"hidden: the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
            f"interpreter); got a tensor on {hidden.device}"
        )


def dot_options(t: torch.Tensor) -> dict:
    """Constexpr ``tl.dot`` options for inputs like ``t``.

    ``DOT_PRECISION``: true fp32 products for fp32 inputs, never TF32 ("tf32" is ignored for
    16-bit inputs). ``DOT_IN_FP32``: under the interpreter, bf16 blocks are upcast before
    ``tl.dot`` because the Triton 3.6 interpreter multiplies bf16 as raw uint16 bit patterns; the
    upcast computes the same products (exact in fp32) with the same fp32 accumulation.
    """
    dot_in_fp32 = t.dtype == torch.bfloat16 and (not t.is_cuda or triton.knobs.runtime.interpret)
    precise = t.dtype == torch.float32 or dot_in_fp32
    return {"DOT_PRECISION": "ieee" if precise else "tf32", "DOT_IN_FP32": dot_in_fp32}


_WORKSPACES: dict[tuple, tuple[torch.Tensor, ...]] = {}


def cached_workspace(key: tuple, make) -> tuple[torch.Tensor, ...]:
    """The workspace tensors for ``key``, allocated by ``make()`` on first use and then reused.

    Reuse keeps repeated calls allocation-free: after one warm-up call (which allocates and
    compiles) a call can be captured in a CUDA graph. Calls with the same key share the buffers,
    so concurrent calls on different CUDA streams must pass their own.
    """
    if key not in _WORKSPACES:
        _WORKSPACES[key] = make()
    return _WORKSPACES[key]


@triton.jit
def dot_tile(
    hidden_ptr,
    lm_head_ptr,
    row_off,  # [BLOCK_N] int64 element offsets of the rows of hidden
    row_ok,  # [BLOCK_N]
    tile,  # vocabulary tile index: ids tile · BLOCK_V .. + BLOCK_V - 1
    vocab_size,
    stride_vv,
    stride_hh,
    stride_vh,
    HIDDEN_SIZE: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    """The ids ``cols [BLOCK_V]`` of vocabulary tile ``tile``, their mask ``col_ok`` (id <
    vocab_size), and ``dot[BLOCK_N, BLOCK_V] = Σ_k hidden[rows, k] · lm_head[cols, k]`` in fp32.

    The LM-head tile (BLOCK_V · H elements) is the only DRAM stream of the kernels; the hidden
    block is re-read per tile from L2. Masked rows, columns and the H tail load zeros.
    """
    cols = tile * BLOCK_V + tl.arange(0, BLOCK_V)
    col_ok = cols < vocab_size
    col_off = cols.to(tl.int64) * stride_vv  # [BLOCK_V]
    acc = tl.zeros([BLOCK_N, BLOCK_V], dtype=tl.float32)
    for k0 in range(0, HIDDEN_SIZE, BLOCK_H):
        ks = k0 + tl.arange(0, BLOCK_H)
        k_ok = ks < HIDDEN_SIZE
        h = tl.load(
            hidden_ptr + row_off[:, None] + ks[None, :] * stride_hh,
            mask=row_ok[:, None] & k_ok[None, :],
            other=0.0,
        )  # [BLOCK_N, BLOCK_H]
        w = tl.load(
            lm_head_ptr + col_off[:, None] + ks[None, :] * stride_vh,
            mask=col_ok[:, None] & k_ok[None, :],
            other=0.0,
        )  # [BLOCK_V, BLOCK_H]
        if DOT_IN_FP32:
            h = h.to(tl.float32)
            w = w.to(tl.float32)
        acc = tl.dot(h, tl.trans(w), acc, input_precision=DOT_PRECISION)
    return cols, col_ok, acc


@triton.jit
def _argmax_tiles_kernel(
    hidden_ptr,  # [N, H]
    lm_head_ptr,  # [V, H]
    ws_max_ptr,  # [N, S] float32: max logit of the split
    ws_index_ptr,  # [N, S] int32: its vocabulary id (lowest on ties)
    num_rows,
    vocab_size,
    num_splits,
    stride_hn,
    stride_hh,
    stride_vv,
    stride_vh,
    # Loop bounds are compile-time constants: H is fixed per model, and the Triton 3.6
    # interpreter cannot take a runtime loop bound under NumPy >= 2.4 (triton-lang/triton#9171).
    HIDDEN_SIZE: tl.constexpr,
    TILES_PER_SPLIT: tl.constexpr,
    DOT_PRECISION: tl.constexpr,
    DOT_IN_FP32: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_V: tl.constexpr,
    BLOCK_H: tl.constexpr,
):
    pid_n = tl.program_id(0)
    pid_s = tl.program_id(1)
    rows = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    row_ok = rows < num_rows
    row_off = rows.to(tl.int64) * stride_hn  # [BLOCK_N]

    best = tl.full([BLOCK_N], float("-inf"), tl.float32)
    best_index = tl.full([BLOCK_N], -1, tl.int32)
    # A fixed trip count: the last split may run past the vocabulary; its tiles are fully
    # masked, load nothing, and change no running value.
    for j in range(0, TILES_PER_SPLIT):
        tile = pid_s * TILES_PER_SPLIT + j
        tile_valid = tile * BLOCK_V < vocab_size
        _, col_ok, acc = dot_tile(
            hidden_ptr,
            lm_head_ptr,
            row_off,
            row_ok,
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
        logits = tl.where(col_ok[None, :], acc, float("-inf"))  # padded vocabulary never wins
        tile_best, tile_arg = tl.max(
            logits, 1, return_indices=True, return_indices_tie_break_left=True
        )
        # Strict '>' keeps the earlier (lower-index) tile on ties; best_index < 0 seeds the run.
        take = (tile_best > best) | ((best_index < 0) & tile_valid)
        best = tl.where(take, tile_best, best)
        best_index = tl.where(take, tile * BLOCK_V + tile_arg, best_index)

    ws_off = rows * num_splits + pid_s
    tl.store(ws_max_ptr + ws_off, best, mask=row_ok)
    tl.store(ws_index_ptr + ws_off, best_index, mask=row_ok)


@triton.jit
def _argmax_finalize_kernel(
    ws_max_ptr,  # [N, S] float32
    ws_index_ptr,  # [N, S] int32
    token_ptr,  # [N] int64 out
    max_logit_ptr,  # [N] float32 out
    num_rows,
    num_splits,
    BLOCK_N: tl.constexpr,
    BLOCK_S: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    splits = tl.arange(0, BLOCK_S)
    row_ok = rows < num_rows
    mask = row_ok[:, None] & (splits[None, :] < num_splits)
    off = rows[:, None] * num_splits + splits[None, :]
    value = tl.load(ws_max_ptr + off, mask=mask, other=float("-inf"))  # [BLOCK_N, BLOCK_S]
    index = tl.load(ws_index_ptr + off, mask=mask, other=0)
    best, best_split = tl.max(value, 1, return_indices=True, return_indices_tie_break_left=True)
    token = tl.sum(tl.where(splits[None, :] == best_split[:, None], index, 0), 1)
    tl.store(token_ptr + rows, token.to(tl.int64), mask=row_ok)
    tl.store(max_logit_ptr + rows, best, mask=row_ok)


def tiled_argmax(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    vocab_size: int,
    *,
    config: KernelConfig | None = None,
    workspace: tuple[torch.Tensor, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax of ``hidden @ lm_head[:vocab_size].T`` without materialising the logits (Triton).

    Parameters
    ----------
    hidden : [N, H] float32 / bfloat16 / float16
    lm_head : [V, H], same dtype and device
    vocab_size : rows ``>= vocab_size`` of ``lm_head`` are padding and never chosen
    config : launch configuration (default: ``choose_config``)
    workspace : ``(max [N, S] float32, index [N, S] int32)`` with ``S = config.num_splits``;
        default: buffers cached per (device, N, S)

    Returns
    -------
    token : [N] int64, the lowest index among the maximal logits
    max_logit : [N] float32
    """
    check_device(hidden)
    n, hidden_size = hidden.shape
    if config is None:
        config = choose_config(
            "tiled_argmax", n, hidden_size, vocab_size, hidden.dtype, hidden.device
        )
    splits = config.num_splits
    if workspace is None:
        workspace = cached_workspace(
            ("tiled_argmax", hidden.device, n, splits),
            lambda: (
                torch.empty((n, splits), dtype=torch.float32, device=hidden.device),
                torch.empty((n, splits), dtype=torch.int32, device=hidden.device),
            ),
        )
    ws_max, ws_index = workspace
    if ws_max.shape != (n, splits) or ws_index.shape != (n, splits):
        raise ValueError(f"workspace: expected two [{n}, {splits}] tensors (N, num_splits)")

    token = torch.empty(n, dtype=torch.int64, device=hidden.device)
    max_logit = torch.empty(n, dtype=torch.float32, device=hidden.device)
    tiles = triton.cdiv(vocab_size, config.block_v)
    grid = (triton.cdiv(n, config.block_n), splits)
    _argmax_tiles_kernel[grid](
        hidden,
        lm_head,
        ws_max,
        ws_index,
        n,
        vocab_size,
        splits,
        hidden.stride(0),
        hidden.stride(1),
        lm_head.stride(0),
        lm_head.stride(1),
        HIDDEN_SIZE=hidden_size,
        TILES_PER_SPLIT=triton.cdiv(tiles, splits),
        **dot_options(hidden),
        BLOCK_N=config.block_n,
        BLOCK_V=config.block_v,
        BLOCK_H=config.block_h,
        num_warps=config.num_warps,
        num_stages=config.num_stages,
    )
    finalize_rows = 16
    _argmax_finalize_kernel[(triton.cdiv(n, finalize_rows),)](
        ws_max,
        ws_index,
        token,
        max_logit,
        n,
        splits,
        BLOCK_N=finalize_rows,
        BLOCK_S=triton.next_power_of_2(splits),
    )
    return token, max_logit
