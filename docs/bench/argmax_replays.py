"""What a graph replay of each argmax provider runs: the graphs of ``scripts/bench_kernels.py``
(the given providers, 20 ms of back-to-back calls each, on one side stream), then per round
each graph settled, timed with CUDA events, and replayed once under ``torch.profiler``: per
kernel name the count and duration quantiles, and the gaps between consecutive kernels.

    FLASHSPEC_KERNELS_LIB=$PWD/plugins/build/libflashspec_kernels.so \
    python docs/bench/argmax_replays.py qwen3-8b 16 verify_resample,verify_resample[cuda],\
    tiled_argmax,tiled_argmax[cuda],matmul,materialised_torch_rng,onepass_torch_rng

(the providers as one comma-separated argument).

Log: docs/bench/argmax_replays_h200.log.
"""

from __future__ import annotations

import itertools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import BenchConfig, _capture, _providers, _replay_ms

from flashspec_export.config import HeadShape

REP_MS = 20
SETTLE_REPLAYS = 10
ROUNDS = 3


def _profile(graph: torch.cuda.CUDAGraph) -> list:
    """The CUDA kernel events of one replay, in start order."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        graph.replay()
        torch.cuda.synchronize()
    kernels = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(kernels, key=lambda e: e.time_range.start)


def main(head: str, rows: int, names: list[str]) -> None:
    shape = HeadShape.from_name(head)
    lm_head = torch.randn(
        shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16
    )
    fns, _ = _providers(shape, rows, BenchConfig(heads=(head,), rows=(rows,)), lm_head)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graphs = {}
    with torch.cuda.stream(stream):
        for name in names:
            fns[name]()
            calls = max(1, int(REP_MS / _replay_ms(_capture(fns[name], 1, stream), stream)))
            graphs[name] = _capture(fns[name], calls, stream), calls
            _replay_ms(graphs[name][0], stream)
        for round_ in range(ROUNDS):
            for name, (graph, calls) in graphs.items():
                for _ in range(SETTLE_REPLAYS):
                    graph.replay()
                if "argmax" not in name:
                    continue
                per_call = 1e3 * _replay_ms(graph, stream) / calls
                kernels = _profile(graph)
                gaps = [
                    b.time_range.start - a.time_range.end for a, b in itertools.pairwise(kernels)
                ]
                span = (kernels[-1].time_range.end - kernels[0].time_range.start) / calls
                print(
                    f"round {round_} {name:20} timed {per_call:7.1f} us/call; profiled span "
                    f"{span:7.1f}; gaps med {statistics.median(gaps):.2f} max {max(gaps):.1f}",
                    flush=True,
                )
                durations = {}
                for kernel in kernels:
                    durations.setdefault(kernel.name[:40], []).append(
                        kernel.time_range.elapsed_us()
                    )
                for kernel, us in durations.items():
                    us.sort()
                    print(
                        f"    {kernel:40} n={len(us)} med {statistics.median(us):7.1f} "
                        f"p10 {us[len(us) // 10]:7.1f} p90 {us[9 * len(us) // 10]:7.1f} "
                        f"max {us[-1]:7.1f}"
                    )


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), sys.argv[3].split(","))
