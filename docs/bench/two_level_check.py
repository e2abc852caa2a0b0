"""The two-level sample on a GPU: the tokens of the Hopper kernel, the portable kernel and the
reference (torch on the GPU) compared on bf16 cases at 18-512 rows (sequences whose tokens
differ), then verify's full-op time beside the cuBLAS matmul and the two-pass baseline.

    python docs/bench/two_level_check.py two_level_check_h200.json
"""

import functools
import json
import statistics
import sys

import torch

sys.path.insert(0, "scripts")
sys.path.insert(0, ".")
from kernel_bench import time_graphs
from two_pass_sampler import two_pass_verify

from flashspec_export import ops
from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiles import choose_config
from flashspec_export.kernels.verify_resample import verify_resample
from tests.parity.test_llm_shapes_gpu import _case

out = {}
print(torch.cuda.get_device_name(), flush=True)
for head in ("llama3-8b", "gemma3-12b"):
    shape = HeadShape.from_name(head)
    for rows in (18, 32, 64, 128, 160, 256, 512):
        n = rows // 2 if rows % 4 else rows // 4
        gamma = 1 if rows % 4 else 3
        case = _case(shape, n=n, gamma=gamma, dtype=torch.bfloat16, seed=rows)
        args = (
            "verify_resample",
            rows,
            shape.hidden_size,
            shape.vocab_size,
            torch.bfloat16,
            torch.device("cuda"),
        )
        fast, portable = choose_config(*args), choose_config(*args, hopper=False)
        res = {}
        for lp in (False, True):
            a = verify_resample(*case, return_logprobs=lp, config=fast)
            b = verify_resample(*case, return_logprobs=lp, config=portable)
            r = ops.verify_resample(*case, return_logprobs=lp, backend="reference")
            res[lp] = (
                int((a.tokens != b.tokens).any(1).sum()),
                int((a.tokens != r[0]).any(1).sum()),
                int((b.tokens != r[0]).any(1).sum()),
            )
        print(
            f"{head} R={rows} hopper={fast.hopper is not None} seqs={n}: differing sequences "
            f"hopper/portable, hopper/reference, portable/reference: {res}, "
            f"max emitted {int(a.num_emitted.max())}",
            flush=True,
        )
for head in ("llama3-8b", "qwen3-8b", "gemma3-12b"):
    shape = HeadShape.from_name(head)
    lm = (
        torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda") * shape.hidden_size**-0.5
    ).to(torch.bfloat16)
    for rows in (1, 16, 64, 128, 256, 512):
        gamma = 3 if rows >= 4 else rows - 1
        n = max(rows // (gamma + 1), 1)
        hidden = torch.randn(n, gamma + 1, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
        t, seed = torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
        pos = torch.arange(n, device="cuda") * 31
        drafts = torch.zeros(n, gamma, dtype=torch.int64, device="cuda")
        fns = {
            "verify": functools.partial(
                verify_resample, hidden, lm, drafts, t, seed, pos, shape.vocab_size
            ),
            "matmul": functools.partial(torch.matmul, hidden.view(-1, shape.hidden_size), lm.T),
            "two_pass": functools.partial(two_pass_verify, hidden, lm, drafts, t, shape.vocab_size),
        }
        med = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        mm = med["matmul"]
        out[f"{head}/{rows}"] = med
        print(
            f"{head:11} R={rows:<4} matmul {mm:7.1f} verify {med['verify']:7.1f} "
            f"({med['verify'] / mm:.3f}) two_pass {med['two_pass']:7.1f} "
            f"({med['two_pass'] / mm:.3f}) two_pass/verify {med['two_pass'] / med['verify']:.3f}",
            flush=True,
        )
with open(sys.argv[1], "w") as f:
    json.dump(out, f, indent=1)
