"""The shared pieces of the vocabulary-tiled Triton kernels (``tiled_argmax``,
``verify_resample``): the launch configuration and its tuned table, the tile product
``dot_tile`` and the running-best fold ``fold_best``. Their default workspaces come from
``flashspec_export.ops.workspace``: one buffer per (device, stream) reused outside CUDA-graph
capture, a fresh one in the graph's memory pool during capture.

Both kernels have one skeleton: grid ``(row blocks, vocabulary splits)``; a program owns
``BLOCK_N`` rows and a contiguous run of ``BLOCK_V``-id tiles; per tile ``dot_tile`` forms the
fp32 logits and the kernel folds them into per-row running values; a second launch reduces the
splits.

Compiled once per launch-table row: the arguments that change with the batch (rows, γ, the
run length of a split) are not specialised on (``do_not_specialize``), so a serving loop whose batch
changes within one row of ``TUNED`` reuses one compiled kernel.
"""

from __future__ import annotations

import itertools
from typing import NamedTuple

import numpy
import torch
import triton
import triton.language as tl

from flashspec_export.kernels import release
from flashspec_export.kernels.hopper_tiles import HopperConfig, device_name, runs_on, sm_count

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
    hopper : stage 1 runs ``kernels.hopper_tiles`` with this configuration (sm_90, 16-bit; from
        17 rows): one split per ``block_v`` ids; the other fields restate its shape
    epi_rows : VerifyResample scores only the first ``epi_rows`` rows of each block (a power of
        two below ``block_n``, for launches of at most that many rows); 0: all ``block_n``
    """

    block_n: int
    block_v: int
    block_h: int
    num_splits: int
    num_warps: int = 4
    num_stages: int = 3
    hopper: HopperConfig | None = None
    epi_rows: int = 0


# Tuned on an H100 (Llama-3-8B head, bf16; scripts/tune_kernels.py, docs/BENCHMARKS.md): per op,
# rows up to the key -> (BLOCK_N, BLOCK_V, num_warps, waves, num_stages), waves = programs per SM
# along the vocabulary (0: one tile per program). VerifyResample carries the Gumbel hash per
# logit, so it wants fewer logits per thread than the plain argmax. From 64 rows both want
# GEMM-shaped 128-row blocks, 4 stages and, for the wide tiles, 16 warps (32 accumulators per
# thread leave registers for the hash): docs/bench/tune_large_h100.log, verify -9% at 128 rows
# and -20% at 512 against the 8-warp 128 x 64 tile; argmax -16% at 512.
# waves > 0 only where one row block covers every R of the row, so that the split count, and with
# it the compiled kernels, do not change with R inside a row (the last argmax row pays ~4% at
# 512 rows for one tile per program instead of 63 splits).
# VerifyResample rows whose bound is below their BLOCK_N score only that many rows per block
# (``epi_rows_of``): tl.dot needs 16 rows, but the Gumbel noise of the padding is wasted work
# that shows at tile boundaries (H200, 1-8 rows: 1.01-1.04x the matmul instead of 1.04-1.06x,
# git show 51a3298:docs/BENCHMARKS.md).
# 2-16 rows take the 4-warp tile of 64 ids, 4 programs per SM (as the H200 below): with the
# two-level sample the 8-warp row's epilogue holds 128-136 registers a thread at 8-16 scored rows,
# one program per SM where 2 should overlap; H100, Llama-3, x the matmul (scripts/tune_kernels.py
# --ops verify_resample --rows 8 16 --warps 4 8 --waves 2 4 --stages 3,
# docs/bench/tune_small_verify_h100.log): 1.08-1.10 -> 0.95. At 4 rows (H100, µs,
# docs/bench/hand_in_small_rows_h100.log) plain verify 362 -> 358 and a masked call 403 -> 359.
_SMALL = (16, 64, 4, 4, 3)
TUNED = {
    "verify_resample": (
        (1, (16, 128, 8, 2, 3)),
        (4, _SMALL),
        (8, _SMALL),
        (16, _SMALL),
        (32, (32, 128, 8, 0, 3)),
        (64, (64, 64, 4, 2, 4)),
        (None, (128, 128, 16, 0, 4)),
    ),
    "tiled_argmax": (
        (16, (16, 128, 8, 2, 3)),
        (32, (32, 128, 8, 2, 3)),
        (128, (128, 128, 8, 2, 4)),
        (None, (128, 256, 16, 0, 4)),
    ),
}


# TUNED rows that one GPU model replaces, keyed by a part of its name (torch.cuda.get_device_name;
# the CUDA library matches cudaDeviceProp::name alike): per op, rows up to the key, as in TUNED;
# past the last key the GPU takes TUNED's rows. H200, both ops up to 16 rows: 64-id tiles,
# 4 warps, 4 programs per SM. The argmax runs 0.98-1.01x the matmul against 1.01-1.03x with
# TUNED's row (docs/bench/tune_argmax_small_h200.json), which on the H100 is 7% faster for Qwen3;
# the verify 1.00-1.01x against 1.03-1.04x (docs/bench/small_rows_verify_tiles_h200.log).
TUNED_BY_DEVICE = {
    "H200": {
        "verify_resample": tuple((bound, _SMALL) for bound in (1, 4, 8, 16)),
        "tiled_argmax": ((16, _SMALL),),
    },
}


# Stage 1 on Hopper (sm_90, bf16 / fp16), per op: rows up to the key -> HopperConfig, None for
# the portable kernel. The warp-specialised kernel keeps the tensor cores fed by TMA. Below 17
# rows the portable kernels are as fast or faster.
#
# VerifyResample overlaps its epilogue (a hash per logit) with the next tile's wgmma in an
# epilogue partition. Up to 64 rows it takes the 64-row tile of 256 ids
# (scripts/tune_kernels.py --hopper --block-n 64 --block-v 256; docs/bench/tune_wide_*): against
# 128 ids it halves the hidden-row bytes loaded per LM-head byte. On the H200 at 32 rows it runs
# 1.01-1.04x the matmul instead of 1.07-1.09x. Its epilogue reads 8 rows at a time with 4 warps,
# 16 ids per lane: with 8 epilogue warps the 4 MMA warps get 128 registers, fewer than the
# 64 x 256 accumulator needs. Past 64 rows each row block re-reads the LM head, and a partial last
# block costs more than a full one, so the faster tile alternates with R: the 128-row tile (4
# epilogue warps of 16 ids per lane amortise the rank-then-recompute epilogue's per-row work) where
# it needs fewer blocks' time, the 64 x 256 tile where R mod 128 is 1-64 (129-192, 257-320, 385-448
# rows; past 512 rows unmeasured, the 128-row tile). Measured on both GPUs, three heads
# (docs/bench/hopper_rows_sweep_{h200,h100}.log; 136-448 rows on the H100, Llama-3:
# hopper_rows_between_h100.log), × the matmul, before -> after: 80-96 rows H200 1.42-1.72 ->
# 1.21-1.28 (H100 1.03-1.08 either way), 160 rows H200 2.30-2.36 -> 1.78-1.86 and H100 2.00-2.07 ->
# 1.49-1.52, 192 rows 1.71-1.87 -> 1.35-1.47 and 1.77-1.81 -> 1.33-1.36, 320 rows 1.52-1.61 ->
# 1.41-1.50 and 1.57-1.63 -> 1.44-1.52; H100 Llama-3 at 448 rows 1.50 -> 1.42.
#
# TiledArgmax's epilogue is a row max: the wgmma warps reduce their own accumulator in registers
# (epi_warps=0), so no accumulator tile goes through shared memory. That leaves the shared
# memory to a deeper ring (64 x 256, 5 slots) or to two warpgroups on a 128 x 256 tile, which
# halves the LM-head bytes loaded per output. Settled timing, × the matmul (the
# docs/bench/argmax_in_registers_*.log of git history, before 0f8a7e6), against the epilogue
# partition on 64 x 256: H100 at 17-128 rows 0.93-0.99 (0.95-1.00), at 256 rows 0.96-1.04
# (1.07-1.13), at 512 rows 0.97-1.01 (1.00-1.06); H200 at 128 rows 0.99-1.01 (1.03-1.07), at
# 256-512 rows 0.97-1.02 (1.01-1.09). 64 x 128 tiles (in registers) are 1.12-1.33x on the H200
# for Qwen3 and Gemma-3.
_WIDE = HopperConfig(block_n=64, block_v=256, stages=4, chunk=8, epi_warps=4, epi_regs=152)
# TiledArgmax's tiles by R as the verify's, but the 64-row tile also at 65-128 rows (H200, three
# heads, docs/bench/argmax_rows_h200.log, × the matmul, before -> after: 160 rows 1.26-1.32 ->
# 1.15-1.17, 192 rows 1.14-1.19 -> 1.02-1.08, 320 rows 1.08-1.09 -> 1.02-1.04; H100, after,
# docs/bench/argmax_rows_h100.log: 1.00-1.01 at 160, 0.99-1.01 at 192, 0.99-1.17 at 320 (Gemma-3
# 1.17, its 128-row tile 1.14), 0.96-0.99 at 448).
# At 65-128 rows (one row block, the LM head read once) the 128-row tile takes a ring of 5 slots
# (the 64 KB hand-over and 5 slots of 32 KB fill the 227 KB of shared memory): more of the head in
# flight. H200, x the matmul, 4 -> 5 slots at 128 rows (Llama-3 · Qwen3 · Gemma-3): verify 1.12 ·
# 1.14 · 1.13 -> 1.09 · 1.11 · 1.10, a mask 1.13 · 1.15 · 1.13 -> 1.10 · 1.12 · 1.11, top-k 50
# 1-3% faster; from 256 rows no faster, at 384-512 up to 4% slower
# (docs/bench/ring_depth_ab{.py,_h200.log}).
_RING5 = HopperConfig(stages=5)
_ARGMAX_64 = HopperConfig(block_n=64, block_v=256, stages=5, epi_warps=0, epi_regs=0)
_ARGMAX_128 = HopperConfig(block_n=128, block_v=256, stages=4, epi_warps=0, epi_regs=0)
HOPPER_TUNED = {
    "verify_resample": (
        (16, None),
        (64, _WIDE),
        (128, _RING5),
        (192, _WIDE),
        (256, HopperConfig()),
        (320, _WIDE),
        (384, HopperConfig()),
        (448, _WIDE),
        (None, HopperConfig()),
    ),
    "tiled_argmax": (
        (16, None),
        (192, _ARGMAX_64),
        (256, _ARGMAX_128),
        (320, _ARGMAX_64),
        (384, _ARGMAX_128),
        (448, _ARGMAX_64),
        (None, _ARGMAX_128),
    ),
}


def hopper_row(op: str, rows: int) -> HopperConfig | None:
    """``HOPPER_TUNED[op]``'s configuration for ``rows`` (None: the portable kernel)."""
    return next(config for limit, config in HOPPER_TUNED[op] if limit is None or rows <= limit)


