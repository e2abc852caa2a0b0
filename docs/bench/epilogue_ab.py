"""The Hopper epilogue at this checkout against an earlier ``kernels/hopper_tiles.py``, in one
process (``scripts/kernel_bench.time_graphs``: CUDA graphs, settled, interleaved): whole
``verify_resample`` calls, plain, with log-probabilities, with a random half-vocabulary mask, and
top-k 50 / top-p 0.9 (``settle_only``), each with both kernels, beside the cuBLAS matmul (Llama-3-8B
head, bf16, logits of std 4, γ 3; ``stage2_warps.cases``).

    git show 2010fdd:kernels/hopper_tiles.py > /tmp/hopper_tiles_before.py
    python docs/bench/epilogue_ab.py /tmp/hopper_tiles_before.py 512 128 256   # epilogue_ab_*.log
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
from stage2_warps import cases

from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels import verify_resample as vr


def load_before(path: str):
    """An earlier ``kernels/hopper_tiles.py`` at ``path`` as a module of its own."""
    spec = importlib.util.spec_from_file_location("hopper_tiles_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_hopper(module, fn):
    """``fn`` with ``verify_resample`` launching ``module``'s Hopper kernel."""

    def call():
        saved, vr.hopper_tiles = vr.hopper_tiles, module
        try:
            return fn()
        finally:
            vr.hopper_tiles = saved

    return call


def main() -> None:
    before = load_before(sys.argv[1])
    for rows, n, args in cases([int(x) for x in sys.argv[2:]]):
        g = torch.Generator(device="cuda").manual_seed(1)
        words = -(-args[-1] // 32)
        bits = torch.randint(-(2**31), 2**31, (n, rows // n, words), device="cuda", generator=g)
        allowed = bits.to(torch.int32)
        k = torch.full((n,), 50, device="cuda")
        p = torch.full((n,), 0.9, device="cuda")
        calls = {
            "verify": functools.partial(vr.verify_resample, *args),
            "logprobs": functools.partial(vr.verify_resample, *args, return_logprobs=True),
            "mask": functools.partial(vr.verify_resample, *args, allowed_tokens=allowed),
            "top_k_50": functools.partial(vr.verify_resample, *args, settle_only=True, top_k=k),
            "top_p_0.9": functools.partial(vr.verify_resample, *args, settle_only=True, top_p=p),
        }
        hidden2d = args[0].reshape(-1, args[0].shape[-1])
        fns = {"matmul": functools.partial(torch.matmul, hidden2d, args[1].T)}
        for name, fn in calls.items():
            fns[f"{name}/before"] = with_hopper(before, fn)
            fns[f"{name}/now"] = with_hopper(hopper_tiles, fn)
        times = {name: statistics.median(v) for name, v in time_graphs(fns, 20, 200).items()}
        for tag in ("before", "now"):
            plain = times[f"verify/{tag}"]
            ratios = " ".join(f"{name} {times[f'{name}/{tag}'] / plain:.3f}" for name in calls)
            print(
                f"R={rows} {tag}: verify {plain:.1f} µs, {plain / times['matmul']:.3f}x matmul "
                f"({times['matmul']:.1f}); x verify: {ratios}",
                flush=True,
            )
        print(f"R={rows} now/before: " + " ".join(
            f"{name} {times[f'{name}/now'] / times[f'{name}/before']:.3f}" for name in calls
        ), flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
