"""Where the allowed-token mask's cost in the Hopper verify comes from (issue 35: the mask within
3% of plain verify; after the two-level sample it measured 1.15-1.58x from 128 rows,
``truncation_speed_h100.log``): plain verify, with log-probabilities (the other epilogue
variant), a random mask (half the ids) and an all-ones mask (the masked kernel, nothing masked),
each on the table's tile; Llama-3-8B head, logits of std 4, γ 3.

    python docs/bench/mask_cost.py --rows 128 512
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys

import torch

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as kernel

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rows", nargs="+", type=int, default=[128, 512])
    args = parser.parse_args()
    shape = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    for rows in args.rows:
        n = rows // 4
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = (4 * torch.randn(n, 4, shape.hidden_size, device="cuda", generator=g)).bfloat16()
        drafts = torch.randint(0, shape.vocab_size, (n, 3), device="cuda", generator=g)
        call = (
            hidden, lm, drafts, torch.ones(n, device="cuda"), torch.arange(n, device="cuda") + 1,
            torch.arange(n, device="cuda") * 7, shape.vocab_size,
        )  # fmt: skip
        words = -(-shape.vocab_size // 32)
        random = torch.randint(-(2**31), 2**31 - 1, (n, 4, words), device="cuda", generator=g)
        ones = torch.full((n, 4, words), -1, dtype=torch.int32, device="cuda")
        fns = {
            "verify": functools.partial(kernel.verify_resample, *call),
            "logprobs": functools.partial(kernel.verify_resample, *call, return_logprobs=True),
            "mask_random": functools.partial(
                kernel.verify_resample, *call, allowed_tokens=random.int()
            ),
            "mask_ones": functools.partial(kernel.verify_resample, *call, allowed_tokens=ones),
        }
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        base = times["verify"]
        print(f"R={rows}: " + " ".join(f"{k} {v:.1f} ({v / base:.2f})" for k, v in times.items()))


if __name__ == "__main__":
    main()
