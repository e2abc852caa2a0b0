"""Where a decode step's GPU time goes: the kernels of one step of the device loop (fused layers,
one CUDA graph per step), by name, from the CUDA profiler over 20 replays of the step graph.

Per step: kernel count, the kernels' summed time, and the step's span (first kernel start to last
kernel end); the gap between the two is the GPU idle between kernels inside the graph. Random
bf16 weights, an MTP drafter, batch 1, γ 3, T = 1 (flashspec ops), after a 64-token generation.

python docs/bench/step_kernels.py --models llama3.2-1b-shape --json steps.json
"""

from __future__ import annotations

import argparse
import collections
import json

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

from flashspec_export.config import TargetConfig
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.runtime.device_loop import DeviceLoop


def census(name: str, gamma: int, replays: int = 20) -> dict:
    preset = TargetConfig.from_name(name)
    model = preset.build(seed=0, device="cuda", dtype=torch.bfloat16)
    with torch.device("cuda"):
        drafter = MtpDrafter(model, seed=1).to(torch.bfloat16).eval()
    loop = DeviceLoop(model, drafter if gamma else None, 1, 96, gamma)
    prompt = torch.randint(0, preset.vocab_size, (1, 16), generator=torch.Generator())
    loop.generate(prompt, 64, torch.ones(1), torch.zeros(1, dtype=torch.int64))
    (step,) = loop._graphs
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(replays):
            step.replay()
            torch.cuda.synchronize()
    kernels = sorted(
        (e.time_range.start, e.time_range.end, e.name)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    per_name = collections.defaultdict(lambda: [0, 0.0])
    for start, end, kernel in kernels:
        per_name[kernel][0] += 1
        per_name[kernel][1] += end - start
    # steps are separated by the host's synchronize: split at the `replays - 1` largest gaps
    gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i][0] - kernels[i - 1][1])
    cuts = sorted(gaps[len(gaps) - (replays - 1) :])
    spans = [
        max(end for _, end, _ in kernels[lo:hi]) - kernels[lo][0]
        for lo, hi in zip([0, *cuts], [*cuts, len(kernels)], strict=True)
    ]
    busy = sum(end - start for start, end, _ in kernels)
    top = sorted(per_name.items(), key=lambda item: -item[1][1])[:25]
    return dict(
        model=name,
        gamma=gamma,
        kernels_per_step=len(kernels) / replays,
        kernel_us_per_step=busy / replays,
        span_us_per_step=sum(spans) / replays,
        top=[dict(name=k[:90], per_step=c / replays, us_per_step=t / replays) for k, (c, t) in top],
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--models", nargs="+", default=["llama3.2-1b-shape"])
    parser.add_argument("--gammas", nargs="+", type=int, default=[0, 3])
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    for name in args.models:
        for gamma in args.gammas:
            row = census(name, gamma)
            rows.append(row)
            print(
                f"{name} γ={gamma}: {row['kernels_per_step']:.0f} kernels, "
                f"{row['kernel_us_per_step']:.0f} µs in kernels, span {row['span_us_per_step']:.0f}"
                " µs per step"
            )
            for k in row["top"]:
                print(f"  {k['us_per_step']:8.1f} µs  {k['per_step']:5.1f}×  {k['name']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=torch.cuda.get_device_name(), rows=rows), f, indent=1)


if __name__ == "__main__":
    main()
