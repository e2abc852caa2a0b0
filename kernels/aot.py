"""Ahead-of-time compilation of the Triton kernels into the CUDA kernel library (``plugins/``).

    python -m flashspec_export.kernels.aot OUTDIR [--dtypes bfloat16 float16]
        [--hidden-sizes 3840 4096] [--arch 90] [--jobs N]

compiles, for one GPU architecture, the stage-1 (tile) kernels of ``verify_resample`` (plain,
with log-probabilities, with an allowed-token mask, with both) and ``tiled_argmax`` for every row
of the launch tables ``TUNED`` and, on sm_90, ``HOPPER_TUNED`` (``kernels/tiles.py``) and every
(dtype, hidden size) asked for, plus their stage-2 (finalize) kernels for a few block sizes; for
top-k / top-p the Triton backend's four launches: the sampled logits (``SAMPLED_TUNED``), the
hand-in thresholds (top-k / top-p / both, with a mask or not), the tile kernels handing in every
dot above the threshold (the launch the Triton backend takes at each row count:
``HAND_IN_TUNED``, else ``TUNED`` / ``HOPPER_TUNED``; the same four variants) and the stage 2
that settles the kept set from them (``_truncated_summaries_kernel``, per top-k / top-p / both,
one for every split count); and writes

- ``OUTDIR/cubin/<kernel>.cubin``: the compiled kernels;
- ``OUTDIR/tritonAotKernels.cpp``: the cubins embedded with ``.incbin`` and the table
  ``flashspec::aot::kTable`` (``plugins/common/tritonAot.h``): per tile kernel its op, dtype,
  hidden size, row bound and block sizes (from the launch tables, so the two backends cannot
  drift), per finalize kernel its block sizes, and per kernel its name, warps and shared memory.

No GPU or driver is needed: ``triton.compile`` targets ``GPUTarget("cuda", arch, 32)``.

The launcher (``plugins/common/tritonAot.cu``) passes each kernel's runtime arguments in the order
of ``RUNTIME_ARGS`` below, then the two scratch pointers Triton 3.x appends (global and profile
scratch; both null: kernels that need scratch are refused here). The compiled specialisation is
the one Triton's JIT picks for contiguous tensors from the torch allocator: unit inner strides are
constants, the other strides of ``hidden`` / ``lm_head`` and the two matrix pointers are
16-divisible (the launcher checks H % 16 and the pointers' alignment before taking this path);
arguments that change with the batch are not specialised on, as in the JIT. The Hopper kernel
(``hopper_tiles``, Gluon) takes its two matrices as TMA descriptors, which the launcher encodes
(``cuTensorMapEncodeTiled``) with the box and swizzle recorded in the table; ``_check_descriptors``
holds the compiled kernel to them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import itertools
import logging
import os
import pathlib
import textwrap
from typing import NamedTuple

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.experimental.gluon import language as gl
from triton.experimental.gluon._runtime import GluonASTSource

from flashspec_export.kernels import hopper_tiles, tiled_argmax, verify_resample
from flashspec_export.kernels.tiles import (
    HAND_IN_TUNED,
    HOPPER_TUNED,
    TUNED,
    TUNED_BY_DEVICE,
    block_h_of,
    dot_options_of,
    epi_rows_of,
    hand_in_row,
    hopper_row,
    tuned_row,
)

logger = logging.getLogger(__name__)

HAND_IN_CAP = hopper_tiles.HAND_IN_CAP.value
DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
_POINTER_TYPE = {torch.bfloat16: "*bf16", torch.float16: "*fp16", torch.float32: "*fp32"}
_GLUON_DTYPE = {torch.bfloat16: gl.bfloat16, torch.float16: gl.float16}
# CUtensorMapDataType of a dtype, and of the element type Triton records for a tensor
# descriptor (its device-side enum: triton/backends/nvidia/driver.py TMA_DTYPE_DEVICE_TO_HOST).
_TMA_HOST_DTYPE = {torch.bfloat16: 9, torch.float16: 6}
_TMA_DEVICE_TO_HOST = {**{i: i for i in range(16)}, 8: 10, 9: 8, 10: 9}
# The generated table names the ABI's codes (plugins/common/flashspecAbi.h).
_ABI_DTYPE = {name: f"FLASHSPEC_{name.upper()}" for name in DTYPES}
_OPS = ("tiled_argmax", "verify_resample", "verify_truncated")
_ABI_OP = {op: f"FLASHSPEC_OP_{op.upper()}" for op in _OPS}

# The finalize kernels' block sizes: the smallest compiled one that covers a launch is used (the
# masks make the result independent of it; a block twice the split count doubled the argmax
# finalize's time, 3.5 -> 7.5 µs at 501 splits). BLOCK_S >= the split count; for verify also
# BLOCK_R >= γ + 1 (γ <= 7 here; larger γ runs the native CUDA kernels).
FINALIZE_BLOCK_S = (256, 512, 1024, 2048)
VERIFY_FINALIZE_BLOCK_R = (4, 8)
MAX_FINALIZE_ELEMENTS = 8192  # BLOCK_R · BLOCK_S of one verify program (registers, compile time)
# (TOP_K, TOP_P): the launcher takes the JIT's variant (top_k / top_p given or not)
_TRUNCATION_VARIANTS = ((True, False), (False, True), (True, True))
# The hand-in threshold kernel's blocks of sampled logits: the launcher takes the smallest that
# holds ceil(V / HAND_IN_STRIDE) (the threshold does not depend on it), so vocabularies up to
# 262144 ids; larger ones run the native kernels.
THRESHOLD_BLOCKS = (1024, 2048)
# The most shared memory one block may opt in to, per architecture (the CUDA C++ Programming
# Guide's table of compute capabilities): a kernel past it compiles without a driver but cannot
# launch, so ``compile_kernel`` refuses it.
MAX_SHARED_BYTES = {
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    120: 99 * 1024,
}


def _verify_tiles_args(hand_in: bool) -> tuple[tuple[str, str], ...]:
    """``_verify_tiles_kernel``'s runtime parameters: with top-k / top-p (``HAND_IN``) also the
    truncated flags, the thresholds, the counts and the handed-in keys, compiled out otherwise."""
    return (
        ("hidden_ptr", "*T"),
        ("lm_head_ptr", "*T"),
        ("temperature_ptr", "*fp32"),
        ("seed_ptr", "*i64"),
        ("positions_ptr", "*i64"),
        ("ws_float_ptr", "*fp32"),
        ("ws_index_ptr", "*i32"),
        *((("truncated_ptr", "*i32"),) if hand_in else ()),
        ("allowed_ptr", "*i32"),  # MASKED only: any pointer otherwise
        *(
            (("threshold_ptr", "*fp32"), ("count_ptr", "*i32"), ("hand_in_ptr", "*i64"))
            if hand_in
            else ()
        ),
        ("num_rows", "i32"),
        ("gamma", "i32"),
        ("vocab_size", "i32"),
        ("num_splits", "i32"),
        ("tiles_per_split", "i32"),
        ("num_words", "i32"),
        ("stride_hn", "i32"),
        ("stride_hi", "i32"),
        ("stride_vv", "i32"),
    )


# Each kernel's non-constexpr parameters, in order: the launcher's argument arrays mirror these.
RUNTIME_ARGS = {
    "verify_tiles": _verify_tiles_args(hand_in=False),
    # top-k / top-p: also the truncated flags and thresholds in, the hand-in out
    "verify_hand_in_tiles": _verify_tiles_args(hand_in=True),
    "sampled_logits": (
        ("hidden_ptr", "*T"),
        ("head_ptr", "*T"),
        ("out_ptr", "*fp32"),
        ("rows", "i32"),
        ("num_sampled", "i32"),
        ("hidden_size", "i32"),
        ("stride_hr", "i32"),
        ("stride_vr", "i32"),
        ("k_run", "i32"),
    ),
    "hand_in_threshold": (
        ("sample_ptr", "*fp32"),
        ("allowed_ptr", "*i32"),  # MASKED only: any pointer otherwise
        ("top_k_ptr", "*i64"),  # TOP_K only: any pointer otherwise
        ("top_p_ptr", "*fp32"),  # TOP_P only: any pointer otherwise
        ("truncated_ptr", "*i32"),
        ("out_ptr", "*fp32"),
        ("count_ptr", "*i32"),
        ("rows", "i32"),
        ("width", "i32"),
        ("vocab_size", "i32"),
        ("num_words", "i32"),
        ("num_sampled", "i32"),
        ("splits", "i32"),
    ),
    "truncated_summaries": (
        ("ws_float_ptr", "*fp32"),
        ("ws_index_ptr", "*i32"),
        ("keys_ptr", "*i64"),
        ("truncated_ptr", "*i32"),
        ("top_k_ptr", "*i64"),  # TOP_K only: any pointer otherwise
        ("top_p_ptr", "*fp32"),  # TOP_P only: any pointer otherwise
        ("temperature_ptr", "*fp32"),
        ("seed_ptr", "*i64"),
        ("positions_ptr", "*i64"),
        ("unsettled_ptr", "*i32"),  # the native workspace's int32 flags (the JIT's are int8)
        ("sel_ptr", "*i64"),
        ("num_rows", "i32"),
        ("width", "i32"),
        ("num_splits", "i32"),
        ("num_kept", "i32"),
        ("count_ptr", "*i32"),
        ("threshold_ptr", "*fp32"),
    ),
    "verify_finalize": (
        ("ws_float_ptr", "*fp32"),
        ("ws_index_ptr", "*i32"),
        ("draft_ptr", "*i64"),
        ("tokens_ptr", "*i64"),
        ("num_emitted_ptr", "*i64"),
        ("logprobs_ptr", "*fp32"),
        ("num_rows", "i32"),
        ("gamma", "i32"),
        ("num_splits", "i32"),
        ("stride_dn", "i32"),
    ),
    "argmax_tiles": (
        ("hidden_ptr", "*T"),
        ("lm_head_ptr", "*T"),
        ("ws_max_ptr", "*fp32"),
        ("ws_index_ptr", "*i32"),
        ("num_rows", "i32"),
        ("vocab_size", "i32"),
        ("num_splits", "i32"),
        ("tiles_per_split", "i32"),
        ("stride_hn", "i32"),
        ("stride_vv", "i32"),
    ),
    "hopper_tiles": (
        ("a_desc", "tensordesc"),  # CUtensorMap, then shape (2 x i32) and strides (2 x i64)
        ("b_desc", "tensordesc"),
        ("temperature_ptr", "*fp32"),
        ("seed_ptr", "*i64"),
        ("positions_ptr", "*i64"),
        ("best_score_ptr", "*fp32"),
        ("best_index_ptr", "*i32"),
        ("best_logit_ptr", "*fp32"),
        ("max_ptr", "*fp32"),
        ("sum_exp_ptr", "*fp32"),
        ("keys_ptr", "*i32"),
        ("num_rows", "i32"),
        ("gamma", "i32"),
        ("vocab_size", "i32"),
        ("allowed_ptr", "*i32"),  # MASKED only: any pointer otherwise
        ("num_words", "i32"),
        # HAND_IN only: any pointer otherwise
        ("truncated_ptr", "*i32"),
        ("threshold_ptr", "*fp32"),
        ("count_ptr", "*i32"),
        ("hand_in_ptr", "*i64"),
    ),
    "argmax_finalize": (
        ("ws_max_ptr", "*fp32"),
        ("ws_index_ptr", "*i32"),
        ("token_ptr", "*i64"),
        ("max_logit_ptr", "*fp32"),
        ("num_rows", "i32"),
        ("num_splits", "i32"),
    ),
}
_FUNCTIONS = {
    "verify_tiles": verify_resample._verify_tiles_kernel,
    "verify_hand_in_tiles": verify_resample._verify_tiles_kernel,
    "sampled_logits": verify_resample._sampled_logits_kernel,
    "hand_in_threshold": verify_resample._hand_in_threshold_kernel,
    "truncated_summaries": verify_resample._truncated_summaries_kernel,
    "verify_finalize": verify_resample._verify_finalize_kernel,
    "argmax_tiles": tiled_argmax._argmax_tiles_kernel,
    "argmax_finalize": tiled_argmax._argmax_finalize_kernel,
    "hopper_tiles": hopper_tiles.hopper_tiles_kernel,
}
# 16-divisible in the compiled specialisation (checked by the launcher).
_DIVISIBLE = ("hidden_ptr", "lm_head_ptr", "stride_hn", "stride_hi", "stride_vv")
# The hand-in's launches take the 16-byte aligned matrices and workspace buffers as the JIT sees
# torch's: the launcher places them at 16-byte offsets of a 16-byte aligned workspace.
_HAND_IN_DIVISIBLE = ("threshold_ptr", "count_ptr", "hand_in_ptr")
# Stage 2 of top-k / top-p also takes its workspace pointers 16-divisible, as the JIT sees them:
# without it the per-split loads lay out otherwise and the top-p normaliser's sum over the splits
# runs in another order (Triton 3.6: other fp32 instructions; an H100 saw 64-ulp log-probabilities).
# The launcher places them at 16-byte offsets of a 16-byte aligned workspace.
_DIVISIBLE_BY_KIND = {
    "truncated_summaries": (
        "ws_float_ptr",
        "ws_index_ptr",
        "keys_ptr",
        "truncated_ptr",
        "unsettled_ptr",
        "sel_ptr",
        "count_ptr",
        "threshold_ptr",
    ),
    "verify_hand_in_tiles": ("truncated_ptr", *_HAND_IN_DIVISIBLE),
    "sampled_logits": (
        "hidden_ptr",
        "head_ptr",
        "out_ptr",
        "hidden_size",
        "stride_hr",
        "stride_vr",
        "k_run",
    ),
    "hand_in_threshold": ("sample_ptr", "truncated_ptr", "out_ptr", "count_ptr"),
}


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel to compile: ``kind`` (a key of ``RUNTIME_ARGS``), its constexprs, its pointer
    element type (tile kernels), the block shapes of its tensor-descriptor arguments (the Hopper
    kernel) and launch options; ``symbol`` names it in the generated C++."""

    symbol: str
    kind: str
    constexprs: tuple[tuple[str, object], ...]
    element: str = "*fp32"
    num_warps: int = 4
    num_stages: int = 3
    descriptor_blocks: tuple[tuple[int, int], ...] = ()
    enable_fp_fusion: bool = True


