"""Verify at 1-16 rows: the launch table's portable row against candidate rows (BLOCK_V, warps,
programs per SM, stages; 16-row blocks scoring the table's rows), side by side with the cuBLAS
matmul and the argmax, settled timing (``scripts/kernel_bench.time_graphs``). Every candidate's
outputs must equal the table row's ("same").

    python docs/bench/small_rows_verify_tiles.py --heads llama3-8b qwen3-8b gemma3-12b --rows 1 4 16

Output: one line per (head, rows), × the matmul (docs/bench/small_rows_verify_tiles_h200.log).
"""

import argparse
import statistics
import sys

import torch

sys.path.insert(0, "scripts")
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import KernelConfig, choose_config, num_splits
from flashspec_export.kernels.verify_resample import verify_resample

# (BLOCK_V, num_warps, programs per SM, num_stages)
CANDIDATES = [
    (64, 4, 4, 3),
    (64, 4, 2, 3),
    (64, 8, 4, 3),
    (128, 4, 4, 3),
    (128, 8, 4, 3),
    (64, 4, 4, 4),
    (128, 8, 2, 4),
    (64, 4, 6, 3),
]


def compare(head: str, rows: int) -> str:
    """One line: the matmul's µs, then the argmax, the table's row and each candidate × it."""
    shape = HeadShape.from_name(head)
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    gamma = 3 if rows >= 4 else rows - 1
    n = rows // (gamma + 1)
    generator = torch.Generator(device="cuda").manual_seed(rows)
    hidden = torch.randn(n, gamma + 1, shape.hidden_size, device="cuda", generator=generator)
    hidden = hidden.bfloat16()
    drafts = torch.randint(0, shape.vocab_size, (n, gamma), device="cuda", generator=generator)
    inputs = (
        hidden,
        lm_head,
        drafts,
        torch.ones(n, device="cuda"),
        torch.arange(n, device="cuda") + 5,
        torch.arange(n, dtype=torch.int64, device="cuda") * 17,
        shape.vocab_size,
    )
    device = torch.device("cuda", 0)
    table = choose_config(
        "verify_resample", rows, shape.hidden_size, shape.vocab_size, torch.bfloat16, device
    )
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    configs = {"table": table}
    for block_v, warps, waves, stages in CANDIDATES:
        splits = num_splits(rows, shape.vocab_size, 16, block_v, waves, sms)
        configs[f"{block_v}/{warps}w/{waves}x/{stages}s"] = KernelConfig(
            16, block_v, 64, splits, warps, stages, None, table.epi_rows
        )
    flat = hidden.reshape(rows, -1)
    calls = {
        "matmul": lambda: flat @ lm_head.T,
        "argmax": lambda: tiled_argmax(flat, lm_head, shape.vocab_size),
    }
    expected = verify_resample(*inputs, config=table)
    same = True
    for name, config in configs.items():
        out = verify_resample(*inputs, config=config)
        pairs = zip(out, expected, strict=True)
        same &= all(torch.equal(a, b) for a, b in pairs if torch.is_tensor(a))
        calls[name] = lambda config=config: verify_resample(*inputs, config=config)
    medians = {k: statistics.median(v) for k, v in time_graphs(calls, 20, 200).items()}
    matmul = medians.pop("matmul")
    return (
        f"{head:11} R={rows:<3} table {tuple(table)[:6]} epi {table.epi_rows} "
        f"matmul {matmul:.1f} | "
        + " ".join(f"{k} {v / matmul:.3f}" for k, v in medians.items())
        + f" | same {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b", "qwen3-8b", "gemma3-12b"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16])
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    for head in args.heads:
        for rows in args.rows:
            print(compare(head, rows), flush=True)


if __name__ == "__main__":
    main()
