"""VerifyResample's Hopper kernel on its 128 x 128 tile with a ring of 4 slots (32 KB each) against
5 (the 64 KB accumulator hand-over and 5 slots fill the 227 KB of shared memory), in one process
(``scripts/kernel_bench.time_graphs``: CUDA graphs, settled, interleaved), beside the cuBLAS
matmul. Whole ``verify_resample`` calls: plain, with log-probabilities, a random half-vocabulary
mask, top-k 50 and top-p 0.9 (``settle_only``); bf16, logits of std 4, γ 3. Each call's outputs
must be the same bit for bit with both rings.

    python docs/bench/ring_depth_ab.py --heads llama3-8b qwen3-8b gemma3-12b --rows 128 256 384 512
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels import tiles
from flashspec_export.kernels import verify_resample as vr
from flashspec_export.kernels.hopper_tiles import HopperConfig

CONFIGS = {
    "ring4": HopperConfig(stages=4),
    "ring5": HopperConfig(stages=5),
}


def with_config(config: HopperConfig, fn):
    """``fn`` with VerifyResample's Hopper rows from 65 rows on taking ``config`` (meant for the
    row counts where the table takes the 128-row tile: 65-128, 193-256, 321-384, 449 on)."""
    shipped = tiles.hopper_row

    def row(op, rows):
        if op == "verify_resample" and rows > 64:
            return config
        return shipped(op, rows)

    def call():
        tiles.hopper_row = row
        try:
            return fn()
        finally:
            tiles.hopper_row = shipped

    return call


def tensors(out) -> list[torch.Tensor]:
    """The tensors of a call's (nested) result."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for part in (out or ()) for t in tensors(part)]


def cases(head_name: str, row_counts):
    """Per row count ``(rows, n, vocab_size, args)``: ``verify_resample``'s positional arguments
    on the ``head_name`` head (bf16, hidden states of std 4, so logits of std 4), n = rows / 4
    sequences of γ 3."""
    head = HeadShape.from_name(head_name)
    torch.manual_seed(0)
    lm = torch.randn(head.padded_vocab, head.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= head.hidden_size**-0.5
    for rows in row_counts:
        n = rows // 4
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = 4 * torch.randn(n, 4, head.hidden_size, device="cuda", generator=g)
        drafts = torch.randint(0, head.vocab_size, (n, 3), device="cuda", generator=g)
        yield rows, n, head.vocab_size, (
            hidden.to(torch.bfloat16), lm, drafts, torch.ones(n, device="cuda"),
            torch.arange(n, device="cuda") + 1, torch.arange(n, device="cuda") * 7,
            head.vocab_size,
        )  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b", "qwen3-8b"])
    parser.add_argument("--rows", nargs="+", type=int, default=[128, 256, 512])
    parser.add_argument("--calls", nargs="+", default=["verify", "logprobs", "mask", "top_k_50",
                                                        "top_p_0.9"])  # fmt: skip
    args = parser.parse_args()
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for head in args.heads:
        for rows, n, vocab_size, call_args in cases(head, args.rows):
            g = torch.Generator(device="cuda").manual_seed(2)
            words = -(-vocab_size // 32)
            bits = torch.randint(-(2**31), 2**31, (n, 4, words), device="cuda", generator=g)
            k = torch.full((n,), 50, device="cuda")
            p = torch.full((n,), 0.9, device="cuda")
            calls = {
                "verify": functools.partial(vr.verify_resample, *call_args),
                "logprobs": functools.partial(vr.verify_resample, *call_args, return_logprobs=True),
                "mask": functools.partial(
                    vr.verify_resample, *call_args, allowed_tokens=bits.to(torch.int32)
                ),
                "top_k_50": functools.partial(
                    vr.verify_resample, *call_args, settle_only=True, top_k=k
                ),
                "top_p_0.9": functools.partial(
                    vr.verify_resample, *call_args, settle_only=True, top_p=p
                ),
            }
            calls = {name: calls[name] for name in args.calls}
            for name, fn in calls.items():  # the same outputs with both rings
                outs = [tensors(with_config(c, fn)()) for c in CONFIGS.values()]
                if len(outs[0]) < 2 or not all(map(torch.equal, *outs)):
                    raise SystemExit(f"{head} R={rows} {name}: the outputs differ")
            hidden2d = call_args[0].reshape(rows, -1)
            fns = {"matmul": functools.partial(torch.matmul, hidden2d, call_args[1].T)}
            for name, fn in calls.items():
                for tag, config in CONFIGS.items():
                    fns[f"{name}/{tag}"] = with_config(config, fn)
            times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
            mm = times["matmul"]
            cells = "; ".join(
                f"{name} " + " ".join(f"{tag} {times[f'{name}/{tag}'] / mm:.3f}" for tag in CONFIGS)
                for name in calls
            )
            print(f"{head} R={rows} matmul {mm:.1f} µs, x matmul: {cells}", flush=True)


if __name__ == "__main__":
    main()