@dataclasses.dataclass(frozen=True)
class TileRow:
    """A row of the generated tile table: the stage-1 kernels serving (op, dtype, H) up to
    ``max_rows`` rows: the portable kernel of a ``TUNED`` row or the Hopper kernel of a
    ``HOPPER_TUNED`` row (``block_k > 0``: TMA boxes of ``block_k`` hidden elements, swizzled by
    ``tma_swizzle``, a CUtensorMapSwizzle)."""

    op: str
    dtype: str
    hidden_size: int
    max_rows: int  # -1: no bound (the last row of TUNED)
    block_n: int
    block_v: int
    waves: int
    kernel: str
    logprobs_kernel: str | None
    masked_kernel: str | None  # verify with an allowed-token mask (None: the argmax)
    masked_logprobs_kernel: str | None
    block_k: int = 0
    tma_swizzle: int = 0
    device: str = ""  # a TUNED_BY_DEVICE row: a part of the GPU's name; "": any GPU


@dataclasses.dataclass(frozen=True)
class SettleRow:
    """A truncation stage-2 kernel: settles the kept sets of up to ``block_s`` splits."""

    top_k: bool
    top_p: bool
    logprobs: bool  # also rewrites the fields the log-probabilities read
    block_s: int
    kernel: str


@dataclasses.dataclass(frozen=True)
class SampledRow:
    """A ``SAMPLED_TUNED`` row's sampled-logits kernel for one dtype: up to ``max_rows`` rows."""

    dtype: str
    max_rows: int  # -1: no bound
    block_r: int
    block_s: int
    block_k: int
    k_splits: int
    kernel: str


