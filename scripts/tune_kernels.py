"""Sweep launch configurations of the Triton kernels on one LM head and print the best per row
count (the table ``choose_config`` encodes). Timing as in ``scripts/kernel_bench.py``.

    python scripts/tune_kernels.py --head llama3-8b --rows 4 32 128 512 --out tune.json

``--hopper`` sweeps the Hopper kernel instead (sm_90, ``kernels/hopper_tiles.py``): the
``HOPPER_TUNED`` row's configuration with each ring depth asked for (``--stages``; those past the
227 KB of shared memory are skipped) and each epilogue shape (``--epilogues CHUNKxWARPSxREGS``:
accumulator rows per step, warps, registers per thread; ``none``: the argmax reduced by the MMA
warps in registers; default the row's own).

    python scripts/tune_kernels.py --hopper --ops verify_resample --rows 256 512 --stages 4 \
        --epilogues 16x4x152 16x8x112 32x8x112
"""

from __future__ import annotations

import argparse
import functools
import itertools
import json
import statistics

import torch
import triton
from kernel_bench import time_graph

from flashspec_export import cli
from flashspec_export.config import HEAD_SHAPES, HeadShape
from flashspec_export.kernels.hopper_tiles import HopperConfig
from flashspec_export.kernels.tiled_argmax import tiled_argmax as triton_argmax
from flashspec_export.kernels.tiles import KernelConfig, hopper_row
from flashspec_export.kernels.verify_resample import verify_resample as triton_verify


def candidates(
    rows: int,
    vocab: int,
    sms: int,
    warps_options,
    block_n_options,
    stages_options,
    block_h,
    waves_options=(2, 0),
):
    """Row block from the row count (and 64 / 128, GEMM-shaped, for 64 rows and more) unless
    given, three tile widths, the given warp counts and pipeline depths, and splits for each
    number of waves (programs per SM; 0: one tile per program). Tiles of more than 64 fp32
    accumulators per thread are skipped (they spill once the epilogue's temporaries are live)."""
    base = max(16, min(128, triton.next_power_of_2(rows)))
    if not block_n_options:
        block_n_options = sorted({base, 64, 128}) if rows >= 64 else [base]
    for block_n, block_v, warps, stages, waves in itertools.product(
        block_n_options, (64, 128, 256), warps_options, stages_options, waves_options
    ):
        if block_n * block_v > 64 * 32 * warps or block_n > max(base, triton.next_power_of_2(rows)):
            continue
        tiles = triton.cdiv(vocab, block_v)
        row_blocks = triton.cdiv(rows, block_n)
        splits = tiles if waves == 0 else min(tiles, triton.cdiv(waves * sms, row_blocks))
        splits = triton.cdiv(tiles, triton.cdiv(tiles, splits))
        yield KernelConfig(block_n, block_v, block_h, splits, warps, stages)


