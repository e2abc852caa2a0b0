"""The CUDA library's exact recompute of the rows stage 2 leaves unsettled (top-k / top-p), per
kernel: Llama-3-8B head (bf16), logits of std 4, T 1. Per case: the rows flagged, the sequences
whose tokens differ from the Triton backend's materialised recompute, the CUDA time per call of
each library kernel (torch.profiler over 5 calls) and the call's time beside plain verify (CUDA
events, median of 20).

    FLASHSPEC_KERNELS_LIB=plugins/build/libflashspec_kernels.so \
        python docs/bench/library_recompute.py --json library_recompute.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import re

import torch

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as kernel
from flashspec_export.ops import cuda

CASES = {  # name: (rows, truncation per sequence)
    "top_p_0.9 R=16": (16, dict(top_p=0.9)),
    "top_p_0.9 R=64": (64, dict(top_p=0.9)),
    "top_k_100000 R=16": (16, dict(top_k=100_000)),
    "top_k_50 R=512": (512, dict(top_k=50)),
    "top_p_0.9 R=512": (512, dict(top_p=0.9)),
}


def _median_us(fn, reps: int = 20) -> float:
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return sorted(times)[reps // 2]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    shape = HeadShape.from_name("llama3-8b")
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    cuda.prepare(lm.device)
    print({"device": torch.cuda.get_device_name()}, flush=True)
    report = {"device": torch.cuda.get_device_name(), "cases": {}}
    for name, (rows, truncation) in CASES.items():
        n = rows // 4
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = (4 * torch.randn(n, 4, shape.hidden_size, device="cuda", generator=g)).bfloat16()
        drafts = torch.randint(0, shape.vocab_size, (n, 3), device="cuda", generator=g)
        ones = torch.ones(n, device="cuda")
        call = (hidden, lm, drafts, ones, torch.arange(n, device="cuda") + 1,
                torch.arange(n, device="cuda") * 7, shape.vocab_size)  # fmt: skip
        kw = {
            k: torch.full((n,), v, device="cuda", dtype=torch.int64 if k == "top_k" else None)
            for k, v in truncation.items()
        }
        flags = torch.zeros(rows, dtype=torch.int32, device="cuda")
        lib = cuda.verify_resample(*call, unsettled=flags, **kw)
        jit = kernel.verify_resample(*call, **kw)
        differ = int((lib.tokens != jit.tokens).any(dim=1).sum())
        plain_us = _median_us(lambda: cuda.verify_resample(*call))  # noqa: B023
        call_us = _median_us(lambda: cuda.verify_resample(*call, **kw))  # noqa: B023
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                cuda.verify_resample(*call, **kw)
            torch.cuda.synchronize()
        per_kernel = {  # "void flashspec::(anonymous namespace)::exactKernel(...)": exactKernel
            (re.findall(r"(\w+)[<(]", e.key) or [e.key])[0]: round(e.device_time_total / 5, 1)
            for e in prof.key_averages()
            if e.device_time_total > 0
        }
        row = {
            "flagged_rows": int(flags.sum()),
            "rows": rows,
            "sequences_differing_from_triton": differ,
            "plain_verify_us": round(plain_us, 1),
            "call_us": round(call_us, 1),
            "x_plain": round(call_us / plain_us, 2),
            "kernel_us_per_call": per_kernel,
        }
        report["cases"][name] = row
        print(name, json.dumps(row), flush=True)
    if args.json:
        args.json.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
