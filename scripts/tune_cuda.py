"""Time the CUDA kernels (``plugins/``) over vocabulary split counts on one LM head, for the
library in ``$FLASHSPEC_KERNELS_LIB`` (run once per build variant). Timing as in
``flashspec_export.benchmark``; prints one line per (op, rows, splits) and writes JSON.

    FLASHSPEC_KERNELS_LIB=plugins/build/libflashspec_kernels.so \\
        python scripts/tune_cuda.py --head llama3-8b --rows 1 16 64 256 --out tune_cuda.json
"""

from __future__ import annotations

import argparse
import functools
import json
import statistics

import torch

from flashspec_export.benchmark import time_graph
from flashspec_export.config import HeadShape
from flashspec_export.ops import cuda


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--head", default="llama3-8b")
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 16, 64, 256])
    parser.add_argument("--splits", nargs="+", type=int, default=[0, 132, 264, 528])
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--out", default="tune_cuda.json")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "error: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    shape = HeadShape.from_name(args.head)
    h, vocab = shape.hidden_size, shape.vocab_size
    lm_head = (torch.randn(shape.padded_vocab, h, device="cuda") * h**-0.5).bfloat16()
    results = []
    for rows in args.rows:
        n = max(1, rows // (args.gamma + 1))
        gamma = rows // n - 1
        hidden = torch.randn(n, gamma + 1, h, device="cuda").bfloat16()
        drafts = torch.randint(0, vocab, (n, gamma), device="cuda")
        temps, seeds = torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
        positions = torch.zeros(n, dtype=torch.int64, device="cuda")
        for splits in args.splits:
            verify_args = (hidden, lm_head, drafts, temps, seeds, positions, vocab)
            ops = {
                "verify": functools.partial(cuda.verify_resample, *verify_args, num_splits=splits),
                "argmax": functools.partial(
                    cuda.tiled_argmax, hidden.reshape(-1, h), lm_head, vocab, num_splits=splits
                ),
            }
            for op, fn in ops.items():
                median = statistics.median(time_graph(fn, 30, 3))
                results.append({"op": op, "rows": rows, "splits": splits, "median_us": median})
                print(f"{cuda.library_path().name} {op} R={rows} splits={splits}: {median:.0f} us")
    with open(args.out, "w") as f:
        json.dump({"library": str(cuda.library_path()), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
