"""The launch shape of VerifyResample's truncating tile pass (top-k 50) on a GPU: plain verify,
the portable kernel's shape and a set of portable shapes side by side (Llama-3-8B head, bf16,
logits of standard deviation 4, γ 3; settled CUDA-graph timing): the first shape sweep behind
``kernels.tiles.TRUNCATION_TUNED`` (then ``truncation_shapes.py``).

    python docs/bench/truncation_tiles.py > docs/bench/truncation_tiles_h100.log
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kernel_bench import time_graphs  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import verify_resample as kernel  # noqa: E402
from flashspec_export.kernels.tiles import choose_config  # noqa: E402

# (block_n, block_v, num_warps, num_stages) besides the portable kernel's own
SHAPES = ((128, 128, 8, 4), (128, 64, 8, 4), (64, 128, 8, 4), (64, 64, 4, 4), (64, 128, 4, 3),
          (32, 128, 8, 3), (32, 64, 4, 3), (16, 128, 8, 3), (16, 64, 4, 3))  # fmt: skip


def main() -> None:
    shape = HeadShape.from_name("llama3-8b")
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    for rows in (16, 64, 512):
        n = max(1, rows // 4)
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = 4 * torch.randn(n, rows // n, shape.hidden_size, device="cuda", generator=g)
        drafts = torch.randint(0, shape.vocab_size, (n, rows // n - 1), device="cuda", generator=g)
        seed, positions = torch.arange(n, device="cuda") + 1, torch.arange(n, device="cuda") * 7
        args = (hidden.bfloat16(), lm, drafts, torch.ones(n, device="cuda"), seed, positions,
                shape.vocab_size)  # fmt: skip
        base = choose_config("verify_resample", rows, shape.hidden_size, shape.vocab_size,
                             lm.dtype, lm.device, hopper=False)  # fmt: skip
        top_k = torch.full((n,), 50, device="cuda")
        fns = {
            "verify": functools.partial(kernel.verify_resample, *args),
            "portable": functools.partial(kernel.verify_resample, *args, config=base),
        }
        own = (base.block_n, base.block_v, base.num_warps, base.num_stages)
        for bn, bv, w, st in (own, *SHAPES):
            config = base._replace(block_n=bn, block_v=bv, num_warps=w, num_stages=st, epi_rows=0)
            fns[f"topk50 {bn}x{bv} w{w} s{st}"] = functools.partial(
                kernel.verify_resample, *args, config=config, top_k=top_k, settle_only=True
            )
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        print(f"R={rows} base {base}", flush=True)
        for name, us in times.items():
            print(f"  {name}: {us:.1f} ({us / times['verify']:.2f})", flush=True)


if __name__ == "__main__":
    main()
