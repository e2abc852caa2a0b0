"""Time the CUDA kernels (``plugins/``) over vocabulary split counts on one LM head, for the
library in ``$FLASHSPEC_KERNELS_LIB`` (run once per build variant). Timing as in
``scripts/kernel_bench.py``; prints one line per (op, rows, splits) and writes JSON.

    FLASHSPEC_KERNELS_LIB=plugins/build/libflashspec_kernels.so \\
        python scripts/tune_cuda.py --head llama3-8b --rows 1 16 64 256 --out tune_cuda.json
"""

from __future__ import annotations

import functools
import json
import statistics

import torch
from kernel_bench import time_graph

from flashspec_export import cli
from flashspec_export.config import HEAD_SHAPES, HeadShape
from flashspec_export.ops import cuda


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--head", default="llama3-8b", choices=sorted(HEAD_SHAPES), help="LM head")
    add("--rows", nargs="+", type=cli.int_range(1), default=[1, 16, 64, 256], help="R")
    add("--splits", nargs="+", type=cli.int_range(0), default=[0, 132, 264, 528], help="0: auto")
    add("--gamma", type=cli.int_range(0, 64), default=3, help="drafts per sequence")
    add("--out", default="tune_cuda.json", help="JSON report path")
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
                median = statistics.median(time_graph(fn, 50))
                results.append({"op": op, "rows": rows, "splits": splits, "median_us": median})
                print(f"{cuda.library_path().name} {op} R={rows} splits={splits}: {median:.0f} us")
    with open(args.out, "w") as f:
        json.dump({"library": str(cuda.library_path()), "results": results}, f, indent=1)


if __name__ == "__main__":
    main()