@dataclasses.dataclass(frozen=True)
class ThresholdRow:
    """A hand-in threshold kernel: ``block`` >= the sampled logits of a row."""

    top_k: bool
    top_p: bool
    masked: bool
    block: int
    kernel: str


@dataclasses.dataclass(frozen=True)
class FinalizeRow:
    op: str
    logprobs: bool
    block_r: int  # verify: draft positions per program (>= γ + 1); argmax: rows per program
    block_s: int
    kernel: str


class _Variant(NamedTuple):
    """A compiled variant of a VerifyResample tile kernel."""

    logprobs: bool
    masked: bool

    @property
    def suffix(self) -> str:
        return ("_lp" if self.logprobs else "") + ("_mask" if self.masked else "")


# Plain, with log-probabilities, with an allowed-token mask, with both: the table's four kernels.
_VERIFY_VARIANTS = tuple(_Variant(lp, masked) for masked in (False, True) for lp in (False, True))


def _variant_symbols(symbols: dict) -> tuple[str, str | None, str | None, str | None]:
    """A row's (kernel, logprobs, masked, masked logprobs kernel) from its variants' symbols;
    the argmax has only the first (variant None)."""
    if None in symbols:
        return symbols[None], None, None, None
    return tuple(symbols[v] for v in _VERIFY_VARIANTS)


