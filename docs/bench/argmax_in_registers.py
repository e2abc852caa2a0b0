"""TiledArgmax's Hopper stage 1 with the wgmma warps reducing their accumulator in registers
(``epi_warps=0``) against the epilogue partition it replaced (64 x 256, 4 slots), timed in one
settled run with the cuBLAS matmul (``scripts/kernel_bench.time_graphs``); every variant's tokens
and max logits are checked equal to the first's.

    python docs/bench/argmax_in_registers.py llama3-8b,qwen3-8b,gemma3-12b 128,256,512

Logs: docs/bench/argmax_in_registers_{h100,h200}.log.
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch
import triton

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels.hopper_tiles import HopperConfig
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import KernelConfig

VARIANTS = {
    "partition 64x256": HopperConfig(block_n=64, block_v=256, stages=4, chunk=8, epi_regs=152),
    "registers 64x256": HopperConfig(block_n=64, block_v=256, stages=5, epi_warps=0, epi_regs=0),
    "registers 128x256": HopperConfig(block_n=128, block_v=256, stages=4, epi_warps=0, epi_regs=0),
}


def main(heads: list[str], row_counts: list[int]) -> None:
    for head in heads:
        shape = HeadShape.from_name(head)
        torch.manual_seed(0)
        lm_head = torch.randn(
            shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16
        )
        lm_head *= shape.hidden_size**-0.5
        for rows in row_counts:
            hidden = torch.randn(rows, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
            fns = {"matmul": functools.partial(torch.matmul, hidden, lm_head.T)}
            first = None
            for name, hopper in VARIANTS.items():
                splits = triton.cdiv(shape.vocab_size, hopper.block_v)
                config = KernelConfig(
                    hopper.block_n,
                    hopper.block_v,
                    hopper.block_k,
                    splits,
                    hopper.block_n // 16,
                    hopper.stages,
                    hopper,
                )
                fn = functools.partial(
                    tiled_argmax, hidden, lm_head, shape.vocab_size, config=config
                )
                tokens, max_logits = fn()
                if first is None:
                    first = tokens.clone(), max_logits.clone()
                if not (torch.equal(tokens, first[0]) and torch.equal(max_logits, first[1])):
                    raise AssertionError(f"{head} R={rows} {name}: results differ")
                fns[name] = fn
            medians = {k: statistics.median(v) for k, v in time_graphs(fns, rep_ms=20).items()}
            matmul = medians.pop("matmul")
            cells = "  ".join(f"{k} {us:7.1f} ({us / matmul:.3f})" for k, us in medians.items())
            print(f"{head:11} R={rows:<4} matmul {matmul:7.1f}  {cells}", flush=True)


if __name__ == "__main__":
    main(sys.argv[1].split(","), [int(r) for r in sys.argv[2].split(",")])
