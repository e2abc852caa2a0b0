"""Stage 2 (``verify_resample._truncated_summaries_kernel``) and the hand-in threshold
(``_hand_in_threshold_kernel``) at this checkout against an earlier ``kernels/verify_resample.py``,
in one process: whole top-k 50, top-k 1024, top-p 0.9 and top-k 50 + top-p 0.9 calls
(``settle_only``; CUDA graphs, settled, interleaved: ``scripts/kernel_bench.time_graphs``) beside
plain verify, and the two kernels' own GPU time (eager, ``kernel_times``). Llama-3-8B head, bf16,
logits of std 4, γ 3 (``stage2_warps.cases``).

    git show d5e7120:kernels/verify_resample.py > /tmp/verify_resample_before.py
    python docs/bench/stage2_ab.py /tmp/verify_resample_before.py 1 16 128 160 512
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kernel_bench import time_graphs
from kernel_times import kernel_times
from stage2_warps import cases

from flashspec_export.kernels import verify_resample as vr

KERNELS = {"stage 2": "_truncated_summaries_kernel", "threshold": "_hand_in_threshold_kernel"}


def _module(path: str):
    spec = importlib.util.spec_from_file_location("verify_resample_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main() -> None:
    before = _module(sys.argv[1])
    for rows, n, args in cases([int(x) for x in sys.argv[2:]]):
        k = torch.full((n,), 50, device="cuda")
        p = torch.full((n,), 0.9, device="cuda")
        truncations = {
            "top_k_50": dict(top_k=k),
            "top_k_1024": dict(top_k=torch.full((n,), 1024, device="cuda")),
            "top_p_0.9": dict(top_p=p),
            "k50_p0.9": dict(top_k=k, top_p=p),
        }
        fns = {"verify": functools.partial(vr.verify_resample, *args)}
        for name, options in truncations.items():
            fns[f"{name}/before"] = functools.partial(
                before.verify_resample, *args, settle_only=True, **options
            )
            fns[f"{name}/now"] = functools.partial(
                vr.verify_resample, *args, settle_only=True, **options
            )
        own = {}
        for name, fn in fns.items():
            if name != "verify":
                times = kernel_times(fn)
                own[name] = ", ".join(
                    f"{label} {sum(us for kernel, (_, us) in times.items() if ker in kernel):.1f}"
                    for label, ker in KERNELS.items()
                )
        times = {name: statistics.median(v) for name, v in time_graphs(fns, 20, 200).items()}
        plain = times["verify"]
        print(f"R={rows}: verify {plain:.1f} µs", flush=True)
        for name in truncations:
            print(
                f"R={rows} {name}: "
                + " ".join(
                    f"{tag} {times[f'{name}/{tag}']:.1f} ({times[f'{name}/{tag}'] / plain:.3f}x;"
                    f" {own[f'{name}/{tag}']})"
                    for tag in ("before", "now")
                ),
                flush=True,
            )


if __name__ == "__main__":
    main()
