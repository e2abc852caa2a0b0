"""Where a truncated verify's time goes: each kernel's GPU time per call (eager calls under
``torch.profiler``, ``kernel_times.kernel_times``: the mean of 30 after 3 untimed; Llama-3-8B
head, bf16, logits of std 4, γ 3, ``settle_only``), for plain verify, verify with
log-probabilities, top-k 50 and 1024, top-p 0.9 and both:

    python docs/bench/truncation_breakdown.py 4 16 128 512    # truncation_breakdown_h200.log

Eager calls leave the GPU idle between launches, so it runs cooler and faster than under the
benchmarks' back-to-back CUDA graphs: compare kernels here, whole calls in ``stage2_widths.py``.
"""

from __future__ import annotations

import functools
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kernel_times import kernel_times
from stage2_warps import cases

from flashspec_export.kernels import verify_resample as vr


def main() -> None:
    for rows, n, args in cases([int(x) for x in sys.argv[1:]]):
        k = torch.full((n,), 50, device="cuda")
        p = torch.full((n,), 0.9, device="cuda")
        variants = {
            "verify": {},
            "verify_logprobs": dict(return_logprobs=True),
            "top_k_50": dict(top_k=k),
            "top_k_1024": dict(top_k=torch.full((n,), 1024, device="cuda")),
            "top_p_0.9": dict(top_p=p),
            "k50_p0.9": dict(top_k=k, top_p=p),
        }
        for name, options in variants.items():
            fn = functools.partial(vr.verify_resample, *args, settle_only=True, **options)
            times = {kernel: us for kernel, (_, us) in kernel_times(fn).items()}
            parts = "; ".join(
                f"{kernel} {us:.1f}" for kernel, us in sorted(times.items(), key=lambda t: -t[1])
                if us >= 2
            )  # fmt: skip
            print(f"R={rows} {name}: total {sum(times.values()):.1f} | {parts}", flush=True)


if __name__ == "__main__":
    main()
