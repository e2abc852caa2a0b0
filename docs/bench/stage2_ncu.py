"""Stage 2 of the hand-in (``_truncated_summaries_kernel``) at 16 rows for a profiler: two
top-k 50 calls, then two top-p 0.9 calls (Llama-3-8B head, bf16, logits of std 4, γ 3).

    ncu --clock-control none --set full -k regex:_truncated_summaries -c 4 \\
        python3 docs/bench/stage2_ncu.py
"""

from __future__ import annotations

import torch

from flashspec_export.config import HeadShape
from flashspec_export.kernels import verify_resample as kernel

shape = HeadShape.from_name("llama3-8b")
torch.manual_seed(0)
lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
lm *= shape.hidden_size**-0.5
rows, n = 16, 4
hidden = (4 * torch.randn(n, rows // n, shape.hidden_size, device="cuda")).to(torch.bfloat16)
drafts = torch.randint(0, shape.vocab_size, (n, rows // n - 1), device="cuda")
args = (hidden, lm, drafts, torch.ones(n, device="cuda"), torch.arange(n, device="cuda") + 1,
        torch.arange(n, device="cuda") * 7, shape.vocab_size)  # fmt: skip
for truncate in (dict(top_k=50), dict(top_p=0.9)):
    kwargs = {name: torch.full((n,), value, device="cuda") for name, value in truncate.items()}
    for _ in range(2):
        kernel.verify_resample(*args, settle_only=True, **kwargs)
torch.cuda.synchronize()
