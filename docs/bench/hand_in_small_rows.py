"""The portable VerifyResample launch of a top-k, top-p or masked call at 1-16 rows (a top-k /
top-p tile pass hands in the dots above a threshold; top-p's also sums the online LSE): plain
verify, with log-probabilities, top-p 0.9 and top-k 50 (settle only) and a random allowed-token
mask, per launch shape, µs (CUDA graphs; Llama-3-8B head, bf16, γ 3 (γ 0 at 1 row); below 16
rows only the real rows are scored, as the library launches them). Behind
``kernels/tiles.py: HAND_IN_TUNED``.

    python docs/bench/hand_in_small_rows.py [--rows 1 4 16] [--json PATH]
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys

import torch
import triton

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

# (BLOCK_V, num_warps, waves, num_stages) of 16-row blocks
SHAPES = [(64, 4, 4, 3), (128, 4, 2, 3), (128, 4, 4, 3), (64, 4, 4, 4), (128, 8, 2, 3)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16])
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    shape = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    out = {}
    for rows in args.rows:
        width = 4 if rows % 4 == 0 else 1  # γ 3, else one row a sequence
        n = rows // width
        hidden = (4 * torch.randn(n, width, shape.hidden_size, device="cuda")).bfloat16()
        drafts = torch.randint(0, shape.vocab_size, (n, width - 1), device="cuda")
        call = (hidden, lm, drafts, torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
                + 1, torch.arange(n, device="cuda") * 7, shape.vocab_size)  # fmt: skip
        top_p = torch.full((n,), 0.9, device="cuda")
        top_k = torch.full((n,), 50, device="cuda", dtype=torch.int64)
        words = -(-shape.vocab_size // 32)
        mask = torch.randint(-(2**31), 2**31 - 1, (n, width, words), device="cuda").int()
        fns = {"matmul": functools.partial(torch.matmul, hidden.view(rows, -1), lm.T)}
        configs = {"table": choose_config("verify_resample", rows, shape.hidden_size,
                                          shape.vocab_size, lm.dtype, lm.device)}  # fmt: skip
        epi = triton.next_power_of_2(rows) if rows < 16 else 0
        for block_v, warps, waves, stages in SHAPES:
            splits = num_splits(rows, shape.vocab_size, 16, block_v, waves, sm_count(0))
            name = f"v{block_v}w{warps}x{waves}s{stages}"
            configs[name] = KernelConfig(16, block_v, 64, splits, warps, stages, None, epi)
        for name, config in configs.items():
            run = functools.partial(kernel.verify_resample, *call, config=config)
            fns[f"{name} plain"] = run
            fns[f"{name} lp"] = functools.partial(run, return_logprobs=True)
            fns[f"{name} top_p"] = functools.partial(run, top_p=top_p, settle_only=True)
            fns[f"{name} top_k"] = functools.partial(run, top_k=top_k, settle_only=True)
            fns[f"{name} mask"] = functools.partial(run, allowed_tokens=mask)
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 100).items()}
        out[rows] = {k: round(v, 1) for k, v in times.items()}
        for k, v in times.items():
            print(f"R={rows} {k}: {v:.1f}", flush=True)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