def _row_bounds(op: str) -> list[int | None]:
    """The row bounds where either launch table of ``op`` changes, ascending, None last."""
    limits = {limit for table in (TUNED, HOPPER_TUNED) for limit, _ in table[op]}
    return [*sorted(limits - {None}), None]


def _tma_swizzle(layout) -> int:
    """The CUtensorMapSwizzle of an NVMMA shared layout (NONE, 32B, 64B, 128B = 0 .. 3)."""
    return {0: 0, 32: 1, 64: 2, 128: 3}[layout.swizzle_byte_width]


def _hopper_layout(dtype: torch.dtype, block: tuple[int, int]):
    # hopper_tiles.launch's choice for its TensorDescriptors.
    return gl.NVMMASharedLayout.get_default_for(list(block), _GLUON_DTYPE[dtype])


def tile_kernels(dtypes, hidden_sizes, arch: int = 90) -> tuple[list[KernelSpec], list[TileRow]]:
    """The stage-1 kernels for each (dtype, H) and their table rows: per op, one row per segment
    of ``_row_bounds``, the Hopper kernel where ``HOPPER_TUNED`` names one (sm_90, 16-bit dtypes;
    one kernel per dtype and configuration, as it takes H at run time), else the portable kernel
    of the ``TUNED`` row; and the top-k / top-p rows (op ``verify_truncated``,
    ``_hand_in_rows``)."""
    specs: dict[str, KernelSpec] = {}
    rows = []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for hidden_size in hidden_sizes:
            if hidden_size % 16:
                raise ValueError(f"hidden_sizes: {hidden_size} is not a multiple of 16")
            for op in ("verify_resample", "tiled_argmax"):
                # A GPU's own rows first: the launcher takes the first row that serves the call.
                for device, table in TUNED_BY_DEVICE.items():
                    for bound, _ in table.get(op, ()):
                        at = bound if bound is not None else 1 << 30
                        if arch == 90 and dtype in _GLUON_DTYPE and hopper_row(op, at) is not None:
                            continue  # the Hopper kernel serves these rows on every GPU
                        rows.append(
                            _portable_row(specs, op, dtype_name, hidden_size, bound, device)
                        )
                for bound in _row_bounds(op):
                    at = bound if bound is not None else 1 << 30
                    on_hopper = arch == 90 and dtype in _GLUON_DTYPE
                    hopper = hopper_row(op, at) if on_hopper else None
                    if hopper is not None:
                        row = _hopper_row(specs, op, dtype_name, hidden_size, bound, hopper)
                    else:
                        row = _portable_row(specs, op, dtype_name, hidden_size, bound)
                    rows.append(row)
            rows += _hand_in_rows(specs, dtype_name, hidden_size, arch)
    return list(specs.values()), rows


def _hand_in_rows(specs, dtype_name, hidden_size, arch) -> list[TileRow]:
    """The top-k / top-p rows (op ``verify_truncated``): at each row count the launch the Triton
    backend takes (``verify_resample``), compiled with ``HAND_IN``: the ``HAND_IN_TUNED`` row,
    else the Hopper kernel of ``HOPPER_TUNED`` (sm_90, 16-bit dtypes), else the ``TUNED`` row (a
    GPU's own first, as for plain verify); the "log-probabilities" variants also form the online
    softmax, which top-p's normaliser needs (``verify_resample``'s RETURN_LOGPROBS)."""
    op = "verify_resample"
    on_hopper = arch == 90 and DTYPES[dtype_name] in _GLUON_DTYPE

    def hopper(at):
        return hopper_row(op, at) if on_hopper else None

    rows = []
    for device, table in TUNED_BY_DEVICE.items():
        for bound, _ in table.get(op, ()):
            at = bound if bound is not None else 1 << 30
            if hand_in_row(at) is None and hopper(at) is None:
                rows.append(_portable_row(specs, op, dtype_name, hidden_size, bound, device, True))
    bounds = {limit for limit, _ in HAND_IN_TUNED} | set(_row_bounds(op))
    for bound in [*sorted(bounds - {None}), None]:
        at = bound if bound is not None else 1 << 30
        if hand_in_row(at) is not None:
            rows.append(_hand_in_row(specs, dtype_name, hidden_size, bound))
        elif hopper(at) is not None:
            rows.append(_hopper_row(specs, op, dtype_name, hidden_size, bound, hopper(at), True))
        else:
            rows.append(_portable_row(specs, op, dtype_name, hidden_size, bound, "", True))
    return rows


def _portable_constexprs(dtype: torch.dtype, hidden_size: int, block_n: int, block_v: int) -> dict:
    """The constexprs of a portable tile kernel's launch shape: the JIT's for contiguous
    ``hidden`` / ``lm_head`` of ``dtype`` (unit inner strides) on a GPU."""
    return {
        "stride_vh": 1,
        "HIDDEN_SIZE": hidden_size,
        **dot_options_of(dtype, compiled=True),
        "BLOCK_H": block_h_of(dtype),
        "stride_hh": 1,
        "BLOCK_N": block_n,
        "BLOCK_V": block_v,
    }


def _verify_symbols(specs, base, hand_in, dtype, constexprs, epi_rows, num_warps, num_stages):
    """Compile the four variants of a portable VerifyResample tile kernel (plain, with
    log-probabilities, a mask, both; with ``hand_in``, top-k / top-p's hand-in) and return their
    symbols by variant."""
    symbols = {}
    for variant in _VERIFY_VARIANTS:
        extra = {
            "LIBDEVICE": True,
            "RETURN_LOGPROBS": variant.logprobs,
            "EPI_ROWS": epi_rows,
            "MASKED": variant.masked,
            "HAND_IN": hand_in,
        }
        if not hand_in:  # top-k / top-p's inputs compiled out
            extra |= {"truncated_ptr": None, "threshold_ptr": None, "count_ptr": None}
            extra |= {"hand_in_ptr": None}
        symbol = symbols[variant] = base + variant.suffix
        specs[symbol] = KernelSpec(
            symbol,
            "verify_hand_in_tiles" if hand_in else "verify_tiles",
            tuple((constexprs | extra).items()),
            _POINTER_TYPE[dtype],
            num_warps,
            num_stages,
        )
    return symbols


