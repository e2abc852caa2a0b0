"""The CUDA library's truncation (``plugins/verifyResample/truncation.cuh``): top-k, top-p and
allowed-token masks in the native kernels — the mask read in the tile pass, top-k / top-p settled
from per-split candidates in a second stage, and the rows the candidates do not settle recomputed
exactly — against the reference, token for token (the laws: ``tests/reference/
test_truncation.py``). Each case says which path its rows take (the library reports the rows it
recomputed) and checks it was taken.

fp32 tokens are bit-equal to the reference's; log-probabilities agree to summation order. The
mass before a token is summed in another order than the reference's cumulative sum, so a p within
rounding of a token's mass-before could keep one token more or less: the random cases' p are far
from any (measured by ``_margin``), the golden ones are exact (dyadic masses).
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.ops import cuda
from flashspec_export.reference import truncation

pytestmark = [pytest.mark.gpu, pytest.mark.cuda_kernels]

N, GAMMA, H, V = 6, 3, 32, 1000
TOP_K = [5, 0, 3, 10, 1, 7]
TOP_P = [0.5, 0.9, 1.0, 0.2, 0.99, 0.7]


def _inputs(seed=0, n=N, gamma=GAMMA, hidden_size=H, vocab=V, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, gamma + 1, hidden_size, generator=g) * scale
    lm_head = torch.randn(vocab, hidden_size, generator=g)
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5])[torch.arange(n) % 6]  # a greedy row
    seeds = torch.arange(n) + 3
    positions = torch.randint(0, 500, (n,), generator=g)
    allowed = torch.randint(
        -(2**31), 2**31 - 1, (n, gamma + 1, truncation.words_for(vocab)), generator=g,
        dtype=torch.int32,
    )  # fmt: skip
    tensors = (hidden.to(dtype), lm_head.to(dtype), temperature, seeds, positions, allowed)
    return tuple(t.cuda() for t in tensors)


def _alone_drafts(hidden, lm_head, temperature, seed, positions, **truncate):
    """Each position's own sample (γ = 0, the reference), as drafts: every draft is accepted, so
    every row's sample is compared."""
    n, rows = hidden.shape[:2]
    drafts = []
    for i in range(rows - 1):
        row = {k: (v[:, i : i + 1] if k == "allowed_tokens" else v) for k, v in truncate.items()}
        empty = torch.zeros(n, 0, dtype=torch.int64, device="cuda")
        alone = ops.verify_resample(
            hidden[:, i : i + 1], lm_head, empty, temperature, seed, positions + i, **row
        )
        drafts.append(alone[0][:, 0])
    return torch.stack(drafts, dim=1)


def _margin(hidden, lm_head, temperature, vocab, top_k=None, top_p=None, allowed_tokens=None):
    """The smallest |mass before a token - p| over the rows (the reference's masses): how far
    the case is from a cut that summation order could move."""
    if top_p is None:
        return float("inf")
    scale = torch.where(temperature < 1e-5, 1.0, temperature)[:, None, None]
    logits = (hidden.float() @ lm_head[:vocab].float().T) / scale
    if allowed_tokens is not None:
        ids = torch.arange(vocab, device=logits.device)
        logits = torch.where(truncation.allowed_ids(allowed_tokens, ids), logits, float("-inf"))
    values, _ = torch.sort(logits, dim=-1, descending=True, stable=True)
    keep = values > float("-inf")
    if top_k is not None:
        rank = torch.arange(vocab, device=logits.device)
        keep &= rank < torch.where(top_k > 0, top_k, vocab)[:, None, None]
    probs = torch.softmax(torch.where(keep, values, float("-inf")), dim=-1)
    before = torch.cumsum(probs, dim=-1) - probs
    p = top_p[:, None, None].expand_as(before)
    gap = torch.where(keep & (p < 1), (before - p).abs(), float("inf"))
    return gap.min().item()


