"""How far the top-k / top-p hand-in reaches on a 128k vocabulary: the share of rows that the
fused truncation leaves unsettled (recomputed materialised by the op), and why — each row's
hand-in count (its dots at or above the threshold) beside the kept set it must hold (k, or the
nucleus). The shipped kernels (``kernels.verify_resample`` with ``settle_only``) under the
Triton interpreter on the CPU: Llama-3's vocabulary (128256 ids), a random fp32 head of H 256
scaled by H^-1/2 and hidden states of std 4 (logits of std 4, as the GPU benchmarks'), γ 3, T 1.

    python docs/bench/hand_in_reach.py --sequences 32    # docs/bench/hand_in_reach_cpu.log
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch

from flashspec_export.kernels import verify_resample as kernels

CASES = {  # name: (top-k, top-p)
    "top_k_50": (50, None),
    "top_k_1024": (1024, None),
    "top_p_0.8": (None, 0.8),
    "top_p_0.9": (None, 0.9),
    "top_p_0.95": (None, 0.95),
}


def percentiles(x: torch.Tensor, digits: int = 0) -> str:
    """Median, 90th percentile and max of ``x``."""
    q = torch.quantile(x.double(), torch.tensor([0.5, 0.9], dtype=torch.float64))
    return " / ".join(f"{v:.{digits}f}" for v in (*q.tolist(), float(x.max())))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=32)
    parser.add_argument("--hidden-size", type=int, default=256)
    args = parser.parse_args()
    vocab, n, hidden_size = 128256, args.sequences, args.hidden_size
    g = torch.Generator().manual_seed(0)
    head = torch.randn(vocab, hidden_size, generator=g) * hidden_size**-0.5
    hidden = 4 * torch.randn(n, 4, hidden_size, generator=g)
    drafts = torch.randint(0, vocab, (n, 3), generator=g)
    call = (hidden, head, drafts, torch.ones(n), torch.arange(n) + 1, torch.arange(n) * 7, vocab)
    logits = hidden.reshape(-1, hidden_size) @ head.T  # [R, V]
    ordered = logits.softmax(dim=-1).sort(dim=-1, descending=True).values
    mass_before = ordered.cumsum(dim=-1) - ordered
    head_line = f"# {n * 4} rows, V {vocab}, H {hidden_size}, logits of std {logits.std():.2f}, T 1"
    print(
        f"{head_line}; per case: unsettled rows, median / p90 / max of kept set, hand-in, threshold"
    )
    for name, (k, p) in CASES.items():
        truncation = {}
        if k is not None:
            truncation["top_k"] = torch.full((n,), k)
            kept = torch.full((logits.shape[0],), float(k))
        if p is not None:
            truncation["top_p"] = torch.full((n,), p)
            kept = (mass_before < p).sum(dim=-1).float()
        _, unsettled = kernels.verify_resample(*call, settle_only=True, **truncation)
        # the hand-in's threshold and count as the tile pass made them
        counts, thresholds = hand_in(call, truncation)
        cap = kernels.hopper_tiles.HAND_IN_CAP.value
        print(f"{name}: unsettled {int(unsettled.sum())} of {unsettled.numel()} "
              f"({100 * unsettled.float().mean():.1f}%); kept set {percentiles(kept)}; "
              f"hand-in {percentiles(counts.float())} (buffer {cap}); "
              f"threshold {percentiles(thresholds, 1)}", flush=True)  # fmt: skip


def hand_in(call, truncation) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's hand-in count (its dots at or above its threshold) and the threshold, from the
    threshold launches alone (``_hand_in_thresholds``) on the call's rows."""
    hidden, head, *_, vocab = call
    rows2d = hidden.reshape(-1, hidden.shape[-1])
    n = hidden.shape[0]
    truncated = torch.zeros(n, dtype=torch.int32)
    counts = torch.zeros(rows2d.shape[0], dtype=torch.int32)
    thresholds = kernels._hand_in_thresholds(
        rows2d, head, vocab, truncation.get("top_k"), truncation.get("top_p"), hidden.shape[1],
        None, truncated, counts,
    )  # fmt: skip
    dots = rows2d @ head.T
    return (dots >= thresholds[:, None]).sum(dim=-1), thresholds


if __name__ == "__main__":
    main()