def _on_hopper(dtype: torch.dtype, device: torch.device) -> bool:
    return (
        device.type == "cuda"
        and not triton.knobs.runtime.interpret
        and dtype in (torch.bfloat16, torch.float16)
        and torch.cuda.get_device_capability(device)[0] == 9
    )


def choose_config(
    op: str,
    rows: int,
    hidden_size: int,
    vocab_size: int,
    dtype: torch.dtype,
    device: torch.device,
    *,
    hopper: bool = True,
) -> KernelConfig:
    """Launch configuration from the tuned tables (never autotuned inline): ``HOPPER_TUNED``
    where it names a Hopper kernel for this GPU, dtype and row count, else ``TUNED``.

    Parameters
    ----------
    op : "verify_resample" or "tiled_argmax"
    rows : flattened rows of ``hidden`` (``N`` for TiledArgmax, ``N · (γ + 1)`` for VerifyResample)
    hidden_size : H
    vocab_size : logical vocabulary (tiles past it are never visited)
    dtype : dtype of ``hidden`` / ``lm_head``
    device : where the kernels run (its SM count sets the number of splits)
    hopper : allow the Hopper kernel (False: the portable kernel's configuration)

    Returns
    -------
    KernelConfig
    """
    fast = hopper_row(op, rows) if hopper and _on_hopper(dtype, device) else None
    if fast is not None:
        splits = triton.cdiv(vocab_size, fast.block_v)
        return KernelConfig(
            fast.block_n, fast.block_v, fast.block_k, splits, fast.block_n // 16, fast.stages, fast
        )
    if device.type != "cuda" or triton.knobs.runtime.interpret:
        block_n = min(64, max(16, triton.next_power_of_2(rows)))
        block_v, num_warps, waves, sms = 512, 4, WAVES_PER_SM, _INTERPRETER_SMS
        block_h = min(128, max(16, triton.next_power_of_2(hidden_size)))
        num_stages = 3
        fewer = triton.next_power_of_2(rows)  # below BLOCK_N: VerifyResample scores only these
        epi_rows = fewer if op == "verify_resample" and fewer < block_n else 0
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        name = device_name(index)
        block_n, block_v, num_warps, waves, num_stages = tuned_row(op, rows, name)
        block_h = block_h_of(dtype)
        sms = sm_count(index)
        epi_rows = epi_rows_of(op, rows, name)
    splits = num_splits(rows, vocab_size, block_n, block_v, waves, sms)
    return KernelConfig(block_n, block_v, block_h, splits, num_warps, num_stages, None, epi_rows)


