"""A few truncated verify calls for ``ncu`` (Llama-3-8B head, bf16, logits of std 4, γ 3,
``settle_only``): the first calls compile, the last is the one to profile, e.g.

    ncu --kernel-name regex:'_truncated|_hand_in|_sampled' --launch-skip 12 --launch-count 3 \\
        --metrics ... python docs/bench/truncation_profile.py 4 top_k_50   # truncation_ncu_h200.log
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from stage2_warps import cases

from flashspec_export.kernels import verify_resample as vr

CALLS = 5


def main() -> None:
    rows, variant = int(sys.argv[1]), sys.argv[2]
    for _, n, args in cases([rows]):
        options = {
            "top_k_50": lambda: dict(top_k=torch.full((n,), 50, device="cuda")),
            "top_k_1024": lambda: dict(top_k=torch.full((n,), 1024, device="cuda")),
            "top_p_0.9": lambda: dict(top_p=torch.full((n,), 0.9, device="cuda")),
        }[variant]()
        for _ in range(CALLS):
            vr.verify_resample(*args, settle_only=True, **options)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
