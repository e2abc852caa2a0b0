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

The launch configuration, the tile product and the running-best fold are shared with
``verify_resample`` (``kernels/tiles.py``: the two kernels have one skeleton).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.tiles import (
    KernelConfig,
    check_device,
    dot_options,
    dot_tile,
    fold_best,
    resolve_config,
)
from flashspec_export.ops.workspace import launch_workspace

# Rows per program of the split reduction (stage 2).
FINALIZE_ROWS = 16


@triton.jit(do_not_specialize=["num_rows", "num_splits", "tiles_per_split"])
def _argmax_tiles_kernel(
    hidden_ptr,  # [N, H]
    lm_head_ptr,  # [V, H]
    ws_max_ptr,  # [N, S] float32: max logit of the split
    ws_index_ptr,  # [N, S] int32: its vocabulary id (lowest on ties)
    num_rows,
    vocab_size,
    num_splits,
    tiles_per_split,
    stride_hn,
    stride_hh,
    stride_vv,
    stride_vh,
    HIDDEN_SIZE: tl.constexpr,  # fixed per model: the dot's loop bound
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
    for j in range(0, tiles_per_split):
        tile = pid_s * tiles_per_split + j
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
        # padded ids and NaN logits: -inf, never the argmax (reference.no_nan)
        logits = tl.where(col_ok[None, :] & (acc == acc), acc, float("-inf"))
        best, best_index, _, _ = fold_best(best, best_index, logits, tile, tile_valid, BLOCK_V)

    ws_off = rows * num_splits + pid_s
    tl.store(ws_max_ptr + ws_off, best, mask=row_ok)
    tl.store(ws_index_ptr + ws_off, best_index, mask=row_ok)


@triton.jit(do_not_specialize=["num_rows", "num_splits"])
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
        default: views of one buffer per (device, stream), fresh during CUDA-graph capture
        (``flashspec_export.ops.workspace``)

    Returns
    -------
    token : [N] int64, the lowest index among the maximal logits
    max_logit : [N] float32
    """
    check_device(hidden)
    n, hidden_size = hidden.shape
    config = resolve_config("tiled_argmax", hidden, lm_head, n, vocab_size, config)
    splits = config.num_splits
    if workspace is None:
        workspace = launch_workspace(
            hidden.device, "tiled_argmax", ((n, splits), torch.float32), ((n, splits), torch.int32)
        )
    ws_max, ws_index = workspace
    if ws_max.shape != (n, splits) or ws_index.shape != (n, splits):
        raise ValueError(f"workspace: expected two [{n}, {splits}] tensors (N, num_splits)")

    token = torch.empty(n, dtype=torch.int64, device=hidden.device)
    max_logit = torch.empty(n, dtype=torch.float32, device=hidden.device)
    if config.hopper is not None:
        hopper_tiles.launch(
            hidden, lm_head, vocab_size, workspace, verify=False, config=config.hopper
        )
    else:
        tiles_per_split = triton.cdiv(triton.cdiv(vocab_size, config.block_v), splits)
        grid = (triton.cdiv(n, config.block_n), splits)
        _argmax_tiles_kernel[grid](
            hidden,
            lm_head,
            ws_max,
            ws_index,
            n,
            vocab_size,
            splits,
            tiles_per_split,
            hidden.stride(0),
            hidden.stride(1),
            lm_head.stride(0),
            lm_head.stride(1),
            HIDDEN_SIZE=hidden_size,
            **dot_options(hidden),
            BLOCK_N=config.block_n,
            BLOCK_V=config.block_v,
            BLOCK_H=config.block_h,
            num_warps=config.num_warps,
            num_stages=config.num_stages,
        )
    _argmax_finalize_kernel[(triton.cdiv(n, FINALIZE_ROWS),)](
        ws_max,
        ws_index,
        token,
        max_logit,
        n,
        splits,
        BLOCK_N=FINALIZE_ROWS,
        BLOCK_S=triton.next_power_of_2(splits),
    )
    return token, max_logit