# The portable kernel's launch for a top-k / top-p call at 2-16 rows, whose tile pass hands in
# the dots above a threshold (top-p's also sums the online LSE it normalises by): rows up to the
# bound -> (BLOCK_N, BLOCK_V, num_warps, waves, num_stages), None for ``choose_config``'s launch,
# as past the last bound. With the hand-in in its loop, plain verify's 4-warp 16 x 64 tile at
# 4 programs per SM (``_SMALL``) holds 139 registers a thread (159 with the LSE), so fewer
# programs fit than are launched; the 4-warp 16 x 128 tile at 2 programs per SM does not.
# H200, Llama-3-8B head, settle only, µs (docs/bench/hand_in_small_rows_h200.log), plain
# verify's launch -> this one: top-k 50 357 -> 287 at 4 rows, 356 -> 283 at 8, top-p 0.9
# 376 -> 307 and 372 -> 303 (plain verify 253 and 265); at 16 rows top-p 300 here, top-k 361 in
# plain verify's. One scored row stays on plain verify's launch (top-k 266 against 273, top-p
# 284 against 290).
HAND_IN_TUNED = ((1, None), (16, (16, 128, 4, 2, 3)))


def hand_in_row(rows: int) -> tuple[int, int, int, int, int] | None:
    """The ``HAND_IN_TUNED`` row for ``rows`` (None: ``choose_config``'s launch)."""
    return next((config for limit, config in HAND_IN_TUNED if rows <= limit), None)