def _hand_in_row(specs, dtype_name, hidden_size, bound) -> TileRow:
    """A ``HAND_IN_TUNED`` row (op ``verify_truncated``): the portable kernel with the hand-in.
    ``tiles.hand_in_config`` scores next_power_of_2(R) rows where that is below BLOCK_N; the
    compiled kernel scores the row's bound (the scores do not depend on it)."""
    dtype = DTYPES[dtype_name]
    block_n, block_v, num_warps, waves, num_stages = hand_in_row(bound)
    epi_rows = min(block_n, triton.next_power_of_2(bound))
    base = f"fsAot_verify_hand_in_tiles_{dtype_name}_h{hidden_size}_b{bound}"
    constexprs = _portable_constexprs(dtype, hidden_size, block_n, block_v)
    symbols = _verify_symbols(specs, base, True, dtype, constexprs, epi_rows, num_warps, num_stages)
    return TileRow(
        "verify_truncated", dtype_name, hidden_size, bound, block_n, block_v, waves,
        *_variant_symbols(symbols),
    )  # fmt: skip


def _portable_row(specs, op, dtype_name, hidden_size, bound, device="", hand_in=False) -> TileRow:
    """A ``TUNED`` (``TUNED_BY_DEVICE``) row's portable kernels for ``op``; with ``hand_in`` the
    top-k / top-p variants (op ``verify_truncated``)."""
    dtype = DTYPES[dtype_name]
    at = bound if bound is not None else 1 << 30
    block_n, block_v, num_warps, waves, num_stages = tuned_row(op, at, device)
    table = TUNED_BY_DEVICE[device][op] if device else TUNED[op]
    index = next(i for i, (limit, _) in enumerate(table) if limit is None or at <= limit)
    prefix = f"{device.lower()}_" if device else ""
    kind = "argmax_tiles" if op == "tiled_argmax" else "verify_tiles"
    if hand_in:
        kind = "verify_hand_in_tiles"
    base = f"fsAot_{kind}_{dtype_name}_h{hidden_size}_{prefix}r{index}"
    constexprs = _portable_constexprs(dtype, hidden_size, block_n, block_v)
    if op == "tiled_argmax":
        specs[base] = KernelSpec(
            base, kind, tuple(constexprs.items()), _POINTER_TYPE[dtype], num_warps, num_stages
        )
        symbols = {None: base}
    else:
        epi_rows = epi_rows_of(op, at, device) or block_n
        symbols = _verify_symbols(
            specs, base, hand_in, dtype, constexprs, epi_rows, num_warps, num_stages
        )
    return TileRow(
        "verify_truncated" if hand_in else op,
        dtype_name,
        hidden_size,
        -1 if bound is None else bound,
        block_n,
        block_v,
        waves,
        *_variant_symbols(symbols),
        device=device,
    )


def _hopper_row(specs, op, dtype_name, hidden_size, bound, config, hand_in=False) -> TileRow:
    """A ``HOPPER_TUNED`` row's Hopper kernels for ``op``; with ``hand_in`` the top-k / top-p
    variants (op ``verify_truncated``)."""
    dtype = DTYPES[dtype_name]
    blocks = ((config.block_n, config.block_k), (config.block_v, config.block_k))
    swizzles = {_tma_swizzle(_hopper_layout(dtype, block)) for block in blocks}
    if len(swizzles) != 1:
        raise RuntimeError(f"{config}: the two TMA boxes need different swizzles")
    shape = "_".join(str(v) for v in config)
    verify = op == "verify_resample"
    symbols = {}
    for variant in _VERIFY_VARIANTS if verify else (None,):
        symbol = f"fsAot_hopper_{op}_{dtype_name}_{shape}" + ("_hand_in" if hand_in else "")
        symbol += variant.suffix if variant else ""
        symbols[variant] = symbol
        constexprs = {
            "VERIFY": verify,
            "RETURN_LOGPROBS": variant.logprobs if variant else False,
            "STAGES": config.stages,
            "CHUNK": config.chunk,
            "EPI_WARPS": config.epi_warps,
            "EPI_REGS": config.epi_regs,
            "MASKED": variant.masked if variant else False,
            "HAND_IN": hand_in,
        }
        specs[symbol] = KernelSpec(
            symbol,
            "hopper_tiles",
            tuple(constexprs.items()),
            _POINTER_TYPE[dtype],
            config.block_n // 16,
            descriptor_blocks=blocks,
        )
    return TileRow(
        "verify_truncated" if hand_in else op,
        dtype_name,
        hidden_size,
        -1 if bound is None else bound,
        config.block_n,
        config.block_v,
        0,  # one split per BLOCK_V ids
        *_variant_symbols(symbols),
        config.block_k,
        swizzles.pop(),
    )


def finalize_kernels() -> tuple[list[KernelSpec], list[FinalizeRow]]:
    """The stage-2 kernels (independent of dtype and H), smallest blocks first."""
    specs, rows = [], []
    for block_s in FINALIZE_BLOCK_S:
        for block_r in VERIFY_FINALIZE_BLOCK_R:
            if block_r * block_s > MAX_FINALIZE_ELEMENTS:
                continue
            for logprobs in (False, True):
                suffix = "_lp" if logprobs else ""
                symbol = f"fsAot_verify_finalize_r{block_r}_s{block_s}{suffix}"
                constexprs = {
                    "stride_di": 1,
                    "RETURN_LOGPROBS": logprobs,
                    "LIBDEVICE": True,
                    "BLOCK_R": block_r,
                    "BLOCK_S": block_s,
                }
                warps = verify_resample.finalize_warps(block_r, block_s)
                kind = "verify_finalize"
                specs.append(KernelSpec(symbol, kind, tuple(constexprs.items()), num_warps=warps))
                rows.append(FinalizeRow("verify_resample", logprobs, block_r, block_s, symbol))
        symbol = f"fsAot_argmax_finalize_s{block_s}"
        block_n = tiled_argmax.FINALIZE_ROWS
        constexprs = {"BLOCK_N": block_n, "BLOCK_S": block_s}
        specs.append(KernelSpec(symbol, "argmax_finalize", tuple(constexprs.items())))
        rows.append(FinalizeRow("tiled_argmax", False, block_n, block_s, symbol))
    return specs, rows


