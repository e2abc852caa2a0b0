"""What a truncating call costs with its recompute: the fused truncation's whole calls (no
``settle_only``: unsettled rows' sequences are verified again materialised, after a host read of
the flags) beside ``settle_only`` and plain verify, eager calls timed with CUDA events (the host
read keeps them out of a CUDA graph), mean of ``--calls`` calls on fresh hidden states each
(Llama-3-8B head, bf16, logits of std 4, γ 3): the time and the share of calls that recomputed.

    python docs/bench/truncation_whole_call.py --rows 16 128 512    # truncation_whole_call_h200.log

``--breakdown``: also each whole call's largest kernels (``kernel_times``: eager calls under
``torch.profiler``, µs a call), where the recompute's time goes.
"""

from __future__ import annotations

import argparse
import functools
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from kernel_times import kernel_times  # beside this script

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as vr

CALLS = {  # name: (top-k, top-p)
    "top_k_50": (50, None),
    "top_k_1024": (1024, None),
    "top_p_0.9": (None, 0.9),
    "top_p_0.95": (None, 0.95),
}


def timed(fn, inputs) -> float:
    """Mean µs of ``fn(*x)`` over ``inputs`` (after one untimed call on each)."""
    for x in inputs:
        fn(*x)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    for x in inputs:
        fn(*x)
    end.record()
    torch.cuda.synchronize()
    return 1000 * start.elapsed_time(end) / len(inputs)


def truncation_of(n: int, k: int | None, p: float | None) -> dict:
    """``verify_resample``'s top_k / top_p arguments for ``n`` sequences."""
    truncation = {}
    if k is not None:
        truncation["top_k"] = torch.full((n,), k, device="cuda")
    if p is not None:
        truncation["top_p"] = torch.full((n,), p, device="cuda")
    return truncation


def verify(lm, fixed, hidden, drafts, **options):
    """``verify_resample`` on ``hidden``, ``drafts`` and the head ``lm``; ``fixed``: the
    temperatures, seeds, positions and vocabulary size."""
    return vr.verify_resample(hidden, lm, drafts, *fixed, **options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[16, 128, 512])
    parser.add_argument("--calls", type=int, default=20)
    parser.add_argument("--breakdown", action="store_true")
    args = parser.parse_args()
    head = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm = torch.randn(head.padded_vocab, head.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= head.hidden_size**-0.5
    name = torch.cuda.get_device_name()
    print(f"# {name}; per row count: µs a call (× plain verify)", flush=True)
    for rows in args.rows:
        n = rows // 4
        g = torch.Generator(device="cuda").manual_seed(rows)
        inputs = [
            (
                (4 * torch.randn(n, 4, head.hidden_size, device="cuda", generator=g)).bfloat16(),
                torch.randint(0, head.vocab_size, (n, 3), device="cuda", generator=g),
            )
            for _ in range(args.calls)
        ]
        fixed = (torch.ones(n, device="cuda"), torch.arange(n, device="cuda") + 1,
                 torch.arange(n, device="cuda") * 7, head.vocab_size)  # fmt: skip

        call = functools.partial(verify, lm, fixed)

        plain = timed(call, inputs)
        cells = [f"verify {plain:.0f}"]
        for label, (k, p) in CALLS.items():
            truncation = truncation_of(n, k, p)
            settle = functools.partial(call, settle_only=True, **truncation)
            recomputing = sum(bool(settle(*x)[1].any()) for x in inputs)
            whole = timed(functools.partial(call, **truncation), inputs)
            only = timed(settle, inputs)
            cells.append(
                f"{label} {whole:.0f} ({whole / plain:.2f}), settle_only {only:.0f} "
                f"({only / plain:.2f}), {recomputing} of {len(inputs)} calls recompute"
            )
        print(f"R={rows}: " + "; ".join(cells), flush=True)
        if args.breakdown:
            for label, (k, p) in CALLS.items():
                truncation = truncation_of(n, k, p)
                times = kernel_times(functools.partial(call, *inputs[0], **truncation))
                top = sorted(times.items(), key=lambda t: -t[1][1])[:8]
                parts = "; ".join(f"{name} {us:.0f} ({count}x)" for name, (count, us) in top)
                print(f"  R={rows} {label}, one call's largest kernels: {parts}", flush=True)


if __name__ == "__main__":
    main()