def _compare(args, vocab, num_splits=0, **truncate):
    """The cuda backend's tokens, counts and log-probabilities against the reference's, with every
    draft accepted and with the drafts shifted (rejections); returns the rows it recomputed [R]."""
    hidden, lm_head, temperature, seed, positions = args
    n, rows = hidden.shape[:2]
    assert _margin(hidden, lm_head, temperature, vocab, **truncate) > 1e-5
    accepted = _alone_drafts(hidden, lm_head, temperature, seed, positions, **truncate)
    unsettled = torch.full((n * rows,), -1, dtype=torch.int32, device="cuda")
    for drafts in (accepted, (accepted + 1) % vocab):
        call = (hidden, lm_head, drafts, temperature, seed, positions)
        want = ops.verify_resample(*call, vocab, return_logprobs=True, **truncate)
        got = cuda.verify_resample(
            *call, vocab, return_logprobs=True, num_splits=num_splits, unsettled=unsettled,
            **truncate,
        )  # fmt: skip
        assert torch.equal(got.tokens, want[0])
        assert torch.equal(got.num_emitted, want[1])
        # the log-sum-exp is summed in another order (1.1e-5 seen on an H100's fp16 tiles)
        torch.testing.assert_close(got.logprobs, want[2], rtol=1e-5, atol=1e-5)
        through_ops = ops.verify_resample(*call, vocab, backend="cuda", **truncate)
        assert torch.equal(through_ops[0], want[0]) and torch.equal(through_ops[1], want[1])
    assert set(unsettled.tolist()) <= {0, 1}
    return unsettled.bool()


def _per_row(values, dtype):
    return torch.tensor(values, dtype=dtype, device="cuda")


CASES = {  # name: truncation (top_k / top_p lists, "mask" for the random mask)
    "top_k": dict(top_k=TOP_K),
    "top_p": dict(top_p=TOP_P),
    "both": dict(top_k=TOP_K, top_p=TOP_P),
    "mask": dict(allowed_tokens="mask"),
    "mask_top_k": dict(top_k=TOP_K, allowed_tokens="mask"),
    "all_three": dict(top_k=TOP_K, top_p=TOP_P, allowed_tokens="mask"),
}


def _truncate(spec, allowed):
    out = {}
    for name, value in spec.items():
        if name == "allowed_tokens":
            out[name] = allowed
        else:
            out[name] = _per_row(value, torch.int64 if name == "top_k" else torch.float32)
    return out


@pytest.mark.parametrize("num_splits", [0, 7])
@pytest.mark.parametrize("case", CASES)
def test_the_candidates_settle_small_kept_sets(case, num_splits):
    """k <= 10 and nuclei of a few tokens lie inside the handed-in candidates (32 per split):
    no row is recomputed, and every token equals the reference's."""
    hidden, lm_head, temperature, seed, positions, allowed = _inputs()
    truncate = _truncate(CASES[case], allowed)
    args = (hidden, lm_head, temperature, seed, positions)
    recomputed = _compare(args, V, num_splits, **truncate)
    assert not recomputed.any()
    assert cuda.kernel_path("verify_resample", *args[:2], hidden.new_zeros(N, GAMMA).long(),
                            *args[2:], V, **truncate) == "native"  # fmt: skip


def _nucleus_p(hidden, lm_head, temperature, vocab, rank):
    """[N] float32: per sequence the p whose nucleus is the ``rank + 1`` most likely tokens of
    row 0, midway between two cumulative masses (so far from any cut summation order moves)."""
    scale = torch.where(temperature < 1e-5, 1.0, temperature)[:, None]
    logits = (hidden[:, 0].double() @ lm_head[:vocab].double().T) / scale
    cum = torch.cumsum(torch.softmax(logits, dim=-1).sort(dim=-1, descending=True).values, dim=-1)
    return ((cum[:, rank - 1] + cum[:, rank]) / 2).float()


