"""How much noise work an exact lazy-noise verify could skip, on the stdlib-tiny pair's real logits.

The Gumbel noise is at most ``G_MAX = 31·ln 2 ≈ 21.5`` (``reference/noise.py``), so an id ``v`` can
win a row only if ``l_v / T + G_MAX >= b``, with ``b`` any lower bound on the row's best noisy
score. An exact lazy epilogue skips the hash and logs for the ids that fail the test; in a GPU
kernel the skip is a branch uniform over a chunk of rows × one vocabulary tile. This script gives
that skip its best chance — ``b`` is the row's true best score, the tightest bound there is —
and reports the fraction of ids that survive the test and of (chunk rows × 256 ids) blocks in
which none does. (CPU, fp32, ``transformers``; 8 held-out standard-library files, 4096 positions.)

    python docs/bench/lazy_noise_bound.py      # log: docs/bench/lazy_noise_bound.log
"""

import math
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from truncation_speed import stdlib_tiny_states

G_MAX = 31 * math.log(2)
TILE = 256


def main() -> None:
    torch.manual_seed(0)
    hidden, lm_head = stdlib_tiny_states("cpu")
    logits = hidden @ lm_head.T  # [positions, V]
    spread = (logits.max(1).values - logits.median(1).values).mean().item()
    std = logits.std(1).mean().item()
    print(f"stdlib-tiny logits {tuple(logits.shape)}: max - median {spread:.1f} on average, "
          f"std {std:.2f}; G_MAX {G_MAX:.2f}; tiles of {TILE} ids")  # fmt: skip
    for temperature in (0.3, 0.5, 0.7, 1.0):
        scaled = logits / temperature
        noise = -torch.log(torch.empty_like(scaled).exponential_())
        best = (scaled + noise).max(1).values
        survives = scaled + G_MAX >= best[:, None]
        per_tile = survives.view(survives.shape[0], -1, TILE).any(2)  # [positions, tiles]
        skipped = []
        for chunk in (1, 16, 64):
            blocks = per_tile.view(-1, chunk, per_tile.shape[1]).any(1)
            skipped.append(f"{chunk} rows {1 - blocks.float().mean().item():.3f}")
        print(f"T {temperature}: ids surviving {survives.float().mean().item():.3f}; "
              f"blocks skipped: {', '.join(skipped)}")  # fmt: skip


if __name__ == "__main__":
    main()
