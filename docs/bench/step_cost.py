"""The exported target step's cost on onnxruntime (CPU) against the cache length: opset 24
(TensorScatter writing the bound cache in place, GQA Attention over the live window) against
the opset-18 fallback (ScatterElements into a copy, K / V expanded, attention over all slots).

The model: 4 Llama layers, hidden 1024, 16 query heads and 4 KV heads of 64 (random fp32
weights, 4096 positions), so that the cache, not the per-node overhead, can show.

python docs/bench/step_cost.py --json docs/bench/step_cost_cpu.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile
import time

import torch

from flashspec_export.config import TargetConfig
from flashspec_export.export import manifest
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime import sessions


def time_step(directory: pathlib.Path, position: int, tokens: int, repeats: int) -> float:
    """Fastest ms of one target step over ``tokens`` tokens at ``position`` (the minimum is the
    least disturbed by other work on a shared 2-core machine)."""
    target, _ = sessions.from_export(directory, manifest.read(directory))
    k, v = target.new_cache(), target.new_cache()
    n = target.batch
    args = (
        torch.zeros(n, tokens, dtype=torch.int64),
        torch.full((n,), position, dtype=torch.int64),
    )
    times = []
    for _ in range(repeats + 3):
        start = time.perf_counter()
        out = target.step(*args, k, v, torch.ones(n), torch.zeros(n, dtype=torch.int64))
        times.append(time.perf_counter() - start)
        k, v = out[4], out[5]
    return min(times[3:]) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--max-lens", type=int, nargs="+", default=[512, 4096])
    parser.add_argument("--positions", type=int, nargs="+", default=[32, 400])
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    print("| opset | max_len | position | step ms (4 tokens, fastest) |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        target = pathlib.Path(tmp) / "checkpoint"
        shape = TargetConfig("long-context", "llama", 4096, 1024, 1024, 4, 16, 4, 64, 4096)
        shape.build(seed=0).save_pretrained(target)
        for opset in (24, 18):
            for max_len in args.max_lens:
                out = pathlib.Path(tmp) / f"o{opset}-{max_len}"
                config = ExportConfig(
                    target=str(target),
                    draft="ngram",
                    out=str(out),
                    max_len=max_len,
                    dtype="float32",
                    opset=opset,
                )
                export(config)
                for position in args.positions:
                    ms = time_step(out, position, 4, args.repeats)
                    rows.append(dict(opset=opset, max_len=max_len, position=position, ms=ms))
                    print(f"| {opset} | {max_len} | {position} | {ms:.2f} |", flush=True)
    if args.json:
        pathlib.Path(args.json).write_text(
            json.dumps({"setup": vars(args), "rows": rows}, indent=1)
        )


if __name__ == "__main__":
    main()
