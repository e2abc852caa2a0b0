"""The SM clock and board power while one op runs back to back for 3 s (a CUDA graph of 20
calls; nvidia-smi every 50 ms, the median of the last two thirds): the cuBLAS matmul and
VerifyResample at 128 and 512 rows, Llama-3-8B head, bf16, γ 3.

    python docs/bench/power_clocks.py
"""

from __future__ import annotations

import statistics
import subprocess
import threading
import time

import torch
from backend_kernels import random_head, verify_args  # beside this script

from flashspec_export import ops


def _sample(stop: threading.Event, out: list[tuple[float, float]]) -> None:
    query = ["nvidia-smi", "--query-gpu=clocks.sm,power.draw", "--format=csv,noheader,nounits"]
    while not stop.is_set():
        clock, power = subprocess.run(query, capture_output=True, text=True).stdout.split(",")
        out.append((float(clock), float(power)))
        time.sleep(0.05)


def _clock_and_power(fn) -> tuple[float, float]:
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(20):
            fn()
    torch.cuda.synchronize()
    time.sleep(1.0)
    stop, out = threading.Event(), []
    sampler = threading.Thread(target=_sample, args=(stop, out))
    sampler.start()
    start = time.time()
    while time.time() - start < 3.0:
        with torch.cuda.stream(stream):
            graph.replay()
        stream.synchronize()
    stop.set()
    sampler.join()
    late = out[len(out) // 3 :]
    return statistics.median(c for c, _ in late), statistics.median(p for _, p in late)


def main() -> None:
    shape, lm = random_head("llama3-8b")
    for rows in (128, 512):
        args = verify_args(shape, lm, rows)
        flat = args[0].view(rows, -1)
        fns = {
            "matmul": lambda flat=flat: flat @ lm.T,
            "verify": lambda args=args: ops.verify_resample(
                *args, backend="triton", check_values=False
            ),
        }
        for name, fn in fns.items():
            clock, power = _clock_and_power(fn)
            print(f"R={rows} {name}: SM clock {clock:.0f} MHz, power {power:.0f} W", flush=True)


if __name__ == "__main__":
    main()