def hopper_candidates(
    op: str,
    rows: int,
    vocab: int,
    stages_options,
    epilogues,
    block_n_options=(),
    block_v_options=(),
    block_k_options=(),
):
    """The ``HOPPER_TUNED`` row of ``op`` at ``rows`` (the 128-row tile below it), with each row
    block and vocabulary tile asked for (none: the row's own), each ring depth that fits in
    shared memory (the ring, and the fp32 accumulator tile where an epilogue partition takes
    it) and each epilogue ``(chunk, warps, regs)`` (none given: the row's own; 0 warps: no
    epilogue partition, TiledArgmax only)."""
    base = hopper_row(op, rows) or HopperConfig()
    epilogues = epilogues or [(base.chunk, base.epi_warps, base.epi_regs)]
    for block_n, block_v, block_k, stages, (chunk, warps, regs) in itertools.product(
        block_n_options or [base.block_n],
        block_v_options or [base.block_v],
        block_k_options or [base.block_k],
        stages_options,
        epilogues,
    ):
        if block_n % chunk or (warps == 0 and op != "tiled_argmax"):
            continue
        config = base._replace(
            block_n=block_n,
            block_v=block_v,
            block_k=block_k,
            stages=stages,
            chunk=chunk,
            epi_warps=warps,
            epi_regs=regs,
        )
        ring = stages * (config.block_n + config.block_v) * config.block_k * 2
        handover = config.block_n * config.block_v * 4 if warps else 0
        if ring + handover > 227 * 1024 - 1024:
            continue
        splits = triton.cdiv(vocab, config.block_v)
        yield KernelConfig(
            config.block_n,
            config.block_v,
            config.block_k,
            splits,
            config.block_n // 16,
            stages,
            config,
        )


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--head", default="llama3-8b", choices=sorted(HEAD_SHAPES), help="LM head")
    add("--rows", nargs="+", type=cli.int_range(1), default=[4, 32, 128, 512], help="R")
    add("--out", default="tune.json", help="JSON report path")
    parser.add_argument(
        "--ops",
        nargs="+",
        default=["verify_resample", "tiled_argmax"],
        choices=["verify_resample", "tiled_argmax"],
    )
    add("--warps", nargs="+", type=int, default=[4, 8], choices=[4, 8, 16], help="num_warps")
    add("--block-n", nargs="+", type=int, default=[], help="row blocks (default: from R)")
    add(
        "--waves",
        nargs="+",
        type=cli.int_range(0, 8),
        default=[2, 0],
        help="programs per SM along the vocabulary (0: one tile per program)",
    )
    add(
        "--block-v",
        nargs="+",
        type=int,
        default=[],
        choices=[64, 128, 256],
        help="Hopper vocabulary tiles (the wgmma N; default: the table's)",
    )
    add(
        "--block-k",
        nargs="+",
        type=int,
        default=[],
        choices=[32, 64],
        help="Hopper hidden-dimension chunk per ring slot (default: the table's)",
    )
    add("--stages", nargs="+", type=int, default=[3, 4], help="num_stages")
    add("--block-h", type=int, default=64, choices=[32, 64, 128], help="hidden chunk per dot")
    add("--hopper", action="store_true", help="sweep the Hopper kernel (sm_90)")
    add(
        "--epilogues",
        nargs="+",
        type=_epilogue,
        default=[],
        help="Hopper epilogue shapes CHUNKxWARPSxREGS, or none (default: the table's)",
    )
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "error: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    shape = HeadShape.from_name(args.head)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    lm_head = torch.randn(
        shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16
    )
    lm_head *= shape.hidden_size**-0.5
    matmul_us = {}
    results = []
    for rows in args.rows:
        gamma = 3 if rows % 4 == 0 else 0
        n = rows // (gamma + 1)
        hidden = torch.randn(n, gamma + 1, shape.hidden_size, device="cuda", dtype=lm_head.dtype)
        flat = hidden.reshape(rows, -1)
        drafts = torch.randint(0, shape.vocab_size, (n, gamma), device="cuda")
        temps = torch.ones(n, device="cuda")
        seeds = torch.arange(n, device="cuda")
        pos = torch.zeros(n, dtype=torch.int64, device="cuda")
        matmul = functools.partial(torch.matmul, flat, lm_head.T)
        matmul_us[rows] = statistics.median(time_graph(matmul, 50))
        for op, config in _sweep(args, rows, shape.vocab_size, sms):
            if op == "verify_resample":
                fn = functools.partial(
                    triton_verify,
                    hidden,
                    lm_head,
                    drafts,
                    temps,
                    seeds,
                    pos,
                    shape.vocab_size,
                    config=config,
                )
            else:
                fn = functools.partial(
                    triton_argmax, flat, lm_head, shape.vocab_size, config=config
                )
            try:
                us = statistics.median(time_graph(fn, 50))
            except Exception as e:  # a config the compiler rejects (e.g. out of shared memory)
                print(f"R={rows} {op} {config}: failed {type(e).__name__}: {e}"[:200])
                continue
            results.append(dict(rows=rows, op=op, config=config._asdict(), us=us))
            print(
                f"R={rows:<4} {op:>15} {tuple(config)} {us:8.1f} us (matmul {matmul_us[rows]:.1f})",
                flush=True,
            )
    with open(args.out, "w") as f:
        json.dump(dict(head=args.head, matmul_us=matmul_us, results=results), f, indent=1)
    print("\nbest per row count:")
    for rows in args.rows:
        for op in args.ops:
            mine = [r for r in results if r["rows"] == rows and r["op"] == op]
            if mine:
                best = min(mine, key=lambda r: r["us"])
                print(
                    f"R={rows:<4} {op:>15}: {best['us']:8.1f} us vs matmul "
                    f"{matmul_us[rows]:7.1f}  {best['config']}"
                )


def _epilogue(text: str) -> tuple[int, int, int]:
    """``CHUNKxWARPSxREGS`` -> (chunk, warps, regs): the Hopper epilogue's accumulator rows per
    step (a multiple of 8 and of the warps), warps (4 or 8) and registers per thread (a multiple
    of 8, 24 .. 256); ``none`` -> (16, 0, 0): no epilogue partition (TiledArgmax only)."""
    if text == "none":
        return 16, 0, 0
    try:
        chunk, warps, regs = (int(part) for part in text.split("x"))
    except ValueError:
        message = f"expected CHUNKxWARPSxREGS, e.g. 16x4x152; got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    if warps not in (4, 8) or chunk % 8 or chunk % warps or regs % 8 or not 24 <= regs <= 256:
        raise argparse.ArgumentTypeError(
            f"{text!r}: CHUNK a multiple of 8 and of WARPS, WARPS 4 or 8, REGS a multiple of 8 "
            "in 24..256; or none"
        )
    return chunk, warps, regs


def _sweep(args, rows: int, vocab: int, sms: int):
    """(op, config) pairs to time at ``rows``."""
    for op in args.ops:
        if args.hopper:
            for config in hopper_candidates(
                op,
                rows,
                vocab,
                args.stages,
                args.epilogues,
                args.block_n,
                args.block_v,
                args.block_k,
            ):
                yield op, config
        else:
            for config in candidates(
                rows, vocab, sms, args.warps, args.block_n, args.stages, args.block_h, args.waves
            ):
                yield op, config


if __name__ == "__main__":
    main()
