"""Launch shapes of VerifyResample's truncating tile pass (top-k 50, without stage 2) beside plain
verify, on a GPU: per row count, the shape the op picks (``auto``: ``kernels.tiles
.TRUNCATION_TUNED``) and portable shapes ``BLOCK_N x BLOCK_V, warps, stages``, each at 2, 3 and 4
programs per SM (Llama-3-8B head, bf16, logits of standard deviation 4, γ 3; settled CUDA-graph
timing, ``scripts/kernel_bench.time_graphs``). The table's rows were read from these runs.

    python docs/bench/truncation_shapes.py 1 4 8 16 32 64 128 512   # truncation_shapes_h100.log
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT / "docs/bench"))
from kernel_bench import time_graphs  # noqa: E402
from truncation_speed import _stage1_only  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import tiles  # noqa: E402
from flashspec_export.kernels import verify_resample as kernel  # noqa: E402

SHAPES = ((16, 128, 8, 3), (16, 64, 4, 4), (32, 128, 8, 3), (32, 64, 4, 4), (64, 64, 4, 4),
          (64, 128, 8, 4))  # fmt: skip


def main() -> None:
    print(torch.cuda.get_device_name(), flush=True)
    shape = HeadShape.from_name("llama3-8b")
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for rows in [int(a) for a in sys.argv[1:]]:
        n = max(1, rows // 4)
        width = rows // n
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = 4 * torch.randn(n, width, shape.hidden_size, device="cuda", generator=g)
        drafts = torch.randint(0, shape.vocab_size, (n, width - 1), device="cuda", generator=g)
        args = (hidden.to(torch.bfloat16), lm, drafts, torch.ones(n, device="cuda"),
                torch.arange(n, device="cuda") + 1, torch.arange(n, device="cuda") * 7,
                shape.vocab_size)  # fmt: skip
        top_k = {"top_k": torch.full((n,), 50, device="cuda")}
        auto = tiles.truncation_config(
            rows, shape.hidden_size, shape.vocab_size, lm.dtype, lm.device
        )
        fns = {
            "verify": functools.partial(kernel.verify_resample, *args),
            "auto": functools.partial(_stage1_only, *args, **top_k),
        }
        for block_n, block_v, warps, stages in SHAPES:
            if block_n > max(16, rows):
                continue
            for waves in (2, 3, 4):
                splits = tiles.num_splits(rows, shape.vocab_size, block_n, block_v, waves, sms)
                config = auto._replace(block_n=block_n, block_v=block_v, num_warps=warps,
                                       num_stages=stages, num_splits=splits,
                                       epi_rows=0)  # fmt: skip
                name = f"{block_n}x{block_v}w{warps}s{stages} x{waves}"
                fns[name] = functools.partial(_stage1_only, *args, config=config, **top_k)
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 150).items()}
        print(f"R={rows} auto {auto}", flush=True)
        for name, us in times.items():
            print(f"  {name}: {us:.1f} ({us / times['verify']:.3f})", flush=True)


if __name__ == "__main__":
    main()
