"""Which Hopper tile shape VerifyResample (``--op tiled_argmax``: TiledArgmax) should take at each
row count (17-512 rows): the shipped op under each candidate shape, beside the cuBLAS matmul. A
launch computes whole row blocks (a partial last block costs a full one or more) and re-reads the
LM head once per block, so the faster shape alternates with R: the 64-row tile wastes fewer rows,
the 128-row tile reads the head half as often. Llama-3-8B / Qwen3-8B / Gemma-3-12B heads (bf16,
random, logits of std 4), γ 3, T 1 (TiledArgmax: R rows); CUDA graphs
(``scripts/kernel_bench.time_graphs``), median µs.

    python docs/bench/hopper_rows_sweep.py $OUT/hopper_rows_sweep.json --rows 48 64 96 128 192 256
    python docs/bench/hopper_rows_sweep.py $OUT/argmax_rows.json --op tiled_argmax --rows 160 192
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kernel_bench import time_graphs  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import tiled_argmax  # noqa: E402
from flashspec_export.kernels import verify_resample as kernel  # noqa: E402
from flashspec_export.kernels.hopper_tiles import HopperConfig  # noqa: E402
from flashspec_export.kernels.tiles import HOPPER_TUNED, KernelConfig  # noqa: E402

# Per op, the distinct tiles its table ships (``64x256``, ...), and for the verify one shallower
# ring beside them
SHAPES = {
    op: {f"{c.block_n}x{c.block_v}": c for _, c in table if c is not None}
    for op, table in HOPPER_TUNED.items()
}
SHAPES["verify_resample"]["64x256_s3"] = HopperConfig(block_n=64, block_v=256, stages=3, chunk=8)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("json", type=pathlib.Path)
    parser.add_argument("--rows", nargs="+", type=int, default=[48, 64, 96, 128, 192, 256, 512])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b", "qwen3-8b", "gemma3-12b"])
    parser.add_argument("--op", default="verify_resample", choices=sorted(SHAPES))
    args = parser.parse_args()
    out = {"device": torch.cuda.get_device_name()}
    for head in args.heads:
        shape = HeadShape.from_name(head)
        torch.manual_seed(0)
        lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
        lm = (lm * shape.hidden_size**-0.5).to(torch.bfloat16)
        for rows in args.rows:
            n = rows // 4
            g = torch.Generator(device="cuda").manual_seed(rows)
            hidden = 4 * torch.randn(n, 4, shape.hidden_size, device="cuda", generator=g)
            hidden = hidden.to(torch.bfloat16)
            drafts = torch.randint(0, shape.vocab_size, (n, 3), device="cuda", generator=g)
            temperature = torch.ones(n, device="cuda")
            seed = torch.arange(n, device="cuda") + 1
            positions = torch.arange(n, device="cuda") * 7
            flat = hidden.view(-1, shape.hidden_size)
            if args.op == "verify_resample":
                op = functools.partial(
                    kernel.verify_resample, hidden, lm, drafts, temperature, seed, positions,
                    shape.vocab_size,
                )  # fmt: skip
            else:
                op = functools.partial(tiled_argmax.tiled_argmax, flat, lm, shape.vocab_size)
            fns = {"matmul": functools.partial(torch.matmul, flat, lm.T), "shipped": op}
            for name, h in SHAPES[args.op].items():
                splits = -(-shape.vocab_size // h.block_v)
                config = KernelConfig(
                    h.block_n, h.block_v, h.block_k, splits, h.block_n // 16, h.stages, h
                )
                fns[name] = functools.partial(op, config=config)
            times = time_graphs(fns, 20, 100)
            entry = {k: round(statistics.median(v), 1) for k, v in times.items()}
            out.setdefault(head, {})[rows] = entry
            ratios = " ".join(f"{k} {v} ({v / entry['matmul']:.2f})" for k, v in entry.items())
            print(f"{head} R={rows}: {ratios}", flush=True)
            args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
