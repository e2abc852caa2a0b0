"""The launch of the hand-in's sampled logits (``verify_resample.sampled_logits``, issue 35)
against cuBLAS over the same strided LM head: Llama-3-8B head (bf16), 1-512 rows, each
``SAMPLED_TUNED``-style launch (BLOCK_R, BLOCK_S, BLOCK_K, K_SPLITS, warps, stages) checked
against cuBLAS, then timed in CUDA graphs (``scripts/kernel_bench.time_graphs``), median µs.

    python docs/bench/sampled_logits_tune.py > $OUT/sampled_logits_tune.log
"""

from __future__ import annotations

import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kernel_bench import time_graphs  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import verify_resample as vr  # noqa: E402

TUNES = [
    (16, 32, 128, 8, 4, 3),
    (16, 32, 128, 4, 4, 3),
    (16, 16, 128, 8, 4, 3),
    (64, 16, 128, 4, 4, 3),
    (64, 16, 128, 1, 4, 3),
    (64, 32, 128, 1, 4, 3),
    (64, 32, 128, 2, 4, 3),
    (64, 32, 128, 4, 4, 3),
    (64, 64, 128, 1, 4, 3),
    (128, 32, 128, 1, 8, 3),
]


def main() -> None:
    shape = HeadShape.from_name("llama3-8b")
    vocab, hidden_size = shape.vocab_size, shape.hidden_size
    lm = torch.randn(shape.padded_vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= hidden_size**-0.5
    print(torch.cuda.get_device_name(), flush=True)
    for rows in (1, 4, 16, 32, 64, 128, 256, 512):
        h2 = (4 * torch.randn(rows, hidden_size, device="cuda")).to(torch.bfloat16)
        print(rows, sweep(h2, lm, vocab), flush=True)


def sweep(h2: torch.Tensor, lm: torch.Tensor, vocab: int) -> dict:
    want = (h2 @ lm[: vocab : vr.HAND_IN_STRIDE].T).float()
    fns = {"cublas": lambda: h2 @ lm[: vocab : vr.HAND_IN_STRIDE].T}
    for tune in TUNES:
        got = vr.sampled_logits(h2, lm, vocab, tune).sum(0)
        assert (got - want).abs().max() < 0.05 * want.abs().max(), tune
        fns[str(tune)] = lambda tune=tune: vr.sampled_logits(h2, lm, vocab, tune)
    fns["default"] = lambda: vr.sampled_logits(h2, lm, vocab)
    return {k: round(statistics.median(v), 1) for k, v in time_graphs(fns, 10, 30).items()}


if __name__ == "__main__":
    main()