def hand_in_config(
    rows: int, hidden_size: int, vocab_size: int, dtype: torch.dtype, device: torch.device
) -> KernelConfig | None:
    """The portable launch of a top-k / top-p VerifyResample call from ``HAND_IN_TUNED``; None
    where ``choose_config``'s serves (past the table's rows, off a GPU, under the interpreter)."""
    if device.type != "cuda" or triton.knobs.runtime.interpret:
        return None
    row = hand_in_row(rows)
    if row is None:
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    block_n, block_v, num_warps, waves, num_stages = row
    splits = num_splits(rows, vocab_size, block_n, block_v, waves, sm_count(index))
    fewer = triton.next_power_of_2(rows)  # below BLOCK_N: only these rows are scored
    return KernelConfig(
        block_n, block_v, block_h_of(dtype), splits, num_warps, num_stages, None,
        fewer if fewer < block_n else 0,
    )  # fmt: skip


def _tuned_entry(op: str, rows: int, device_name: str) -> tuple[int | None, tuple]:
    """(bound, row) of the launch-table row for ``rows`` on the GPU named ``device_name``: its
    ``TUNED_BY_DEVICE`` row where one covers ``rows``, else ``TUNED``'s."""
    own = [t[op] for name, t in TUNED_BY_DEVICE.items() if name in device_name and op in t]
    rows_of = itertools.chain(*own, TUNED[op])  # TUNED ends with an unbounded row
    return next((limit, config) for limit, config in rows_of if limit is None or rows <= limit)


def tuned_row(op: str, rows: int, device_name: str = "") -> tuple[int, int, int, int, int]:
    """The launch-table row for ``rows`` on the GPU named ``device_name`` (``TUNED_BY_DEVICE``,
    else ``TUNED``): (BLOCK_N, BLOCK_V, num_warps, waves, num_stages)."""
    return _tuned_entry(op, rows, device_name)[1]


def epi_rows_of(op: str, rows: int, device_name: str = "") -> int:
    """The rows per block VerifyResample scores at ``rows`` (``KernelConfig.epi_rows``): the
    launch-table row's bound where it lies below the row's BLOCK_N, else 0 (every row)."""
    limit, (block_n, *_) = _tuned_entry(op, rows, device_name)
    return limit if op == "verify_resample" and limit is not None and limit < block_n else 0


def block_h_of(dtype: torch.dtype) -> int:
    """The hidden chunk of one ``tl.dot`` on a GPU: 64 elements of half / bf16, 32 of fp32."""
    return 64 if dtype in (torch.bfloat16, torch.float16) else 32


