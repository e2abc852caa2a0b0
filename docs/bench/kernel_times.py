"""Per-kernel GPU times of the Triton backend and the CUDA library (its compiled-in Triton
kernels), eager calls under ``torch.profiler`` (Llama-3 / Qwen3 heads, bf16, T = 1):

    python docs/bench/kernel_times.py 256 512   # docs/bench/kernel_times_{h100,h200}.log

One line per (head, rows, op, backend): each kernel's name, launches per call and mean µs over
30 calls (after 3 untimed), so that the two backends' stage-1 and finalize kernels compare
directly, outside the sweep's CUDA graphs.
"""

import collections
import functools
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, "docs/bench")
from small_rows_verify import operands

from flashspec_export import ops

HEADS = ("llama3-8b", "qwen3-8b")
CALLS = 30


def kernel_times(fn) -> dict[str, tuple[int, float]]:
    """{kernel name: (launches per call, mean µs per call)} over ``CALLS`` calls of ``fn``."""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(CALLS):
            fn()
        torch.cuda.synchronize()
    times = collections.defaultdict(list)
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            times[event.name[:60]].append(event.device_time)
    return {name: (len(t) // CALLS, sum(t) / CALLS) for name, t in times.items()}


def calls(head: str, rows: int) -> dict:
    """{"argmax triton" ...: a call} at ``rows`` on ``head``, both ops on both backends."""
    args, flat, lm_head = operands(head, rows)
    vocab = args[-1]
    out = {}
    for backend in ("triton", "cuda"):
        out[f"argmax {backend}"] = functools.partial(
            ops.tiled_argmax, flat, lm_head, vocab, backend=backend, check_values=False
        )
    for backend in ("triton", "cuda"):
        out[f"verify {backend}"] = functools.partial(
            ops.verify_resample, *args, backend=backend, check_values=False
        )
    return out


def main(rows_list: list[int]) -> None:
    for head in HEADS:
        for rows in rows_list:
            for name, fn in calls(head, rows).items():
                times = sorted(kernel_times(fn).items(), key=lambda item: -item[1][1])
                cells = "; ".join(f"{k} x{n} {us:.1f}" for k, (n, us) in times)
                print(f"{head} R={rows} {name}: {cells}", flush=True)


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1:]] or [256, 512])
