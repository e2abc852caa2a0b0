"""Whole truncated calls (``settle_only``; Llama-3-8B head, bf16, logits of std 4, γ 3) beside
plain verify, at the ``kernels/verify_resample.py`` installed: run once per version of stage 2
to compare them (``scripts/kernel_bench.time_graphs``; the cases: ``stage2_warps.cases``).

    python docs/bench/stage2_widths.py TAG 1 4 16 64 128 512    # stage2_widths_h100.log
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kernel_bench import time_graphs
from stage2_warps import cases

from flashspec_export.kernels import verify_resample as vr


def main() -> None:
    tag = sys.argv[1]
    for rows, n, args in cases([int(x) for x in sys.argv[2:]]):
        k = torch.full((n,), 50, device="cuda")
        p = torch.full((n,), 0.9, device="cuda")
        fns = {"verify": functools.partial(vr.verify_resample, *args)}
        for name, truncate in (
            ("top_k_50", dict(top_k=k)),
            ("top_p_0.9", dict(top_p=p)),
            ("k50_p0.9", dict(top_k=k, top_p=p)),
        ):
            fns[name] = functools.partial(vr.verify_resample, *args, settle_only=True, **truncate)
        times = {name: statistics.median(v) for name, v in time_graphs(fns, 20, 200).items()}
        print(tag, rows, " ".join(f"{name} {v:.1f}" for name, v in times.items()), flush=True)


if __name__ == "__main__":
    main()