def settle_kernels() -> tuple[list[KernelSpec], list[SettleRow]]:
    """The truncation's stage-2 kernels (independent of dtype and H): per (TOP_K, TOP_P) and
    log-probabilities or not (the fields the finalize then reads), with ``_truncated_summaries``'
    constexprs for up to ``SETTLE_SPLITS`` splits (the same for each split count: the sums and
    sorts are the Triton backend's to the bit) and the threshold hand-in of up to
    ``HAND_IN_CAP`` keys a row."""
    specs, rows = [], []
    block_s = verify_resample.SETTLE_SPLITS
    for (top_k, top_p), logprobs in itertools.product(_TRUNCATION_VARIANTS, (False, True)):
        _, shape, num_warps = verify_resample.settle_shape(block_s)
        flags = ("_k" if top_k else "") + ("_p" if top_p else "") + ("_lp" if logprobs else "")
        symbol = f"fsAot_truncated_summaries{flags}"
        constexprs = {
            "TOP_K": top_k, "TOP_P": top_p, "LIBDEVICE": True, "ROWS": 1,
            "RETURN_LOGPROBS": logprobs, **shape,
        }  # fmt: skip
        specs.append(
            KernelSpec(
                symbol,
                "truncated_summaries",
                tuple(constexprs.items()),
                num_warps=num_warps,
                enable_fp_fusion=False,
            )
        )
        rows.append(SettleRow(top_k, top_p, logprobs, block_s, symbol))
    return specs, rows


def hand_in_kernels(dtypes) -> tuple[list[KernelSpec], list[SampledRow], list[ThresholdRow]]:
    """The two launches before a top-k / top-p tile pass (``verify_resample._hand_in_thresholds``):
    the sampled logits per dtype and ``SAMPLED_TUNED`` row, and the threshold kernel per
    (TOP_K, TOP_P), mask or not, and block of ``THRESHOLD_BLOCKS``."""
    specs, sampled, thresholds = [], [], []
    for dtype_name in dtypes:
        dtype = DTYPES[dtype_name]
        for index, (bound, tune) in enumerate(verify_resample.SAMPLED_TUNED):
            block_r, block_s, block_k, k_splits, num_warps, num_stages = tune
            symbol = f"fsAot_sampled_logits_{dtype_name}_r{index}"
            constexprs = {
                **dot_options_of(dtype, compiled=True),
                "STRIDE": verify_resample.HAND_IN_STRIDE,
                "BLOCK_R": block_r,
                "BLOCK_S": block_s,
                "BLOCK_K": block_k,
            }
            specs.append(
                KernelSpec(
                    symbol, "sampled_logits", tuple(constexprs.items()), _POINTER_TYPE[dtype],
                    num_warps, num_stages,
                )
            )  # fmt: skip
            sampled.append(
                SampledRow(dtype_name, -1 if bound is None else bound, block_r, block_s, block_k,
                           k_splits, symbol)
            )  # fmt: skip
    depth = verify_resample.HAND_IN_TARGET // verify_resample.HAND_IN_STRIDE
    for block in THRESHOLD_BLOCKS:
        for masked in (False, True):
            for top_k, top_p in _TRUNCATION_VARIANTS:
                flags = ("_k" if top_k else "") + ("_p" if top_p else "") + ("_mask" * masked)
                symbol = f"fsAot_hand_in_threshold_b{block}{flags}"
                constexprs = {
                    "TOP_K": top_k,
                    "TOP_P": top_p,
                    "MASKED": masked,
                    "BLOCK": block,
                    "STRIDE": verify_resample.HAND_IN_STRIDE,
                    "TARGET": verify_resample.HAND_IN_TARGET,
                    "MIN_TARGET": verify_resample.HAND_IN_MIN,
                    "DEPTH": depth,
                }
                specs.append(KernelSpec(symbol, "hand_in_threshold", tuple(constexprs.items())))
                thresholds.append(ThresholdRow(top_k, top_p, masked, block, symbol))
    return specs, sampled, thresholds


def _signature(spec: KernelSpec) -> tuple[dict, dict, dict]:
    fn = _FUNCTIONS[spec.kind]
    constexprs = dict(spec.constexprs)
    runtime = [name for name in fn.arg_names if name not in constexprs]
    expected = [name for name, _ in RUNTIME_ARGS[spec.kind]]
    if runtime != expected:
        raise RuntimeError(
            f"{fn.__name__}: runtime parameters {runtime} differ from RUNTIME_ARGS[{spec.kind!r}] "
            f"{expected}; update kernels/aot.py and plugins/common/tritonAot.cu together"
        )
    dtype = next(d for d, pointer in _POINTER_TYPE.items() if pointer == spec.element)
    blocks = iter(spec.descriptor_blocks)
    types = {}
    for name, ty in RUNTIME_ARGS[spec.kind]:
        if ty == "tensordesc":
            block = next(blocks)
            layout = _hopper_layout(dtype, block)
            ty = f"tensordesc<{spec.element[1:]}[{block[0]}, {block[1]}],{layout!r}>"
        types[name] = ty.replace("*T", spec.element)
    signature = {name: types.get(name, "constexpr") for name in fn.arg_names}
    divisible = (*_DIVISIBLE, *_DIVISIBLE_BY_KIND.get(spec.kind, ()))
    attrs = {
        (fn.arg_names.index(name),): [["tt.divisibility", 16]]
        for name in divisible
        if name in types and spec.kind != "hopper_tiles"
    }
    return signature, constexprs, attrs