def num_splits(rows: int, vocab_size: int, block_n: int, block_v: int, waves: int, sms: int) -> int:
    """Vocabulary splits of a launch: ``waves`` programs per SM over all row blocks (at most one
    per tile), or one tile per program when ``waves == 0``. The CUDA library computes the same
    count for the kernels compiled into it (``plugins/common/tritonAot.cu``, ``tunedSplits``)."""
    tiles = triton.cdiv(vocab_size, block_v)
    row_blocks = triton.cdiv(rows, block_n)
    splits = tiles if waves == 0 else max(1, min(tiles, triton.cdiv(waves * sms, row_blocks)))
    # Even out the runs of tiles so that no split is empty.
    return triton.cdiv(tiles, triton.cdiv(tiles, splits))


def resolve_config(
    op: str,
    hidden2d: torch.Tensor | None,
    lm_head: torch.Tensor,
    rows: int,
    vocab_size: int,
    config: KernelConfig | None,
) -> KernelConfig:
    """The launch configuration of a call: ``config``, or ``choose_config``'s; a Hopper
    configuration falls back to the portable kernel's where the operands are not TMA-able
    (``hidden2d``: the ``[R, H]`` rows as one view, None where the rows are not one view)."""
    hidden_size = lm_head.shape[1]
    if config is None:
        config = choose_config(op, rows, hidden_size, vocab_size, lm_head.dtype, lm_head.device)
    if config.hopper is not None and not (hidden2d is not None and runs_on(hidden2d, lm_head)):
        config = choose_config(
            op, rows, hidden_size, vocab_size, lm_head.dtype, lm_head.device, hopper=False
        )
    return config


def check_device(hidden: torch.Tensor) -> None:
    """Triton kernels run on CUDA tensors, or on CPU tensors under the interpreter (whose Triton
    3.6 release needs NumPy < 2.4 for the kernels' runtime loop bound: triton-lang/triton#9171,
    fixed in 3.7)."""
    if not hidden.is_cuda and not triton.knobs.runtime.interpret:
        raise ValueError(
            f"hidden: the triton backend needs CUDA tensors (or TRITON_INTERPRET=1 for the CPU "
            f"interpreter); got a tensor on {hidden.device}"
        )
    interpreter_36 = triton.knobs.runtime.interpret and release(triton.__version__) < (3, 7)
    if interpreter_36 and release(numpy.__version__) >= (2, 4):
        raise RuntimeError(
            f"triton interpreter: NumPy {numpy.__version__} breaks the Triton 3.6 interpreter's "
            "runtime loop bounds (triton-lang/triton#9171); install numpy<2.4 "
            "(pip install -e '.[triton]' pins it)"
        )


def dot_options(t: torch.Tensor) -> dict:
    """Constexpr ``tl.dot`` options for inputs like ``t``.

    ``DOT_PRECISION``: true fp32 products for fp32 inputs, never TF32 ("tf32" is ignored for
    16-bit inputs). ``DOT_IN_FP32``: under the interpreter, bf16 blocks are upcast before
    ``tl.dot`` because the Triton 3.6 interpreter multiplies bf16 as raw uint16 bit patterns; the
    upcast computes the same products (exact in fp32) with the same fp32 accumulation.
    """
    return dot_options_of(t.dtype, compiled=t.is_cuda and not triton.knobs.runtime.interpret)


def dot_options_of(dtype: torch.dtype, *, compiled: bool) -> dict:
    """``dot_options`` of a ``dtype`` for compiled (GPU) or interpreted kernels."""
    dot_in_fp32 = dtype == torch.bfloat16 and not compiled
    precise = dtype == torch.float32 or dot_in_fp32
    return {"DOT_PRECISION": "ieee" if precise else "tf32", "DOT_IN_FP32": dot_in_fp32}


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
def fold_best(best, best_index, tile_values, tile, tile_valid, BLOCK_V: tl.constexpr):
    """Fold one tile's ``[BLOCK_N, BLOCK_V]`` values into the running ``best [BLOCK_N]`` and its
    vocabulary id ``best_index`` (int32, -1 before the first valid tile). Ties go to the lowest
    id: ``tl.max`` keeps the first within the tile, strict ``>`` the earlier tile.

    Returns the new ``best, best_index``, the mask of rows whose best this tile took, and the
    tile-local argmax (for fields read at the winning id)."""
    tile_best, tile_arg = tl.max(
        tile_values, 1, return_indices=True, return_indices_tie_break_left=True
    )
    take = (tile_best > best) | ((best_index < 0) & tile_valid)
    best = tl.where(take, tile_best, best)
    best_index = tl.where(take, tile * BLOCK_V + tile_arg, best_index)
    return best, best_index, take, tile_arg
