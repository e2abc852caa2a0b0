"""The kernels each VerifyResample backend runs and their device time (torch.profiler, 20 calls
after 5 warm-up calls, no CUDA graph): the Triton backend against the CUDA library (built with
the head's (dtype, H) compiled in), 128 and 512 rows, random bf16 head, γ 3.

    FLASHSPEC_KERNELS_LIB=plugins/build/libflashspec_kernels.so \
        python docs/bench/backend_kernels.py [llama3-8b | qwen3-8b]
"""

from __future__ import annotations

import collections
import sys

import torch
from torch.profiler import ProfilerActivity, profile

from flashspec_export import ops
from flashspec_export.config import HeadShape


def random_head(name: str) -> tuple[HeadShape, torch.Tensor]:
    """The head's shape and a random bf16 LM head of it (unit-scale logits for unit rows)."""
    shape = HeadShape.from_name(name)
    torch.manual_seed(0)
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    return shape, lm * shape.hidden_size**-0.5


def verify_args(shape: HeadShape, lm: torch.Tensor, rows: int) -> tuple:
    """``ops.verify_resample``'s positional arguments for ``rows`` rows at γ 3, T 1."""
    n = rows // 4
    hidden = torch.randn(n, 4, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    drafts = torch.randint(0, shape.vocab_size, (n, 3), device="cuda")
    temperature, seed = torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    return hidden, lm, drafts, temperature, seed, positions, shape.vocab_size


def main() -> None:
    shape, lm = random_head(sys.argv[1] if len(sys.argv) > 1 else "llama3-8b")
    for rows in (128, 512):
        args = verify_args(shape, lm, rows)
        for backend in ("triton", "cuda"):
            for _ in range(5):
                ops.verify_resample(*args, backend=backend, check_values=False)
            torch.cuda.synchronize()
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(20):
                    ops.verify_resample(*args, backend=backend, check_values=False)
                torch.cuda.synchronize()
            times = collections.defaultdict(list)
            for event in prof.events():
                if event.device_type == torch.autograd.DeviceType.CUDA:
                    times[event.name].append(event.device_time)
            total = sum(sum(v) for v in times.values()) / 20
            print(f"R={rows} {backend}: {total:.1f} us per call")
            for name, v in sorted(times.items(), key=lambda kv: -sum(kv[1])):
                print(f"   {len(v):4d} x {sum(v) / len(v):8.1f} us  {name[:110]}")


if __name__ == "__main__":
    main()
