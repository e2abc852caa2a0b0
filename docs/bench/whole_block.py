"""The Hopper verify kernel at 32 rows (a 64-row tile) from a whole row block against the rows
themselves, side by side in one process (Llama-3 / Qwen3 / Gemma-3 heads, bf16):

    python docs/bench/whole_block.py   # docs/bench/whole_block_h200.log

"whole": as shipped, the 32 rows copied into a 64-row buffer (``hopper_tiles._whole_row_block``,
the copy timed too); "rows": the TMA descriptor over the 32 rows, its boxes reaching past the
last row. The tokens and counts must be equal.
"""

import statistics
import sys

import torch

sys.path.insert(0, "scripts")
sys.path.insert(0, "docs/bench")
from kernel_bench import time_graph
from small_rows_verify import HEADS, operands

from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.verify_resample import verify_resample


def median_us(fn) -> float:
    return statistics.median(time_graph(fn, 20))


def compare(head: str) -> str:
    args, flat, lm_head = operands(head, 32)
    times = {"matmul": median_us(lambda: flat @ lm_head.T)}
    times["whole"] = median_us(lambda: verify_resample(*args))
    whole = verify_resample(*args)
    shipped = hopper_tiles._whole_row_block
    hopper_tiles._whole_row_block = lambda rows, block_n: rows
    try:
        times["rows"] = median_us(lambda: verify_resample(*args))
        rows = verify_resample(*args)
    finally:
        hopper_tiles._whole_row_block = shipped
    same = torch.equal(whole.tokens, rows.tokens) and torch.equal(
        whole.num_emitted, rows.num_emitted
    )
    cells = "  ".join(f"{k} {v:.1f} ({v / times['matmul']:.3f})" for k, v in times.items())
    return f"{head} R=32 {cells} same={same}"


if __name__ == "__main__":
    for head in HEADS:
        for _ in range(2):
            print(compare(head), flush=True)
