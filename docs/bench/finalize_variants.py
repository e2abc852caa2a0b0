"""VerifyResample's stage 2 alone at the Hopper path's split counts (BLOCK_V 128: Llama-3 1002,
Qwen3 1187, Gemma-3 2048 splits), γ 3, CUDA graphs: the shipped one-shot finalize (the whole
[BLOCK_R, BLOCK_S] block in one program) against one that walks the splits in chunks, each at
several warp counts; and whether every variant emits the shipped tokens.

    python docs/bench/finalize_variants.py   # docs/bench/finalize_variants_{h100,h200}.log
"""

import statistics
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, "scripts")
from kernel_bench import time_graph

from flashspec_export.kernels import verify_resample as kernel
from flashspec_export.kernels.verify_resample import F_BEST_SCORE


@triton.jit
def chunked_finalize(ws_float_ptr, ws_index_ptr, draft_ptr, tokens_ptr, num_emitted_ptr,
                     num_rows, gamma, num_splits, stride_dn,
                     BLOCK_R: tl.constexpr, BLOCK_S: tl.constexpr):  # fmt: skip
    n = tl.program_id(0)
    i = tl.arange(0, BLOCK_R)
    row_ok = i <= gamma
    plane = num_rows * num_splits
    row_off = (n * (gamma + 1) + i) * num_splits
    best = tl.full([BLOCK_R], float("-inf"), tl.float32)
    y = tl.zeros([BLOCK_R], tl.int32)
    for s0 in range(0, num_splits, BLOCK_S):
        split = s0 + tl.arange(0, BLOCK_S)
        mask = row_ok[:, None] & (split[None, :] < num_splits)
        off = row_off[:, None] + split[None, :]
        score = tl.load(ws_float_ptr + F_BEST_SCORE * plane + off, mask=mask, other=float("-inf"))
        index = tl.load(ws_index_ptr + off, mask=mask, other=0)
        chunk_best, at = tl.max(score, 1, return_indices=True, return_indices_tie_break_left=True)
        chunk_y = tl.sum(tl.where(split[None, :] == (s0 + at)[:, None], index, 0), 1)
        take = (chunk_best > best) | (s0 == 0)  # ties: the earlier chunk
        best = tl.where(take, chunk_best, best)
        y = tl.where(take, chunk_y, y)
    has_draft = i < gamma
    draft = tl.load(draft_ptr + n * stride_dn + i, mask=has_draft, other=-1)
    accept = has_draft & (draft == y)
    k = tl.min(tl.where(accept, BLOCK_R, i), 0)
    tl.store(tokens_ptr + n * (gamma + 1) + i, tl.where(i <= k, y.to(tl.int64), -1), mask=row_ok)
    tl.store(num_emitted_ptr + n, (k + 1).to(tl.int64))


def case(splits: int, rows: int, gamma: int = 3) -> str:
    """One line: each variant's median µs at ``splits`` x ``rows``, and whether tokens agree."""
    n = rows // (gamma + 1)
    torch.manual_seed(rows + splits)
    floats = torch.randn(4, rows, splits, device="cuda")
    floats[0, :, ::7] = floats[0, :, ::7].round()  # some ties
    index = torch.randint(0, 1 << 20, (rows, splits), device="cuda", dtype=torch.int32)
    y_all = index.gather(1, floats[0].argmax(1)[:, None]).view(n, gamma + 1)
    drafts = y_all[:, :gamma].clone().long()
    drafts[::3, 1] += 1  # some rejections
    tokens = torch.empty(n, gamma + 1, dtype=torch.int64, device="cuda")
    emitted = torch.empty(n, dtype=torch.int64, device="cuda")

    def shipped(num_warps, block_r=8):
        kernel._verify_finalize_kernel[(n,)](
            floats, index, drafts, tokens, emitted, tokens, rows, gamma, splits,
            drafts.stride(0), 1, RETURN_LOGPROBS=False, LIBDEVICE=True,
            BLOCK_R=block_r, BLOCK_S=triton.next_power_of_2(splits), num_warps=num_warps,
        )  # fmt: skip

    def chunked(num_warps, block_s):
        chunked_finalize[(n,)](
            floats, index, drafts, tokens, emitted, rows, gamma, splits, drafts.stride(0),
            BLOCK_R=4, BLOCK_S=block_s, num_warps=num_warps,
        )  # fmt: skip

    variants = {"shipped r8 w4": lambda: shipped(4), "shipped r4 w4": lambda: shipped(4, 4)}
    for w in (8, 16):
        variants[f"shipped r4 w{w}"] = lambda w=w: shipped(w, 4)
    for block_s in (256, 512):
        for w in (4, 8):
            variants[f"chunked s{block_s} w{w}"] = lambda w=w, b=block_s: chunked(w, b)
    outs, cells = {}, []
    for name, fn in variants.items():
        tokens.fill_(-7)
        fn()
        torch.cuda.synchronize()
        outs[name] = (tokens.clone(), emitted.clone())
        cells.append(f"{name} {statistics.median(time_graph(fn, 20)):.1f}")
    ref = outs["shipped r8 w4"]
    same = all(torch.equal(a, ref[0]) and torch.equal(b, ref[1]) for a, b in outs.values())
    right = torch.equal(ref[0][:, 0], y_all[:, 0].long())
    return f"splits={splits} R={rows}: " + " | ".join(cells) + f" | equal {same}, y0 {right}"


def main() -> None:
    print(torch.cuda.get_device_name())
    for splits in (1002, 1187, 2048):
        for rows in (128, 256, 512):
            print(case(splits, rows), flush=True)


if __name__ == "__main__":
    main()
