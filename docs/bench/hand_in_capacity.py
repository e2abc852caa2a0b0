"""How large the top-k / top-p hand-in must be for unsettled rows to be rare at batch: a torch
emulation of the threshold rule (no kernels) on std-4 logits over a 128k vocabulary, for the
next buffer size. A row is settled where its hand-in (every logit at or above the threshold)
holds its kept set and fits the buffer. The threshold is the rank-r largest of every 128th id's
logit, as ``_hand_in_threshold_kernel`` takes it:

- top-k 1024: r from the shipped target (2048 keys: r 16) up, in buffers of 4096 and 8192 keys,
  beside the count model (count ~ 128 · Gamma(r)): a row fails below k or past the buffer;
- top-p 0.9 / 0.95: today's fixed r 16 against an adaptive r = c · j (j: the sampled ids the
  sampled softmax needs for p), clamped to [16, r_max].

2048 rows. At R = 512 rows, a per-row failure rate of 0.2% already means a recompute in most calls
(``truncation_whole_call_h200.log``: 1.8-20 ms a recomputing call on an H200).

    python docs/bench/hand_in_capacity.py    # docs/bench/hand_in_capacity_cpu.log
"""

from __future__ import annotations

import math

import torch

VOCAB, HIDDEN, ROWS, STRIDE = 128256, 256, 2048, 128


def gamma_cdf(x: float, r: int) -> float:
    """P(Gamma(r, 1) < x) for an integer shape: P(Poisson(x) >= r)."""
    return 1.0 - sum(math.exp(-x) * x**i / math.factorial(i) for i in range(r))


def logits(std: float, g: torch.Generator) -> torch.Tensor:
    """[ROWS, VOCAB] dots of hidden states of std ``std`` (±5% a row) with a head of H^-1/2."""
    head = torch.randn(VOCAB, HIDDEN, generator=g) * HIDDEN**-0.5
    hidden = std * torch.randn(ROWS, HIDDEN, generator=g)
    hidden *= 1 + 0.05 * torch.randn(ROWS, 1, generator=g)
    return hidden @ head.T


def unsettled(dots: torch.Tensor, kept: torch.Tensor, rank: torch.Tensor, cap: int) -> float:
    """The share of rows whose hand-in at the sampled rank-``rank`` threshold misses their
    ``kept`` largest logits (fewer handed in, or the nucleus ends on the last) or passes ``cap``."""
    sampled = dots[:, ::STRIDE].sort(dim=-1, descending=True).values
    theta = sampled.gather(1, (rank - 1)[:, None])
    count = (dots >= theta).sum(dim=-1)
    return 1.0 - ((count <= cap) & (kept < count)).float().mean().item()


def main() -> None:
    g = torch.Generator().manual_seed(0)
    dots = logits(4.0, g)
    print(f"# {ROWS} rows, V {VOCAB}, logits of std 4 (±5% a row), T 1")
    k = torch.full((ROWS,), 1024)
    print("top-k 1024, by rank r: unsettled share (count model: below k + past the buffer)")
    for r in (16, 18, 20, 24):
        rank = torch.full((ROWS,), r)
        cells = []
        for cap in (4096, 8192):
            model = gamma_cdf(1024 / STRIDE, r) + 1.0 - gamma_cdf(cap / STRIDE, r)
            cells.append(f"buffer {cap}: {100 * unsettled(dots, k - 1, rank, cap):.2f}% "
                         f"(model {100 * model:.4f}%)")  # fmt: skip
        print(f"  r {r}: " + "; ".join(cells), flush=True)
    probs = dots.softmax(dim=-1).sort(dim=-1, descending=True).values
    sampled = dots[:, ::STRIDE].sort(dim=-1, descending=True).values
    weights = (sampled - sampled[:, :1]).exp()
    weights /= weights.sum(dim=-1, keepdim=True)
    for p in (0.9, 0.95):
        nucleus = ((probs.cumsum(dim=-1) - probs) < p).sum(dim=-1)
        j = ((weights.cumsum(dim=-1) - weights) < p).sum(dim=-1)  # the sampled nucleus
        fixed = unsettled(dots, nucleus, torch.full_like(j, 16), 4096)
        cells = [f"fixed r 16, buffer 4096: {100 * fixed:.1f}%"]
        for c, r_max, cap in ((1.0, 24, 4096), (1.5, 24, 4096), (1.0, 38, 8192), (2.0, 38, 8192)):
            rank = (c * j.float()).ceil().long().clamp(16, r_max)
            cells.append(f"c {c}, r <= {r_max}, buffer {cap}: "
                         f"{100 * unsettled(dots, nucleus, rank, cap):.1f}%")  # fmt: skip
        print(f"top-p {p} (nucleus median {nucleus.float().median():.0f}): " + "; ".join(cells),
              flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
