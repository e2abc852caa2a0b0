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
    name, value = {"top_k_50": ("top_k", 50), "top_k_1024": ("top_k", 1024),
                   "top_p_0.9": ("top_p", 0.9)}[variant]  # fmt: skip
    for _, n, args in cases([rows]):
        options = {name: torch.full((n,), value, device="cuda")}
        for _ in range(CALLS):
            vr.verify_resample(*args, settle_only=True, **options)
        torch.cuda.synchronize()


if __name__ == "__main__":
    main()
