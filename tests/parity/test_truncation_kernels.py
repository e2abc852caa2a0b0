"""The fused truncation of the Triton VerifyResample (``kernels/verify_resample.py``): top-k,
top-p and allowed-token masks in the tile pass, the kept set settled from per-split candidates,
the materialised recomputation where the candidates do not settle it — each path taken and each
equal to the reference, token for token (the laws: ``tests/reference/test_truncation.py``)."""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from tests.parity.conftest import runnable

triton = pytest.importorskip("triton")
kernels = pytest.importorskip("flashspec_export.kernels.verify_resample")

N, GAMMA, H, V = 6, 3, 32, 1000
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # fp32: the interpreter without a GPU


def _inputs(seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(N, GAMMA + 1, H, generator=g)
    lm_head = torch.randn(V, H, generator=g)
    temperature = torch.tensor([1.0, 0.7, 0.0, 1.3, 1.0, 0.5])  # a greedy row among them
    seed_ = torch.arange(N) + 3
    positions = torch.randint(0, 500, (N,), generator=g)
    allowed = torch.randint(
        -(2**31), 2**31 - 1, (N, GAMMA + 1, -(-V // 32)), generator=g, dtype=torch.int32
    )
    return tuple(t.to(DEVICE) for t in (hidden, lm_head, temperature, seed_, positions, allowed))


def _alone_drafts(hidden, lm_head, temperature, seed, positions, **truncate):
    """Each position's own sample (γ = 0), as drafts: every draft is accepted."""
    drafts = []
    for i in range(GAMMA):
        row = {k: (v[:, i : i + 1] if k == "allowed_tokens" else v) for k, v in truncate.items()}
        drafts.append(
            ops.verify_resample(
                hidden[:, i : i + 1], lm_head, torch.zeros(N, 0, dtype=torch.int64, device=DEVICE),
                temperature, seed, positions + i, **row,
            )[0][:, 0]
        )  # fmt: skip
    return torch.stack(drafts, dim=1)


TOP_K = torch.tensor([5, 0, 3, 10, 1, 7], device=DEVICE)
TOP_P = torch.tensor([0.5, 0.9, 1.0, 0.2, 0.99, 0.7], device=DEVICE)
CASES = {  # name: (truncation, whether some sequence is recomputed materialised)
    "top_k": (dict(top_k=TOP_K), False),
    "top_p": (dict(top_p=TOP_P), False),
    "mask": (dict(allowed_tokens="mask"), False),
    "all_three": (dict(top_k=TOP_K, top_p=TOP_P, allowed_tokens="mask"), False),
    "large_k": (dict(top_k=torch.tensor([200, 300, 0, 500, 100, 999], device=DEVICE)), True),
    "top_p_flat": (dict(top_p=torch.full((N,), 0.999, device=DEVICE)), True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fused_truncation_equals_the_reference(case, monkeypatch):
    """Tokens, counts and log-probabilities as the reference's, with every draft accepted (so
    every row's sample is checked) and with the drafts shifted (rejections), and the path the
    case is built for taken: the candidates settle every row, or some sequence is recomputed."""
    hidden, lm_head, temperature, seed, positions, allowed = _inputs()
    truncate, recomputes = CASES[case]
    truncate = {k: (allowed if isinstance(v, str) else v) for k, v in truncate.items()}
    recomputed = []
    original = kernels._recompute

    def spy(result, seqs, *args):  # the real recomputation, recorded
        recomputed.extend(seqs.tolist())
        original(result, seqs, *args)

    monkeypatch.setattr(kernels, "_recompute", spy)
    accepted = _alone_drafts(hidden, lm_head, temperature, seed, positions, **truncate)
    wanted = []
    for drafts in (accepted, (accepted + 1) % V):
        results = {
            backend: ops.verify_resample(
                hidden,
                lm_head,
                drafts,
                temperature,
                seed,
                positions,
                return_logprobs=True,
                backend=runnable(backend),
                **truncate,
            )
            for backend in ("reference", "triton")
        }
        want, got = results["reference"], results["triton"]
        wanted.append(want)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-5)
    assert bool(recomputed) == recomputes, recomputed
    # settle_only (no host read): the unsettled rows reported, the settled sequences already right
    (tokens, emitted, _), unsettled = kernels.verify_resample(
        hidden, lm_head, accepted, temperature, seed, positions, V, settle_only=True, **truncate
    )
    settled = ~unsettled.view(N, GAMMA + 1).any(dim=1)
    assert bool(unsettled.any()) == recomputes
    assert torch.equal(tokens[settled], wanted[0][0][settled])
    assert torch.equal(emitted[settled], wanted[0][1][settled])


def test_order_keys_follow_the_truncation_order():
    """Descending logit, then ascending id; -0.0 ties with +0.0; -inf is last; the keys decode."""
    import triton.language as tl

    @triton.jit
    def keys_kernel(x_ptr, out_ptr, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(out_ptr + i, kernels.order_key(tl.load(x_ptr + i), i))

    x = torch.tensor(
        [0.0, -0.0, 1.5, -2.0, float("-inf"), float("inf"), 3.0, -1e-30], device=DEVICE
    )
    keys = torch.empty(8, dtype=torch.int64, device=DEVICE)
    keys_kernel[(1,)](x, keys, B=8)
    assert keys.argsort(descending=True).tolist() == [5, 6, 2, 0, 1, 7, 3, 4]
    logits, ids = kernels.decode_keys(keys)
    assert torch.equal(logits, x.abs().where(x == 0, x))  # -0.0 comes back as +0.0
    assert ids.tolist() == list(range(8))


def test_the_hand_in_holds_every_key_above_its_floor():
    """``column_top2`` over a split's tiles, then ``select_candidates``: the floor is the largest
    key not handed in, and the handed-in keys above it are exactly the split's keys above it —
    on rows with many, few and no new keys per tile, ties of equal logits, -inf logits, and a
    column holding three of the largest keys (one of them dropped: the floor)."""
    import triton.language as tl

    C, ROWS, B, TILES = 4, 8, 16, 3

    @triton.jit
    def hand_in_kernel(x_ptr, out_ptr, floor_ptr, ROWS: tl.constexpr, B: tl.constexpr,
                       C: tl.constexpr, TILES: tl.constexpr):  # fmt: skip
        r = tl.arange(0, ROWS)
        first = tl.full([ROWS, B], kernels.EMPTY_KEY, tl.int64)
        second = first
        dropped = first
        for t in range(TILES):
            ids = t * B + tl.arange(0, B)
            logits = tl.load(x_ptr + r[:, None] * (TILES * B) + ids[None, :])
            first, second, dropped = kernels.column_top2(
                first, second, dropped, kernels.order_key(logits, ids[None, :])
            )
        cand, floor = kernels.select_candidates(first, second, dropped, C)
        tl.store(out_ptr + r[:, None] * C + tl.arange(0, C)[None, :], cand)
        tl.store(floor_ptr + r, floor)

    g = torch.Generator().manual_seed(3)
    x = torch.randn(ROWS, TILES * B, generator=g)
    x[1] = torch.arange(TILES * B, dtype=torch.float32)  # rising: every tile replaces all
    x[2] = -torch.arange(TILES * B, dtype=torch.float32)  # falling: later tiles add nothing
    x[3] = torch.round(x[3])  # many equal logits: ties by the lower id
    x[4] = float("-inf")
    x[4, [5, 5 + B, 5 + 2 * B]] = torch.tensor([3.0, 2.0, 1.0])  # one column, three keys
    x = x.to(DEVICE)
    out = torch.empty(ROWS, C, dtype=torch.int64, device=DEVICE)
    floor = torch.empty(ROWS, dtype=torch.int64, device=DEVICE)
    hand_in_kernel[(1,)](x, out, floor, ROWS=ROWS, B=B, C=C, TILES=TILES)
    ids = torch.arange(TILES * B, device=DEVICE)
    for row in range(ROWS):
        handed = set(kernels.decode_keys(out[row])[1].tolist())
        left = [v for v in ids.tolist() if v not in handed]
        best_left = max(left, key=lambda v: (x[row, v].item(), -v))
        assert kernels.decode_keys(floor[row])[1].item() == best_left
        above = {
            v
            for v in ids.tolist()
            if (x[row, v].item(), -v) > (x[row, best_left].item(), -best_left)
        }
        assert above <= handed
    assert kernels.decode_keys(floor[4])[0].item() == 1.0  # the dropped third of one column


@pytest.mark.parametrize(
    ("truncate", "kept"),
    [
        (dict(top_p=0.5), {0, 1, 2, 3}),  # mass before token 4 is 0.5 exactly: not < p
        (dict(top_k=3), {0, 1, 2}),  # eight equal logits: the lower ids
        (dict(top_k=6, top_p=0.5), {0, 1, 2}),  # renormalised over six: 3/6 before token 3
    ],
)
def test_boundaries_on_equal_logits(truncate, kept):
    """Golden cases on eight equal logits (exact probabilities): the strict top-p cutoff and
    top-k ties to the lower id; 256 seeds make a mutant's extra token all but certain to show."""
    n = 256
    truncate = {
        k: torch.full((n,), v, device=DEVICE, dtype=torch.int64 if k == "top_k" else None)
        for k, v in truncate.items()
    }
    tokens, _ = ops.verify_resample(
        torch.zeros(n, 1, 8, device=DEVICE),
        torch.eye(8, device=DEVICE),
        torch.zeros(n, 0, dtype=torch.int64, device=DEVICE),
        1.0,
        torch.arange(n, device=DEVICE),
        0,
        backend=runnable("triton"),
        **truncate,
    )
    assert set(tokens[:, 0].tolist()) == kept


def test_a_kept_set_past_max_kept_is_recomputed(monkeypatch):
    """Stage 2 settles a kept set only inside its MAX_KEPT largest candidates: with the cap at 4,
    the sequences whose top-k exceeds it are recomputed and every sequence equals the reference."""
    hidden, lm_head, temperature, seed, positions, _ = _inputs(1)
    drafts = torch.zeros(N, GAMMA, dtype=torch.int64, device=DEVICE)
    monkeypatch.setattr(kernels, "MAX_KEPT", 4)
    _, unsettled = kernels.verify_resample(
        hidden, lm_head, drafts, temperature, seed, positions, V, top_k=TOP_K, settle_only=True
    )
    assert torch.equal(unsettled, (TOP_K > 4).repeat_interleave(GAMMA + 1))  # k 5, 10, 7
    got = ops.verify_resample(
        hidden, lm_head, drafts, temperature, seed, positions, backend="triton", top_k=TOP_K
    )
    want = ops.verify_resample(hidden, lm_head, drafts, temperature, seed, positions, top_k=TOP_K)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
