"""The benchmark's settle phase at the power limit: ``kernel_bench.time_graphs`` with settle_ms
0 / 100 / 200 / 400 on the shipped Hopper verify kernel, its copy without the hash and its GEMM
pipeline alone (``epilogue_pipes.py`` variants) and the cuBLAS matmul, in two provider orders
(Llama-3 head, bf16, γ = 3, T = 1; 20 ms graph replays).

    python docs/bench/settle_check.py      # log: docs/bench/settle_check_h200.log
"""

import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from epilogue_pipes import load, verify_calls
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape

VARIANTS = ("shipped", "nohash", "gemm_alone")
ORDERS = (
    ("gemm_alone", "shipped", "nohash", "matmul"),
    ("matmul", "nohash", "shipped", "gemm_alone"),
)


def main() -> None:
    modules = {name: load(name) for name in VARIANTS}
    shape = HeadShape.from_name("llama3-8b")
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    for rows in (128, 512):
        calls, _ = verify_calls(modules, shape, lm_head, rows)
        for order in ORDERS:
            for settle_ms in (0, 100, 200, 400):
                times = time_graphs({name: calls[name] for name in order}, 20, settle_ms)
                med = {name: statistics.median(t) for name, t in times.items()}
                ratios = "  ".join(f"{v} {med[v] / med['matmul']:.3f}" for v in VARIANTS)
                print(
                    f"R={rows} settle={settle_ms:3d} order={','.join(order)}: {ratios}"
                    f"  matmul {med['matmul']:.1f}",
                    flush=True,
                )


if __name__ == "__main__":
    main()