def compile_kernel(spec: KernelSpec, arch: int) -> tuple[bytes, str, int, int]:
    """(cubin, kernel name, shared memory bytes, warps) of ``spec`` for ``sm_<arch>``."""
    if triton.knobs.runtime.interpret:
        raise RuntimeError("kernels.aot: TRITON_INTERPRET is set; the kernels cannot be compiled")
    signature, constexprs, attrs = _signature(spec)
    if spec.kind == "hopper_tiles":
        if arch // 10 != 9:
            raise ValueError(f"{spec.symbol}: the Hopper kernel compiles for sm_90, not sm_{arch}")
        source = GluonASTSource(_FUNCTIONS[spec.kind], signature, constexprs, attrs)
    else:
        source = triton.compiler.ASTSource(_FUNCTIONS[spec.kind], signature, constexprs, attrs)
    compiled = triton.compile(
        source,
        target=GPUTarget("cuda", arch, 32),
        options={
            "num_warps": spec.num_warps,
            "num_stages": spec.num_stages,
            "enable_fp_fusion": spec.enable_fp_fusion,
        },
    )
    meta = compiled.metadata
    if meta.global_scratch_size or meta.profile_scratch_size:
        raise RuntimeError(
            f"{spec.symbol}: needs global / profile scratch ({meta.global_scratch_size} / "
            f"{meta.profile_scratch_size} bytes), which the library's launcher does not allocate"
        )
    if meta.num_ctas != 1 or meta.launch_cooperative_grid or meta.launch_pdl:
        raise RuntimeError(f"{spec.symbol}: cluster, cooperative or PDL launches: not supported")
    if meta.shared > MAX_SHARED_BYTES.get(arch, meta.shared):
        raise RuntimeError(
            f"{spec.symbol}: needs {meta.shared} bytes of shared memory, past the "
            f"{MAX_SHARED_BYTES[arch]} a block of sm_{arch} can have (fewer ring slots or a "
            "smaller tile)"
        )
    _check_descriptors(spec, meta.tensordesc_meta or [])
    # num_warps: all warps of the CTA (a warp-specialised kernel's partitions included)
    return compiled.asm["cubin"], meta.name, meta.shared, meta.num_warps


def _check_descriptors(spec: KernelSpec, metas: list[dict]) -> None:
    """The compiled kernel reads its tensor descriptors as the launcher encodes them
    (``tritonAot.cu``: the dtype's CUtensorMapDataType, the row's box and swizzle)."""
    dtype = next(d for d, pointer in _POINTER_TYPE.items() if pointer == spec.element)
    expected = [
        {
            "swizzle": _tma_swizzle(_hopper_layout(dtype, block)),
            "elem_type": _TMA_HOST_DTYPE[dtype],
            "block_size": list(block),
            "fp4_padded": False,
        }
        for block in spec.descriptor_blocks
    ]
    found = [
        {
            "swizzle": m["swizzle"],
            "elem_type": _TMA_DEVICE_TO_HOST[m["elem_type"]],
            "block_size": list(m["block_size"]),
            "fp4_padded": m["fp4_padded"],
        }
        for m in metas
    ]
    if found != expected:
        raise RuntimeError(
            f"{spec.symbol}: tensor descriptors {found} differ from what the launcher encodes "
            f"{expected}"
        )


def _cpp_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _cpp_array(element: str, name: str, fields: str, rows) -> list[str]:
    """The generated source of the array ``element const name[]``: a comment naming its
    ``fields``, then one braced initialiser per row of values."""
    return [
        *(f"// {line}" for line in textwrap.wrap(fields, 96)),
        f"{element} const {name}[] = {{",
        *(f"    {{{', '.join(str(v) for v in row)}}}," for row in rows),
        "};",
        "",
    ]


