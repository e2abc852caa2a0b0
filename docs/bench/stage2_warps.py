"""Stage 2's warps for the 4096-key hand-in (``verify_resample.settle_shape``) A/B on a GPU: whole
top-k 50 / top-k 1024 / top-p 0.9 calls (``settle_only``, Llama-3-8B head, bf16, logits of std 4,
γ 3) with stage 2 launched at 4, 8 and 16 warps, beside plain verify;
``scripts/kernel_bench.time_graphs``.

    python docs/bench/stage2_warps.py 1 4 16 64 128 512    # stage2_warps_h100.log
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as vr

SETTLE_SHAPE = vr.settle_shape


def call(args, truncate, warps):
    """One truncating call with stage 2 at ``warps`` warps."""

    def shape(splits, cap=4096):
        kept, constexprs, _ = SETTLE_SHAPE(splits, cap)
        return kept, constexprs, warps

    vr.settle_shape = shape
    try:
        return vr.verify_resample(*args, settle_only=True, **truncate)
    finally:
        vr.settle_shape = SETTLE_SHAPE


def cases(row_counts):
    """Per row count ``(rows, n, args)``: ``verify_resample``'s positional arguments on the
    Llama-3-8B head (bf16, hidden states of std 4, so logits of std 4), n = rows / 4 sequences of
    γ 3 (fewer rows: one sequence)."""
    head = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm = torch.randn(head.padded_vocab, head.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= head.hidden_size**-0.5
    for rows in row_counts:
        n = max(1, rows // 4)
        width = rows // n
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = 4 * torch.randn(n, width, head.hidden_size, device="cuda", generator=g)
        drafts = torch.randint(0, head.vocab_size, (n, width - 1), device="cuda", generator=g)
        yield rows, n, (
            hidden.to(torch.bfloat16), lm, drafts, torch.ones(n, device="cuda"),
            torch.arange(n, device="cuda") + 1, torch.arange(n, device="cuda") * 7,
            head.vocab_size,
        )  # fmt: skip


def main() -> None:
    for rows, n, args in cases([int(x) for x in sys.argv[1:]]):
        fns = {"verify": functools.partial(vr.verify_resample, *args)}
        for name, truncate in (
            ("top_k_50", dict(top_k=torch.full((n,), 50, device="cuda"))),
            ("top_k_1024", dict(top_k=torch.full((n,), 1024, device="cuda"))),
            ("top_p_0.9", dict(top_p=torch.full((n,), 0.9, device="cuda"))),
        ):
            for warps in (4, 8, 16):
                fns[f"{name}_w{warps}"] = functools.partial(call, args, truncate, warps)
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        print(rows, " ".join(f"{k} {v:.1f}" for k, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