@pytest.mark.parametrize(
    ("truncate", "rows"),
    [
        (dict(top_k=[200, 300, 0, 500, 100, 999]), [0, 1, 3, 4, 5]),  # k past 32 candidates
        (dict(top_p="wide"), list(range(N))),  # a nucleus of 301 tokens
        (dict(top_k=[5, 400, 3, 0, 1, 40], top_p=[0.5, 1.0, 1.0, "wide", 1.0, 1.0]), [1, 3, 5]),
    ],
    ids=["large_k", "wide_nucleus", "mixed"],
)
def test_rows_the_candidates_do_not_settle_are_recomputed_exactly(truncate, rows):
    """One split hands in 32 candidates (and its floor): a k past them, or a nucleus wider than
    them, cannot be settled there, so those sequences' rows go through the exact recompute (the
    masked logits in the workspace, k-th key and nucleus cut by bisection) and the others do not;
    every row equals the reference. Each sequence's rows share one hidden state (their noise
    differs), so one p per sequence lies midway between two cumulative masses of every row."""
    hidden, lm_head, temperature, seed, positions, _ = _inputs(1, scale=0.2)  # flatter logits
    hidden = hidden[:, :1].expand_as(hidden).contiguous()
    wide = _nucleus_p(hidden, lm_head, temperature, V, 300)
    if truncate.get("top_p") == "wide":
        truncate = dict(truncate, top_p=wide)
    elif "top_p" in truncate:
        p = truncate["top_p"]
        truncate = dict(
            truncate, top_p=[wide[i].item() if v == "wide" else v for i, v in enumerate(p)]
        )
    truncate = {
        k: v
        if isinstance(v, torch.Tensor)
        else _per_row(v, torch.int64 if k == "top_k" else torch.float32)
        for k, v in truncate.items()
    }
    recomputed = _compare((hidden, lm_head, temperature, seed, positions), V, 1, **truncate)
    by_sequence = recomputed.view(N, GAMMA + 1).any(dim=1)
    assert by_sequence.nonzero().flatten().tolist() == rows


EXACT_HELD = 4096  # truncation.cuh kExactHeld: the kept keys the exact recompute sorts


def test_the_exact_recompute_past_its_held_keys():
    """Kept sets of thousands of tokens (flat logits, V = 12003: rows of the logits workspace
    that are not 16-byte aligned, and a vocabulary tail past the vector loads), one split, so
    every sequence is recomputed: top-k past the held keys (the radix select's k-th key), a
    nucleus inside the 4096 largest of 12003 kept keys (the sorted scan), one of exactly 4096 and
    one past them (the bisection over the row). Every row equals the reference."""
    vocab = 12003
    hidden, lm_head, temperature, seed, positions, _ = _inputs(7, vocab=vocab, scale=0.05)
    hidden = hidden[:, :1].expand_as(hidden).contiguous()  # one p per sequence fits every row
    ranks = [0, 3000, 0, EXACT_HELD + 2000, 0, EXACT_HELD - 1]  # nucleus: rank + 1 tokens
    p = [_nucleus_p(hidden, lm_head, temperature, vocab, r)[i].item() if r else 1.0
         for i, r in enumerate(ranks)]  # fmt: skip
    k = _per_row([6000, 0, 1, 0, EXACT_HELD, 0], torch.int64)
    args = (hidden, lm_head, temperature, seed, positions)
    recomputed = _compare(args, vocab, 1, top_k=k, top_p=_per_row(p, torch.float32))
    by_sequence = recomputed.view(N, GAMMA + 1).any(dim=1)
    assert by_sequence.tolist() == [True, True, False, True, True, True]


def test_a_known_prefix_past_its_cap_settles_inside_it_and_recomputes_beyond():
    """32 ids per split (256 splits of V = 8192, fp32): each lane keeps every key it sees, so every
    key is known (no floor) — 8192, past stage 2's sort cap of 1024. The 1024 largest are still a
    prefix of the row's order: k = 100 settles there, k = 2000 is recomputed."""
    vocab, splits = 8192, 256
    hidden, lm_head, temperature, seed, positions, _ = _inputs(2, vocab=vocab)
    args = (hidden, lm_head, temperature, seed, positions)
    k = _per_row([100, 2000, 0, 2000, 100, 50], torch.int64)
    recomputed = _compare(args, vocab, splits, top_k=k).view(N, GAMMA + 1)
    assert recomputed.any(dim=1).tolist() == [False, True, False, True, False, False]


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [3, 20])
def test_the_tensor_core_path_hands_in_its_lanes_candidates(dtype, n):
    """Half / bf16 at H = 128 stream through the tensor cores (16 or 32 rows per CTA, one or two
    lanes per row per warp): the hand-in gathers every lane that served a row. Tokens as the
    reference's (near ties of the fp32 accumulation order are rare at this size)."""
    hidden, lm_head, temperature, seed, positions, allowed = _inputs(3, n=n, hidden_size=128,
                                                                     dtype=dtype)  # fmt: skip
    k = _per_row([5, 0, 3, 10, 1, 7] * 4, torch.int64)[:n]
    p = _per_row([0.5, 0.9, 1.0, 0.2, 0.99, 0.7] * 4, torch.float32)[:n]
    args = (hidden, lm_head, temperature, seed, positions)
    assert not _compare(args, V, top_k=k, top_p=p, allowed_tokens=allowed).any()


