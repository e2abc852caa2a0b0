"""The portable VerifyResample launch of a top-p call at 8 and 16 rows (its tile pass hands in
the dots above a threshold and sums the online LSE): plain verify, with log-probabilities, and
top-p 0.9 (settle only) per launch shape, µs (CUDA graphs; Llama-3-8B head, bf16, γ 3). Behind
``kernels/tiles.py: TOP_P_TUNED``.

    python docs/bench/top_p_small_rows.py [--json PATH]
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
from flashspec_export.kernels import verify_resample as kernel  # noqa: E402
from flashspec_export.kernels.tiles import (  # noqa: E402
    KernelConfig,
    choose_config,
    num_splits,
    sm_count,
)

# (BLOCK_V, num_warps, waves, num_stages, epi_rows) of 16-row blocks
SHAPES = [(64, 4, 4, 3, 8), (64, 4, 2, 3, 0), (64, 4, 4, 4, 0), (128, 8, 2, 3, 0),
          (128, 4, 2, 3, 0), (32, 4, 4, 3, 0), (64, 8, 4, 3, 0), (128, 8, 4, 3, 0),
          (64, 4, 4, 2, 0)]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[8, 16])
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    shape = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    out = {}
    for rows in args.rows:
        n = rows // 4
        hidden = (4 * torch.randn(n, 4, shape.hidden_size, device="cuda")).to(torch.bfloat16)
        drafts = torch.randint(0, shape.vocab_size, (n, 3), device="cuda")
        call = (hidden, lm, drafts, torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
                + 1, torch.arange(n, device="cuda") * 7, shape.vocab_size)  # fmt: skip
        top_p = torch.full((n,), 0.9, device="cuda")
        fns = {"matmul": functools.partial(torch.matmul, hidden.view(rows, -1), lm.T)}
        configs = {"table": choose_config("verify_resample", rows, shape.hidden_size,
                                          shape.vocab_size, lm.dtype, lm.device)}  # fmt: skip
        for block_v, warps, waves, stages, epi in SHAPES:
            if epi and rows > epi:
                continue
            splits = num_splits(rows, shape.vocab_size, 16, block_v, waves, sm_count(0))
            name = f"v{block_v}w{warps}x{waves}s{stages}e{epi}"
            configs[name] = KernelConfig(16, block_v, 64, splits, warps, stages, None, epi)
        for name, config in configs.items():
            run = functools.partial(kernel.verify_resample, *call, config=config)
            fns[f"{name} plain"] = run
            fns[f"{name} lp"] = functools.partial(run, return_logprobs=True)
            fns[f"{name} top_p"] = functools.partial(run, top_p=top_p, settle_only=True)
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 100).items()}
        out[rows] = {k: round(v, 1) for k, v in times.items()}
        for k, v in times.items():
            print(f"R={rows} {k}: {v:.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
