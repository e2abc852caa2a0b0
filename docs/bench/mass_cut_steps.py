"""How many bisection steps stage 2's mass cut (``verify_resample._mass_cut``, top-p's nucleus)
takes, replayed on the CPU: the whole bisection of the logit's order key (before 277b02b) against
stopping once the bracket holds one key (since), per row of std-4 logits of the Llama-3-8B head
(random bf16 weights, hidden states of std 4), each row's hand-in the logits at or above the
16th largest of every 128th id (``_hand_in_threshold_kernel``'s 2048-key target), p = 0.9, T = 1.

    python docs/bench/mass_cut_steps.py 8    # docs/bench/mass_cut_steps_cpu.log
"""

from __future__ import annotations

import sys

import torch

from flashspec_export.config import HeadShape


def order_high(x: torch.Tensor) -> torch.Tensor:
    """The high word of ``order_key``: float32 bits ordered as the floats are."""
    bits = x.view(torch.int32).to(torch.int64)
    return torch.where(bits >= 0, bits, -(2**31) - bits)


def steps(high: torch.Tensor, fixed: torch.Tensor, p_fixed: int, stop_at_one: bool) -> int:
    """Bisection steps to the largest high word whose keys at or above weigh ``p_fixed``."""
    lo, hi = int(high.min()), int(high.max())
    n_lo, n_hi, count = high.numel(), 0, 0
    while lo < hi and (n_lo - n_hi > 1 or not stop_at_one):
        mid, count = (lo + hi + 1) >> 1, count + 1
        at_or_above = high >= mid
        if int(fixed[at_or_above].sum()) >= p_fixed:
            lo, n_lo = mid, int(at_or_above.sum())
        else:
            hi, n_hi = mid - 1, int(at_or_above.sum())
    return count


def main() -> None:
    rows = int(sys.argv[1]) if len(sys.argv) > 1 else 8
    head = HeadShape.from_name("llama3-8b")
    g = torch.Generator().manual_seed(0)
    lm = torch.randn(head.vocab_size, head.hidden_size, generator=g) * head.hidden_size**-0.5
    lm = lm.to(torch.bfloat16).float()
    hidden = (4 * torch.randn(rows, head.hidden_size, generator=g)).to(torch.bfloat16).float()
    logits = hidden @ lm.T
    sampled = logits[:, ::128]
    theta = sampled.topk(2048 * sampled.shape[1] // head.vocab_size, dim=1).values[:, -1]
    p_fixed = int(0.9 * 2**40)
    for r in range(rows):
        row = logits[r]
        handed = row[row >= theta[r]]
        weights = torch.softmax(row.double(), 0)[row >= theta[r]]
        fixed = (weights * 2**40).floor().to(torch.int64)
        if int(fixed.sum()) < p_fixed:  # the kernel's reach: no cut to find
            print(f"row {r}: {handed.numel()} keys handed in, weighing less than p", flush=True)
            continue
        high = order_high(handed)
        whole, stopped = (steps(high, fixed, p_fixed, stop) for stop in (False, True))
        print(f"row {r}: {handed.numel()} keys handed in, steps {whole} -> {stopped}", flush=True)


if __name__ == "__main__":
    main()