def render_cpp(
    kernels: dict[str, tuple[pathlib.Path, str, int, int, int]],
    tile_rows: list[TileRow],
    finalize_rows: list[FinalizeRow],
    settle_rows: list[SettleRow],
    sampled_rows: list[SampledRow],
    threshold_rows: list[ThresholdRow],
    arch: int,
) -> str:
    """The generated C++ source: the cubins (``.incbin`` of their files) and ``kTable``.

    ``kernels``: symbol -> (cubin path, kernel name, cubin bytes, warps, shared memory bytes)."""
    index = {symbol: i for i, symbol in enumerate(kernels)}
    lines = [
        f"// Generated by `python -m flashspec_export.kernels.aot` (triton {triton.__version__}, "
        f"sm_{arch}) from kernels/: do not edit.",
        '#include "tritonAotTable.h"',
        "",
    ]
    for symbol, (path, *_rest) in kernels.items():
        lines += [
            'asm(".pushsection .rodata\\n.balign 16\\n'
            f'.globl {symbol}\\n.hidden {symbol}\\n{symbol}:\\n"',
            f'    ".incbin \\"{path.as_posix()}\\"\\n.popsection\\n");',
            f'extern "C" unsigned char const {symbol}[];',
        ]
    lines += ["", "namespace flashspec::aot", "{", ""]
    kept, shape, _ = verify_resample.settle_shape(1)
    lines += [
        f"static_assert(kHandInCap == {HAND_IN_CAP} && kMaxKept == {kept} && kSelected == "
        f"{2 * shape['BLOCK_KEPT']} && kHandInStride == {verify_resample.HAND_IN_STRIDE} && "
        f"kMaxSampledSplits >= {max(r.k_splits for r in sampled_rows)},",
        '    "kernels/verify_resample.py HAND_IN_CAP / MAX_KEPT / HAND_IN_STRIDE / SAMPLED_TUNED: '
        'update tritonAotTable.h");',
        "",
        "namespace",
        "{",
        "",
    ]
    kernel_rows = [
        (_cpp_string(name), symbol, size, warps, shared)
        for symbol, (_path, name, size, warps, shared) in kernels.items()
    ]
    lines += _cpp_array(
        "Kernel", "kKernels", "name, cubin, bytes, warps, shared memory", kernel_rows
    )
    tiles = []
    for r in tile_rows:
        lp, masked, masked_lp = (
            index[k] if k else -1
            for k in (r.logprobs_kernel, r.masked_kernel, r.masked_logprobs_kernel)
        )
        tiles.append((
            _ABI_OP[r.op], _ABI_DTYPE[r.dtype], r.hidden_size, r.max_rows, r.block_n, r.block_v,
            r.waves, index[r.kernel], lp, masked, masked_lp, r.block_k, r.tma_swizzle,
            _cpp_string(r.device),
        ))  # fmt: skip
    lines += _cpp_array(
        "TileConfig",
        "kTiles",
        "op, dtype, hidden size, max rows (-1: any), BLOCK_N, BLOCK_V, waves, kernel, kernels "
        "with log-probabilities, a mask, both (-1: none), BLOCK_K and TMA swizzle of the Hopper "
        "kernel (0: portable), a part of the GPU's name (empty: any GPU): kernels/tiles.py TUNED, "
        "TUNED_BY_DEVICE and HOPPER_TUNED",
        tiles,
    )
    lines += _cpp_array(
        "FinalizeConfig",
        "kFinalizes",
        "op, log-probabilities, BLOCK_R (argmax: rows per program), BLOCK_S, kernel",
        [(_ABI_OP[r.op], int(r.logprobs), r.block_r, r.block_s, index[r.kernel])
         for r in finalize_rows],
    )  # fmt: skip
    lines += _cpp_array(
        "SettleConfig",
        "kSettles",
        "top-k, top-p, log-probabilities, BLOCK_S, kernel: the truncation's stage 2",
        [(int(r.top_k), int(r.top_p), int(r.logprobs), r.block_s, index[r.kernel])
         for r in settle_rows],
    )  # fmt: skip
    lines += _cpp_array(
        "SampledConfig",
        "kSampled",
        "dtype, max rows (-1: any), BLOCK_R, BLOCK_S, BLOCK_K, K_SPLITS, kernel: the hand-in's "
        "sampled logits (kernels/verify_resample.py SAMPLED_TUNED)",
        [(_ABI_DTYPE[r.dtype], r.max_rows, r.block_r, r.block_s, r.block_k, r.k_splits,
          index[r.kernel]) for r in sampled_rows],
    )  # fmt: skip
    lines += _cpp_array(
        "ThresholdConfig",
        "kThresholds",
        "top-k, top-p, mask, BLOCK, kernel: the hand-in's thresholds",
        [(int(r.top_k), int(r.top_p), int(r.masked), r.block, index[r.kernel])
         for r in threshold_rows],
    )  # fmt: skip
    lines += [
        "",
        "} // namespace",
        "",
        f"Table const kTable{{{arch}, {_cpp_string('triton ' + triton.__version__)}, kKernels,",
        "    sizeof(kKernels) / sizeof(kKernels[0]), kTiles, sizeof(kTiles) / sizeof(kTiles[0]),",
        "    kFinalizes, sizeof(kFinalizes) / sizeof(kFinalizes[0]), kSettles,",
        "    sizeof(kSettles) / sizeof(kSettles[0]), kSampled,",
        "    sizeof(kSampled) / sizeof(kSampled[0]), kThresholds,",
        "    sizeof(kThresholds) / sizeof(kThresholds[0])};",
        "",
        "} // namespace flashspec::aot",
        "",
    ]
    return "\n".join(lines)


def generate(out_dir: pathlib.Path, dtypes, hidden_sizes, arch: int = 90, jobs: int | None = None):
    """Compile the kernels and write ``out_dir/tritonAotKernels.cpp`` and ``out_dir/cubin/``."""
    for name in dtypes:
        if name not in DTYPES:
            raise ValueError(f"dtypes: {name!r} is not one of {', '.join(DTYPES)}")
    tile_specs, tile_rows = tile_kernels(dtypes, hidden_sizes, arch)
    finalize_specs, finalize_rows = finalize_kernels()
    settle_specs, settle_rows = settle_kernels()
    hand_in_specs, sampled_rows, threshold_rows = hand_in_kernels(dtypes)
    specs = tile_specs + finalize_specs + settle_specs + hand_in_specs
    cubin_dir = out_dir / "cubin"
    cubin_dir.mkdir(parents=True, exist_ok=True)
    logger.info("compiling %d Triton kernels for sm_%d", len(specs), arch)
    kernels = {}
    with concurrent.futures.ProcessPoolExecutor(max_workers=jobs or os.cpu_count()) as pool:
        results = pool.map(compile_kernel, specs, [arch] * len(specs))
        for spec, (cubin, name, shared, warps) in zip(specs, results, strict=True):
            path = (cubin_dir / f"{spec.symbol}.cubin").resolve()
            path.write_bytes(cubin)
            kernels[spec.symbol] = (path, name, len(cubin), warps, shared)
    source = render_cpp(
        kernels, tile_rows, finalize_rows, settle_rows, sampled_rows, threshold_rows, arch
    )
    target = out_dir / "tritonAotKernels.cpp"
    tmp = target.with_suffix(".tmp")
    tmp.write_text(source)
    tmp.replace(target)  # a failed run leaves no half-written source behind
    return target


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out_dir", type=pathlib.Path)
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float16"])
    parser.add_argument("--hidden-sizes", nargs="+", type=int, default=[3840, 4096])
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90")
    parser.add_argument("--jobs", type=int, default=None, help="compiler processes (default: CPUs)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    generate(args.out_dir, args.dtypes, args.hidden_sizes, args.arch, args.jobs)


if __name__ == "__main__":
    main()
