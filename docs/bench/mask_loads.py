"""An allowed-token mask at 64-512 rows: the Hopper epilogue of an earlier
``kernels/hopper_tiles.py`` against this checkout's, in one process (CUDA graphs, interleaved:
``scripts/kernel_bench.time_graphs``), × plain verify: a random half-vocabulary mask alone and with
top-k 50 (``settle_only``), and whether the two give the same tokens. bf16, logits of std 4, γ 3.

    git show 4ceab7f:kernels/hopper_tiles.py > /tmp/hopper_before.py
    python docs/bench/mask_loads.py /tmp/hopper_before.py llama3-8b,qwen3-8b 64 128 256 512
"""

from __future__ import annotations

import functools
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from epilogue_ab import load_before, with_hopper
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as vr
from flashspec_export.reference import truncation


def main() -> None:
    before = load_before(sys.argv[1])
    for name in sys.argv[2].split(","):
        head = HeadShape.from_name(name)
        torch.manual_seed(0)
        lm = torch.randn(head.padded_vocab, head.hidden_size, device="cuda", dtype=torch.bfloat16)
        lm *= head.hidden_size**-0.5
        for rows in [int(x) for x in sys.argv[3:]]:
            n = rows // 4
            hidden = (4 * torch.randn(n, 4, head.hidden_size, device="cuda")).to(torch.bfloat16)
            drafts = torch.randint(0, head.vocab_size, (n, 3), device="cuda")
            args = (hidden, lm, drafts, torch.ones(n, device="cuda"),
                    torch.arange(n, device="cuda") + 1, torch.arange(n, device="cuda") * 7,
                    head.vocab_size)  # fmt: skip
            allowed = truncation.pack_allowed(torch.rand(n, 4, head.vocab_size) < 0.5).cuda()
            mask = functools.partial(vr.verify_resample, *args, allowed_tokens=allowed)
            k50 = functools.partial(
                mask, settle_only=True, top_k=torch.full((n,), 50, device="cuda")
            )
            fns = {
                "verify": functools.partial(vr.verify_resample, *args),
                "mask/before": with_hopper(before, mask),
                "mask/now": mask,
                "mask_k50/before": with_hopper(before, k50),
                "mask_k50/now": k50,
            }
            a, b = with_hopper(before, mask)(), mask()
            same = torch.equal(a.tokens, b.tokens) and torch.equal(a.num_emitted, b.num_emitted)
            t = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 100).items()}
            cells = " ".join(f"{k} {v:.1f} ({v / t['verify']:.3f})" for k, v in t.items())
            print(f"{name} R={rows}: {cells} | tokens equal {same}", flush=True)


if __name__ == "__main__":
    main()