def test_ragged_drafts_equal_each_sequence_verified_alone():
    """-1 placeholders end a sequence's drafts early: never accepted, under truncation too."""
    hidden, lm_head, temperature, seed, positions, allowed = _inputs(4)
    truncate = dict(top_k=_per_row(TOP_K, torch.int64), top_p=_per_row(TOP_P, torch.float32),
                    allowed_tokens=allowed)  # fmt: skip
    drafts = _alone_drafts(hidden, lm_head, temperature, seed, positions, **truncate)
    drafts[1, 1:] = -1
    drafts[3, 0:] = -1
    drafts[5, 2:] = -1
    call = (hidden, lm_head, drafts, temperature, seed, positions)
    want = ops.verify_resample(*call, V, **truncate)
    got = ops.verify_resample(*call, V, backend="cuda", **truncate)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert got[1].tolist() == [4, 2, 4, 1, 4, 3]


@pytest.mark.parametrize(
    ("truncate", "kept"),
    [
        (dict(top_p=0.5), {0, 1, 2, 3}),  # mass before token 4 is 0.5 exactly: not < p
        (dict(top_k=3), {0, 1, 2}),  # eight equal logits: the lower ids
        (dict(top_k=6, top_p=0.5), {0, 1, 2}),  # renormalised over six: 3/6 before token 3
        (dict(top_k=20), set(range(8))),  # k past the finite tokens: all of them
    ],
)
def test_boundaries_on_equal_logits(truncate, kept):
    """Golden cases on eight equal logits and 24 -inf ones (exact probabilities): the strict top-p
    cutoff, top-k ties to the lower id; 256 seeds make a wrong extra token all but certain to
    show. The mask leaves ids 0 .. 7 of 32."""
    n = 256
    truncate = {
        k: torch.full((n,), v, device="cuda", dtype=torch.int64 if k == "top_k" else None)
        for k, v in truncate.items()
    }
    allowed = torch.full((n, 1, 1), 0xFF, dtype=torch.int32, device="cuda")
    tokens, _ = ops.verify_resample(
        torch.ones(n, 1, 32, device="cuda"),
        torch.cat([torch.ones(8, 32), torch.randn(24, 32)]).cuda(),
        torch.zeros(n, 0, dtype=torch.int64, device="cuda"),
        1.0,
        torch.arange(n, device="cuda"),
        0,
        backend="cuda",
        allowed_tokens=allowed,
        **truncate,
    )
    assert set(tokens[:, 0].tolist()) == kept


def test_a_mask_alone_runs_no_second_stage_and_the_plain_call_is_unchanged():
    """A mask without top-k / top-p is the tile pass's -inf logits only (nothing to settle); a
    call without any truncation still takes the compiled-in kernels where they apply."""
    hidden, lm_head, temperature, seed, positions, allowed = _inputs(5)
    args = (hidden, lm_head, temperature, seed, positions)
    assert not _compare(args, V, allowed_tokens=allowed).any()
    drafts = torch.zeros(N, GAMMA, dtype=torch.int64, device="cuda")
    call = (hidden, lm_head, drafts, temperature, seed, positions, V)
    assert cuda.kernel_path("verify_resample", *call, allowed_tokens=allowed) == "native"
    plain = cuda.verify_resample(*call)
    want = ops.verify_resample(*call)
    assert torch.equal(plain.tokens, want[0]) and torch.equal(plain.num_emitted, want[1])


def test_graph_capture_of_a_truncating_call():
    """No host read between the stages (the exact recompute launches always and returns where no
    row of its is flagged): a truncating call captures into a CUDA graph and replays right."""
    hidden, lm_head, temperature, seed, positions, _ = _inputs(6)
    drafts = _alone_drafts(hidden, lm_head, temperature, seed, positions, top_k=_per_row(
        [200, 5, 0, 3, 1, 300], torch.int64))  # fmt: skip
    k = _per_row([200, 5, 0, 3, 1, 300], torch.int64)
    call = (hidden, lm_head, drafts, temperature, seed, positions, V)
    want = ops.verify_resample(*call, top_k=k)
    cuda.prepare()
    cuda.verify_resample(*call, top_k=k, num_splits=1)  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = cuda.verify_resample(*call, top_k=k, num_splits=1)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(result.tokens, want[0]) and torch.equal(result.num_emitted, want[1])
