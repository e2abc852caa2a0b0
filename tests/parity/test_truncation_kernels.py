"""The fused truncation of the Triton VerifyResample (``kernels/verify_resample.py``): top-k,
top-p and allowed-token masks in the tile pass, the kept set settled from the keys each row hands
in above its threshold, the materialised recomputation where the hand-in does not settle it —
each path taken and each equal to the reference, token for token (the laws:
``tests/reference/test_truncation.py``)."""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import truncation
from tests.parity.conftest import runnable

triton = pytest.importorskip("triton")
kernels = pytest.importorskip("flashspec_export.kernels.verify_resample")
order_keys = pytest.importorskip("flashspec_export.kernels.order_keys")
tiles = pytest.importorskip("flashspec_export.kernels.tiles")
tl = pytest.importorskip("triton.language")

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
    # a nucleus of more tokens than any launch shape hands in (the rows at T >= 1)
    "top_p_flat": (dict(top_p=torch.full((N,), 0.9999999, device=DEVICE)), True),
}


@pytest.mark.parametrize("case", CASES)
def test_the_fused_truncation_equals_the_reference(case, monkeypatch):
    """Tokens, counts and log-probabilities as the reference's, with every draft accepted (so
    every row's sample is checked) and with the drafts shifted (rejections), and the path the
    case is built for taken: stage 2 settles every row, or some sequence is recomputed. Mutant
    caught: the hand-in ignoring the mask (``all_three``)."""
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
        args = (hidden, lm_head, drafts, temperature, seed, positions)
        want = ops.verify_resample(
            *args, return_logprobs=True, backend=runnable("reference"), **truncate
        )
        got = ops.verify_resample(
            *args, return_logprobs=True, backend=runnable("triton"), **truncate
        )
        wanted.append(want)
        assert torch.equal(got[0], want[0])
        assert torch.equal(got[1], want[1])
        torch.testing.assert_close(got[2], want[2], rtol=0, atol=1e-5)
    assert bool(recomputed) == recomputes, recomputed
    # settle_only (no host read): the unsettled rows reported, the settled sequences already right
    (tokens, emitted, _), unsettled = kernels.verify_resample(
        hidden, lm_head, accepted, temperature, seed, positions, V, settle_only=True, **truncate,
    )  # fmt: skip
    settled = ~unsettled.view(N, GAMMA + 1).any(dim=1)
    assert bool(unsettled.any()) == recomputes
    assert torch.equal(tokens[settled], wanted[0][0][settled])
    assert torch.equal(emitted[settled], wanted[0][1][settled])


def test_truncating_calls_take_their_own_launch_up_to_16_rows(monkeypatch):
    """A top-k or top-p call's default launch is ``hand_in_config``'s (``HAND_IN_TUNED``: at
    2-16 rows on a GPU, the hand-in in the loop wants another tile than plain verify's); at 1
    row, past 16, off a GPU and under the interpreter, ``choose_config``'s. The calls with that
    launch equal the reference; a plain call does not take it."""
    assert tiles.hand_in_row(1) is None
    assert tiles.hand_in_row(2) == (16, 128, 4, 2, 3)
    assert tiles.hand_in_row(16) == (16, 128, 4, 2, 3)
    assert tiles.hand_in_row(17) is None
    assert tiles.hand_in_config(4, H, V, torch.float32, torch.device("cpu")) is None
    hidden, lm_head, temperature, seed, positions, _ = _inputs()
    rows = N * (GAMMA + 1)
    launched = []

    def own_launch(rows, hidden_size, vocab_size, dtype, device):  # a launch of other tiles
        launched.append(rows)
        config = tiles.choose_config(
            "verify_resample", rows, hidden_size, vocab_size, dtype, device, hopper=False
        )
        return config._replace(block_v=64)

    monkeypatch.setattr(kernels, "hand_in_config", own_launch)
    drafts = torch.zeros(N, GAMMA, dtype=torch.int64, device=DEVICE)
    args = (hidden, lm_head, drafts, temperature, seed, positions)
    for truncate in (dict(top_k=TOP_K), dict(top_p=TOP_P)):
        got = ops.verify_resample(*args, backend=runnable("triton"), **truncate)
        want = ops.verify_resample(*args, backend=runnable("reference"), **truncate)
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert launched == [rows, rows]
    ops.verify_resample(*args, backend=runnable("triton"))
    assert launched == [rows, rows]


@pytest.mark.skipif(
    DEVICE != "cuda", reason="the launch table is the GPU's (the interpreter runs one shape)"
)
@pytest.mark.parametrize("rows", [1, 2, 8, 16, 17, 64, 65, 200])
def test_every_truncation_launch_equals_the_reference(rows):
    """The launch a top-k / top-p call takes at each row count (``HAND_IN_TUNED``'s at 2-16
    rows, both sides of each bound, else plain verify's) gives the reference's tokens and counts —
    top-k and top-p per sequence, fp32, a 4096-id vocabulary."""
    h, v = 64, 4096
    g = torch.Generator().manual_seed(rows)
    n, width = (rows // 4, 4) if rows % 4 == 0 else (rows, 1)
    hidden = torch.randn(n, width, h, generator=g).to(DEVICE)
    lm_head = torch.randn(v, h, generator=g).to(DEVICE)
    temperature = torch.rand(n, generator=g).to(DEVICE) + 0.5
    seed_ = torch.arange(n, device=DEVICE) + rows
    positions = torch.randint(0, 500, (n,), generator=g).to(DEVICE)
    truncate = dict(
        top_k=torch.randint(0, 60, (n,), generator=g).to(DEVICE),
        top_p=torch.rand(n, generator=g).to(DEVICE) * 0.5 + 0.5,
    )
    # each position's own sample as its draft (all accepted, so every row's sample is compared)
    drafts = torch.zeros(n, 0, dtype=torch.int64, device=DEVICE)
    for i in range(width - 1):
        alone = ops.verify_resample(
            hidden[:, i : i + 1], lm_head, drafts[:, :0], temperature, seed_, positions + i,
            backend="reference", **truncate,
        )  # fmt: skip
        drafts = torch.cat([drafts, alone[0][:, :1]], dim=1)
    args = (hidden, lm_head, drafts, temperature, seed_, positions)
    want = ops.verify_resample(*args, backend="reference", **truncate)
    got = ops.verify_resample(*args, backend="triton", **truncate)
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])
    assert bool((want[1] == width).all()), "a draft was rejected: not every row's sample compared"


def test_order_keys_follow_the_truncation_order():
    """Descending logit, then ascending id; -0.0 ties with +0.0; -inf is last; the keys decode."""
    import triton.language as tl

    @triton.jit
    def keys_kernel(x_ptr, out_ptr, B: tl.constexpr):
        i = tl.arange(0, B)
        tl.store(out_ptr + i, order_keys.order_key(tl.load(x_ptr + i), i))

    x = torch.tensor(
        [0.0, -0.0, 1.5, -2.0, float("-inf"), float("inf"), 3.0, -1e-30], device=DEVICE
    )
    keys = torch.empty(8, dtype=torch.int64, device=DEVICE)
    keys_kernel[(1,)](x, keys, B=8)
    assert keys.argsort(descending=True).tolist() == [5, 6, 2, 0, 1, 7, 3, 4]
    logits, ids = order_keys.decode_keys(keys)
    assert torch.equal(logits, x.abs().where(x == 0, x))  # -0.0 comes back as +0.0
    assert ids.tolist() == list(range(8))


@pytest.mark.parametrize("settled", [False, True], ids=["recomputed", "settled"])
@pytest.mark.parametrize(
    ("truncate", "kept"),
    [
        (dict(top_p=0.5), {0, 1, 2, 3}),  # mass before token 4 is 0.5 exactly: not < p
        (dict(top_k=3), {0, 1, 2}),  # eight equal logits: the lower ids
        (dict(top_k=6, top_p=0.5), {0, 1, 2}),  # renormalised over six: 3/6 before token 3
    ],
)
def test_boundaries_on_equal_logits(truncate, kept, settled):
    """Golden cases on eight equal logits (exact probabilities): the strict top-p cutoff and
    top-k ties to the lower id; 64 seeds make a mutant's extra token all but certain to show
    (each seed misses it with probability 4/5 at most: 0.8**64 < 1e-6). Alone in a
    vocabulary of 8 the hand-in knows none of them (all tie with its threshold) and every row is
    recomputed; masked out of 1000 ids (the threshold then keeps every finite dot),
    stage 2 settles every row (mutant caught: the nucleus cut by mass inclusive of p)."""
    n, vocab = 64, (1000 if settled else 8)
    truncate = {
        k: torch.full((n,), v, device=DEVICE, dtype=torch.int64 if k == "top_k" else None)
        for k, v in truncate.items()
    }
    if settled:
        allowed = torch.zeros(n, 1, -(-vocab // 32), dtype=torch.int32, device=DEVICE)
        allowed[..., 0] = 0xFF  # ids 0-7
        truncate["allowed_tokens"] = allowed
    args = (
        torch.zeros(n, 1, 8, device=DEVICE),
        torch.eye(vocab, 8, device=DEVICE),
        torch.zeros(n, 0, dtype=torch.int64, device=DEVICE),
    )
    tokens, _ = ops.verify_resample(
        *args, 1.0, torch.arange(n, device=DEVICE), 0, backend=runnable("triton"), **truncate
    )
    assert set(tokens[:, 0].tolist()) == kept
    _, unsettled = kernels.verify_resample(
        *args, torch.ones(n, device=DEVICE), torch.arange(n, device=DEVICE),
        torch.zeros(n, dtype=torch.int64, device=DEVICE), vocab, settle_only=True, **truncate,
    )  # fmt: skip
    assert bool(unsettled.all()) if not settled else not bool(unsettled.any())


def test_a_kept_set_past_max_kept_is_recomputed(monkeypatch):
    """Stage 2 settles a top-k kept set only inside its MAX_KEPT largest keys: with the cap at 4,
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


# ---- stage 2 (``_truncated_summaries``, one Triton launch) against its steps in torch

_EMPTY_KEY = -(2**63)
_FULL_KEY = 2**63 - 1
_NEG_INF_LAST = ((-(2**31) + 2**23 - 1) << 32) | (2**31 - 1)  # the largest key of a -inf logit


def truncated_summaries_torch(workspace, keys, counts, thresholds, truncated, top_k, top_p,
                              temperature, seed, positions):  # fmt: skip
    """The stage 2 of ``kernels.verify_resample._truncated_summaries`` in torch ops, step by step
    (see its docstring for the terms), on the keys sorted: the oracle the kernel is compared
    with. Rewrites ``workspace`` in place, returns unsettled [R]."""
    from flashspec_export.kernels.noise import evaluate_noise
    from flashspec_export.reference import noise
    from flashspec_export.reference import verify_resample as reference

    rows, cap = keys.shape
    splits = workspace.index.shape[1]
    n = temperature.shape[0]
    width = rows // n
    device = keys.device
    inf = float("inf")
    best_score_f, best_logit_f, max_f, sum_exp_f = range(kernels.NUM_FLOAT_FIELDS)

    def per_row(t):
        return t.repeat_interleave(width)

    # the hand-in rekeyed by its logits dot / T; tau from the threshold
    scale = per_row(torch.where(reference.is_greedy(temperature), 1.0, temperature))
    stored = torch.arange(cap, device=device)[None, :] < counts[:, None].long()
    dot, ids = order_keys.decode_keys(keys)
    handed = torch.where(stored & (keys != _EMPTY_KEY), _order_keys(dot / scale[:, None], ids),
                         _EMPTY_KEY)  # fmt: skip
    top_left = thresholds / scale
    tau = _order_keys(top_left, torch.zeros_like(ids[:, 0]))  # the logit's largest key
    tau = torch.where(top_left == -inf, _EMPTY_KEY, tau)
    tau = torch.where(thresholds == -torch.finfo(torch.float32).max, _EMPTY_KEY, tau)
    tau = torch.where((counts > cap) | thresholds.isnan(), _FULL_KEY, tau)

    known = (handed > tau[:, None]) & (handed > _NEG_INF_LAST)
    known_all = known.sum(dim=-1)
    num_kept = min(kernels.MAX_KEPT, cap)
    complete = (tau == _EMPTY_KEY) & (known_all <= num_kept)  # every finite logit known
    keys = torch.where(known, handed, _EMPTY_KEY).sort(dim=-1, descending=True).values
    known = keys != _EMPTY_KEY
    logit, ids = order_keys.decode_keys(keys)
    rank = torch.arange(cap, device=device)
    k = per_row(top_k) if top_k is not None else torch.zeros(rows, dtype=torch.int64, device=device)
    p = per_row(top_p) if top_p is not None else torch.ones(rows, device=device)
    keep = known & ((k[:, None] == 0) | (rank[None, :] < k[:, None]))
    top_k_on = k > 0
    top_k_known = top_k_on & (k <= known_all.clamp(max=num_kept))

    # softmax over the kept set (top-k on) or over every allowed token (stage 1's online sums)
    floats = workspace.floats
    m = floats[max_f]
    big_m = m.amax(dim=-1)
    finite_m = torch.where(big_m == -inf, 0.0, big_m)
    terms = floats[sum_exp_f] * torch.exp(m - finite_m[:, None])
    total_all = _fixed_total(terms, torch.ones_like(terms, dtype=torch.bool))
    top = torch.where(keep[:, 0], logit[:, 0], 0.0)  # the largest kept logit
    total_kept = _fixed_total(torch.exp(logit - top[:, None]), keep)
    shift = torch.where(top_k_on, top, finite_m)
    total = torch.where(top_k_on, total_kept, total_all)
    probs = torch.exp(logit - shift[:, None]) / torch.where(total == 0, 1.0, total)[:, None]
    probs = probs.masked_fill(~keep, 0.0)
    # the mass before each key, exact in units of 2**-40; a nucleus only where the kept keys weigh
    # p (NaN probabilities, of a +inf logit, do not)
    fixed = _fixed(probs.nan_to_num(0.0))
    before = torch.cumsum(fixed, dim=-1) - fixed
    p_fixed = _fixed(p)
    reach = (p < 1.0) & (fixed.sum(dim=-1) >= p_fixed) & ~(keep & probs.isnan()).any(dim=-1)
    nucleus = keep & (~reach[:, None] | (before < p_fixed[:, None]))
    nucleus[:, 0] |= keep[:, 0]  # the top token is always kept
    ends_inside = (keep & ~nucleus).any(dim=-1)
    settled = (complete | top_k_known | (~top_k_on & ends_inside)) & nucleus.any(dim=-1)

    seq_rows = per_row(torch.arange(n, device=device))
    row_pos = positions[seq_rows] + torch.arange(rows, device=device) % width
    g = evaluate_noise(
        seed[seq_rows, None].expand_as(ids).reshape(-1),
        row_pos[:, None].expand_as(ids).reshape(-1),
        ids.reshape(-1),
        noise.STREAM_GUMBEL,
    )[2].view(ids.shape)
    greedy = reference.is_greedy(temperature)[seq_rows]
    score = torch.where(greedy[:, None], logit, logit + g).masked_fill(~nucleus, float("-inf"))
    best = score.amax(dim=-1, keepdim=True)
    winner = torch.where(score == best, ids, 2**62).argmin(dim=-1, keepdim=True)  # lowest id
    y = ids.gather(-1, winner).squeeze(-1)
    y_logit = logit.gather(-1, winner).squeeze(-1)
    kept_logit = logit.masked_fill(~nucleus, float("-inf"))
    top_kept = kept_logit.amax(dim=-1)
    lse_max = torch.where(top_kept.abs() == inf, 0.0, top_kept)
    terms = torch.exp(kept_logit - lse_max[:, None])
    kept_sum = _fixed_total(terms, nucleus & (terms <= 1.0))
    lse_kept = torch.where(top_kept == inf, inf, kept_sum).log() + lse_max

    rewrite = (per_row(truncated) != 0) & settled
    first = torch.arange(splits, device=device)[None, :] == 0
    where = rewrite[:, None]

    def one_split(field, value, rest):
        field.copy_(torch.where(where, torch.where(first, value[:, None], rest), field))

    one_split(floats[best_score_f], torch.zeros_like(lse_kept), float("-inf"))
    one_split(workspace.index, y.to(torch.int32), 0)
    one_split(floats[best_logit_f], y_logit, 0.0)
    one_split(floats[max_f], lse_kept, float("-inf"))
    one_split(floats[sum_exp_f], torch.ones_like(lse_kept), 0.0)
    return (per_row(truncated) != 0) & ~settled


def _fixed(w):
    """float32 terms in [0, 1] in int64 units of 2**-40 (truncated), as the kernel's."""
    return (w * 2.0**40).to(torch.int64)


def _fixed_total(w, keep):
    """The kernel's ``_fixed_total``: the exact sum of the kept terms, rounded once to float32."""
    nan = (keep & w.isnan()).any(dim=-1)
    total = _fixed(torch.where(keep & ~w.isnan(), w, 0.0)).sum(dim=-1).to(torch.float32) * 2.0**-40
    return torch.where(nan, float("nan"), total)


def _order_keys(logits, ids):
    """int64 order keys of float32 ``logits`` at int64 ``ids``, as ``order_keys.order_key``."""
    bits = torch.where(logits == 0, 0.0, logits).view(torch.int32)
    ordered = torch.where(bits >= 0, bits, bits ^ (2**31 - 1)).to(torch.int64)
    return (ordered << 32) | ((2**31 - 1) - ids)


def _counted_hand_in(dots, thresholds, cap, g):
    """The tile pass's hand-in of raw ``dots [R, V]``: per row the order keys of every dot at or
    above its threshold, in a random order (the atomics' order is any), the first ``cap`` of them
    stored, and the full count."""
    rows, vocab = dots.shape
    ids = torch.arange(vocab)
    keys = torch.full((rows, cap), _EMPTY_KEY, dtype=torch.int64)
    counts = torch.zeros(rows, dtype=torch.int32)
    for r in range(rows):
        taken = ids[dots[r] >= thresholds[r]]
        taken = taken[torch.randperm(taken.numel(), generator=g)]
        counts[r] = taken.numel()
        stored = taken[:cap]
        keys[r, : stored.numel()] = _order_keys(dots[r, stored], stored)
    return keys, counts


def _stage2_inputs(dots, temperature, thresholds, cap, g):
    """Stage 2's inputs from the rows' raw dots ``[R, S, V_split]`` (split s holds ids
    ``s · V_split ...``) at the sequences' ``temperature``: the hand-in of every dot at or above
    its row's threshold (``_counted_hand_in``) and the stage-1 online softmax ``m, s`` of each
    split's logits dot / T."""
    rows, splits, _ = dots.shape
    keys, counts = _counted_hand_in(dots.reshape(rows, -1), thresholds, cap, g)
    width = rows // temperature.shape[0]
    scale = torch.where(temperature < 1e-5, 1.0, temperature).repeat_interleave(width)
    logits = dots / scale[:, None, None]  # IEEE division, as the kernels' div_rn
    m = logits.amax(dim=-1)
    s = torch.exp(logits - torch.where(m == float("-inf"), 0.0, m)[..., None]).sum(dim=-1)
    floats = torch.randn(kernels.NUM_FLOAT_FIELDS, rows, splits, generator=g)
    floats[kernels.F_MAX.value] = m
    floats[kernels.F_SUM_EXP.value] = s
    index = torch.randint(0, 1000, (rows, splits), generator=g, dtype=torch.int32)
    return kernels.VerifyWorkspace(floats, index), keys, counts


def _depth_thresholds(dots, depth):
    """Per row the dot of rank ``depth`` (about ``depth`` dots handed in), at least -FLT_MAX, as
    ``_hand_in_threshold_kernel`` clamps its."""
    ordered = dots.reshape(dots.shape[0], -1).sort(dim=-1, descending=True).values
    return ordered[:, depth - 1].clamp(min=-torch.finfo(torch.float32).max)


def _stage2_case(name, g):
    """(dots [R, S, V_split], per-sequence inputs, thresholds [R], cap, MAX_KEPT) of a case."""
    n, width = 4, 3
    temperature = torch.tensor([1.0, 0.0, 0.8, 1.2])  # a greedy sequence
    truncated = torch.tensor([1, 1, 1, 0], dtype=torch.int32)  # sequence 3 untruncated
    top_k = torch.tensor([5, 0, 60, 3])
    top_p = torch.tensor([0.9, 0.55, 1.0, 0.3])
    cap, depth, max_kept = 256, 200, kernels.MAX_KEPT
    flt_max = torch.finfo(torch.float32).max
    if name == "random":  # a few hundred ids per split: most kept sets settled
        dots = torch.randn(n * width, 6, 300, generator=g) * 3
    elif name == "ties":  # few distinct dots: ties by the lower id, everywhere, and at theta
        dots = torch.randint(-2, 2, (n * width, 4, 40), generator=g).float()
        top_p = torch.tensor([0.37, 0.61, 1.0, 0.3])
        depth = 100  # theta at 0 or -1: the dots tied with it are not known
    elif name == "neg_inf":  # masked rows: few finite dots; one row with none
        dots = torch.randn(n * width, 4, 64, generator=g)
        dots[torch.rand(dots.shape, generator=g) < 0.8] = float("-inf")
        dots[0] = float("-inf")  # a row with no allowed token: not settled
        dots[1, :, 1:] = float("-inf")  # one allowed token per split
        dots[2, 1, 5] = float("inf")  # a +inf dot: NaN probabilities, the top token kept
        depth = 40
    elif name == "complete":  # every finite dot handed in (theta -FLT_MAX): k > known, p near 1
        dots = torch.randn(n * width, 3, 30, generator=g) * 2
        top_k = torch.tensor([200, 0, 17, 3])
        top_p = torch.tensor([0.999, 0.999, 1.0, 0.3])
        depth = 1  # (replaced by -FLT_MAX below)
    elif name == "past_the_hand_in":  # k beyond the known keys, nuclei past them: recomputed
        dots = torch.randn(n * width, 8, 200, generator=g) * 0.1
        dots[2 * width : 3 * width] *= 50  # but sequence 2's: peaked, settled
        top_k = torch.tensor([250, 0, 2, 3])
        top_p = torch.tensor([0.98, 0.999, 0.3, 0.3])
        depth = 100
    elif name == "max_kept":  # the cap (not a power of two): k and complete sets across it
        dots = torch.randn(n * width, 2, 30, generator=g)
        dots[:width, :, 24:] = float("-inf")  # 48 finite dots: complete at the cap
        top_k = torch.tensor([0, 47, 48, 49])
        top_p = torch.tensor([1.0, 1.0, 1.0, 1.0])
        truncated = torch.ones(n, dtype=torch.int32)
        max_kept, depth = 48, 55
    elif name == "compacted":  # top-k's nucleus through the scratch: more keys than twice the
        # cap's block; a dot tied across the cap (200 keys: then the cap-th, on the ids)
        dots = torch.randn(n * width, 8, 30, generator=g) * 3
        dots[:width, :, 5:] = float("-inf")  # 40 finite dots: under the cap
        dots[width : 2 * width] = 1.0
        dots[width : 2 * width, :, :5] = torch.randint(2, 6, (width, 8, 5), generator=g).float()
        top_k = torch.tensor([0, 48, 20, 47])
        top_p = torch.tensor([0.9, 0.8, 1.0, 0.5])
        max_kept, depth = 48, 230
    elif name == "thresholds":  # the rows the hand-in cannot settle: a count past the buffer,
        # no threshold, a threshold above the k-th dot; and one keeping every finite dot
        dots = torch.randn(n * width, 4, 128, generator=g) * 4
        top_k = torch.tensor([5, 40, 8, 3])
        top_p = torch.tensor([0.9, 0.8, 0.6, 0.95])
        truncated = torch.ones(n, dtype=torch.int32)
        cap, depth = 128, 100
    elif name == "flat":  # noise above the logits' spread: samples often past top-k
        n, width = 16, 4
        dots = torch.randn(n * width, 4, 32, generator=g) * 0.3
        temperature = torch.full((n,), 1.5)
        truncated = torch.ones(n, dtype=torch.int32)
        top_k = torch.arange(n) % 6 + 1
        top_p = torch.full((n,), 0.1)  # a nucleus of about 13 of the 40 handed in
        top_p[0] = 1e-13  # below 2**-40, the unit of the exact sums: the top token alone
        depth = 40
    elif name == "many_splits":  # one row, 200 splits, the product's 4096 keys a row
        n, width = 1, 1
        dots = torch.randn(1, 200, 40, generator=g) * 3
        temperature, truncated = torch.tensor([1.0]), torch.tensor([1], dtype=torch.int32)
        top_k, top_p = torch.tensor([50]), torch.tensor([0.9])
        cap, depth = 4096, 3000
    thresholds = _depth_thresholds(dots, depth)
    if name == "complete":
        thresholds[:] = -flt_max
    elif name == "max_kept":
        thresholds[:width] = -flt_max
    elif name == "thresholds":
        ordered = dots.reshape(n * width, -1).sort(dim=-1, descending=True).values
        thresholds[0] = ordered[0, 2]  # 3 dots: below k = 5, and (top-p) inside the nucleus
        thresholds[4] = -flt_max  # every finite dot: complete, 512 > cap: not settled
        thresholds[5] = -flt_max
        dots[5, :, 20:] = float("-inf")  # every finite dot, 80 of them: complete, settled
        thresholds[7] = ordered[7, 200]  # 201 dots: past the buffer of 128
        thresholds[9] = float("nan")  # no threshold: nothing handed in
    seqs = dict(
        truncated=truncated, top_k=top_k, top_p=top_p, temperature=temperature,
        seed=torch.arange(n) * 7 + 1, positions=torch.randint(0, 1000, (n,), generator=g),
    )  # fmt: skip
    return dots, seqs, thresholds, cap, max_kept


STAGE2_CASES = [
    "random", "ties", "neg_inf", "complete", "past_the_hand_in", "max_kept", "compacted",
    "thresholds", "flat", "many_splits",
]  # fmt: skip


# the +inf logit's inf - inf, on purpose: NumPy (the interpreter) warns, torch does not
@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize("logprobs", [True, False], ids=["logprobs", "sample_only"])
@pytest.mark.parametrize("case", STAGE2_CASES)
@pytest.mark.parametrize("which", ["top_k", "top_p", "both"])
def test_stage2_equals_its_torch_steps(case, which, logprobs, monkeypatch):
    """The stage-2 kernel = its torch steps (``truncated_summaries_torch``, on the keys sorted)
    on the same hand-in, in no order: the same rows unsettled, the settled rows' sample (index,
    logit) and summaries rewritten bit for bit (the LSE to float rounding), every other row's
    summaries untouched. Every case has settled rows, and those built for it rows left unsettled
    (k past the known keys, a nucleus past them, no allowed token, a kept set past MAX_KEPT, a
    count past the buffer, no threshold). Without log-probabilities (the walk by score, no cut)
    the sample's fields alone are rewritten. Mutants caught (sample only): a candidate kept at
    its limit (rank k, or mass p above it), the first candidate taken whatever its rank or
    mass."""
    g = torch.Generator().manual_seed(STAGE2_CASES.index(case))
    dots, seqs, thresholds, cap, max_kept = _stage2_case(case, g)
    monkeypatch.setattr(kernels, "MAX_KEPT", max_kept)
    workspace, keys, counts = _stage2_inputs(dots, seqs["temperature"], thresholds, cap, g)
    top_k = seqs["top_k"] if which in ("top_k", "both") else None
    top_p = seqs["top_p"] if which in ("top_p", "both") else None
    args = (seqs["truncated"], top_k, top_p, seqs["temperature"], seqs["seed"], seqs["positions"])
    want_ws = kernels.VerifyWorkspace(*(t.clone().to(DEVICE) for t in workspace))
    got_ws = kernels.VerifyWorkspace(*(t.clone().to(DEVICE) for t in workspace))
    hand_in = tuple(t.to(DEVICE) for t in (keys, counts, thresholds))
    args = tuple(None if t is None else t.to(DEVICE) for t in args)
    want = truncated_summaries_torch(want_ws, *hand_in, *args)
    got = kernels._truncated_summaries(got_ws, *hand_in, *args, return_logprobs=logprobs)
    assert torch.equal(got, want)
    width = dots.shape[0] // len(seqs["truncated"])  # rows per sequence
    settled = (seqs["truncated"] != 0).repeat_interleave(width).to(DEVICE) & ~want
    assert settled.any()
    if case in ("neg_inf", "past_the_hand_in", "max_kept", "thresholds"):
        assert want.any()
    if case == "thresholds":  # the count past the buffer, the NaN threshold
        assert bool(want[7]) and bool(want[9]) and bool(want[4]) and not bool(want[5])
    lse = kernels.F_MAX.value
    others = [f for f in range(kernels.NUM_FLOAT_FIELDS) if f != lse]
    assert torch.equal(got_ws.index, want_ws.index)

    def same(got, want):  # bit for bit (an unsettled row's input sums may be NaN: a +inf logit)
        torch.testing.assert_close(got, want, rtol=0, atol=0, equal_nan=True)

    if not logprobs:  # the sample's score written, the fields of its log-probability not
        score = kernels.F_BEST_SCORE.value
        same(got_ws.floats[score], want_ws.floats[score])
        untouched = [f for f in range(kernels.NUM_FLOAT_FIELDS) if f != score]
        same(got_ws.floats[untouched], workspace.floats[untouched].to(DEVICE))
        return
    same(got_ws.floats[others], want_ws.floats[others])
    same(got_ws.floats[lse, ~settled], want_ws.floats[lse, ~settled])
    torch.testing.assert_close(got_ws.floats[lse], want_ws.floats[lse], rtol=1e-6, atol=1e-6,
                               equal_nan=True)  # fmt: skip
    # the rows untouched: as handed in
    assert torch.equal(got_ws.index[~settled], workspace.index.to(DEVICE)[~settled])


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize("logprobs", [True, False], ids=["logprobs", "sample_only"])
@pytest.mark.parametrize("case", ["random", "complete"])
@pytest.mark.parametrize("which", ["top_k", "top_p", "both"])
def test_stage2_gives_the_same_bits_for_the_hand_in_in_any_order(which, case, logprobs):
    """The tile pass hands the keys in in its atomics' order, which changes from run to run and
    between backends: stage 2 on each row's keys shuffled gives the same unsettled rows and the
    same summaries bit for bit, the LSE included (its sums are exact, ``_fixed_terms``). Mutant
    caught: the kept set's LSE summed as float32 in the keys' order (``tl.sum`` of the terms)."""
    g = torch.Generator().manual_seed(7)
    dots, seqs, thresholds, cap, _ = _stage2_case(case, g)
    workspace, keys, counts = _stage2_inputs(dots, seqs["temperature"], thresholds, cap, g)
    top_k = seqs["top_k"] if which in ("top_k", "both") else None
    top_p = seqs["top_p"] if which in ("top_p", "both") else None
    args = (seqs["truncated"], top_k, top_p, seqs["temperature"], seqs["seed"], seqs["positions"])
    args = tuple(None if t is None else t.to(DEVICE) for t in args)
    shuffled = keys.clone()
    for r in range(keys.shape[0]):
        count = min(int(counts[r]), cap)
        shuffled[r, :count] = keys[r, torch.randperm(count, generator=g)]
    results = []
    for hand_in in (keys, shuffled):
        ws = kernels.VerifyWorkspace(*(t.clone().to(DEVICE) for t in workspace))
        inputs = tuple(t.to(DEVICE) for t in (hand_in, counts, thresholds))
        results.append(
            (kernels._truncated_summaries(ws, *inputs, *args, return_logprobs=logprobs), ws)
        )
    (unsettled, first), (unsettled_again, again) = results
    assert torch.equal(unsettled, unsettled_again)
    assert bool((~unsettled).any())
    assert torch.equal(first.index, again.index)
    torch.testing.assert_close(first.floats, again.floats, rtol=0, atol=0, equal_nan=True)


@pytest.mark.filterwarnings("ignore:invalid value encountered in subtract:RuntimeWarning")
@pytest.mark.parametrize("which", ["top_k", "both"])
def test_stage2_reads_the_narrowest_width_that_holds_the_counts(which, monkeypatch):
    """Stage 2 reads each row's keys in a quarter, a half or the whole of the buffer's width,
    the narrowest holding the counts: the same hand-in (at most 256 keys a row) in buffers of
    256, 512 and 1024 keys (read whole, by half and by quarter) gives the same bits. Mutant
    caught: a narrow read striding rows by its own width instead of the buffer's."""
    g = torch.Generator().manual_seed(11)
    monkeypatch.setattr(kernels, "MAX_KEPT", 64)  # the same kept block at every buffer width
    dots, seqs, thresholds, cap, _ = _stage2_case("random", g)
    workspace, keys, counts = _stage2_inputs(dots, seqs["temperature"], thresholds, cap, g)
    assert cap == 256 and 128 < int(counts.max()) <= cap
    top_p = seqs["top_p"] if which == "both" else None
    args = (seqs["truncated"], seqs["top_k"], top_p, seqs["temperature"], seqs["seed"],
            seqs["positions"])  # fmt: skip
    args = tuple(None if t is None else t.to(DEVICE) for t in args)
    results = []
    for width in (256, 512, 1024):
        buffer = torch.full((keys.shape[0], width), _EMPTY_KEY, dtype=torch.int64)
        buffer[:, :cap] = keys
        ws = kernels.VerifyWorkspace(*(t.clone().to(DEVICE) for t in workspace))
        inputs = tuple(t.to(DEVICE) for t in (buffer, counts, thresholds))
        results.append((kernels._truncated_summaries(ws, *inputs, *args), ws))
    (unsettled, first), *others = results
    assert bool((~unsettled).any())
    for unsettled_again, again in others:
        assert torch.equal(unsettled, unsettled_again)
        assert torch.equal(first.index, again.index)
        torch.testing.assert_close(first.floats, again.floats, rtol=0, atol=0, equal_nan=True)


@triton.jit
def _mass_cut_kernel(x_ptr, w_ptr, p_ptr, cut_ptr, reach_ptr, ROWS: tl.constexpr, B: tl.constexpr):
    r = tl.arange(0, ROWS)
    at = r[:, None] * B + tl.arange(0, B)[None, :]
    w = tl.load(w_ptr + at)
    cut, reach = kernels._mass_cut(tl.load(x_ptr + at), w > 0, w, tl.load(p_ptr + r))
    tl.store(cut_ptr + r, cut)
    tl.store(reach_ptr + r, reach.to(tl.int32))


def test_mass_cut_keeps_what_the_exact_mass_before_keeps_in_any_order():
    """``_mass_cut`` with p on a boundary: p is a float32 prefix sum of the row's weights in
    descending key order (so the exact mass before some key is within float rounding of p). The
    nucleus it keeps is the keys whose exact mass before them (int64 units of 2**-40) is below
    p, in the given order and with the keys shuffled. Half the rows' high words are spread wide
    (the bisection stops when its bracket holds one key), half tied on 8 values (the cut then
    splits them on the id). Mutants caught: the bisection's sums in float32 (the keys' order then
    moves boundary keys); a bracket of two keys taken as settled; the tied keys not split."""
    g = torch.Generator().manual_seed(3)
    rows, block = 64, 256
    ids = torch.randperm(rows * block, generator=g).view(rows, block)
    spread = torch.where(torch.arange(rows) % 2 == 0, 2**20, 4)[:, None]
    high = (torch.rand(rows, block, generator=g) * 2 * spread - spread).to(torch.int64)
    x = (high << 32) | ids
    w = torch.rand(rows, block, generator=g) ** 8  # a few large weights, many small ones
    w = torch.where(torch.rand(rows, block, generator=g) < 0.9, w / w.sum(1, keepdim=True), 0.0)
    order = x.argsort(dim=1, descending=True)
    prefix = torch.cumsum(w.gather(1, order), dim=1)  # float32, descending key order
    p = prefix.gather(1, torch.randint(4, block // 2, (rows, 1), generator=g)).squeeze(1)

    def exact_nucleus(keys, weights):
        fixed = (weights * 2.0**40).to(torch.int64)
        desc = keys.argsort(dim=1, descending=True)
        before = torch.cumsum(fixed.gather(1, desc), dim=1) - fixed.gather(1, desc)
        kept = torch.zeros_like(weights, dtype=torch.bool)
        kept.scatter_(1, desc, before < (p * 2.0**40).to(torch.int64)[:, None])
        return kept & (weights > 0)

    shuffle = torch.rand(rows, block, generator=g).argsort(dim=1)
    for keys, weights in ((x, w), (x.gather(1, shuffle), w.gather(1, shuffle))):
        cut = torch.empty(rows, dtype=torch.int64, device=DEVICE)
        reach = torch.empty(rows, dtype=torch.int32, device=DEVICE)
        _mass_cut_kernel[(1,)](keys.to(DEVICE), weights.to(DEVICE), p.to(DEVICE), cut, reach,
                               ROWS=rows, B=block)  # fmt: skip
        assert bool(reach.bool().all())
        got = (keys >= cut.cpu()[:, None]) & (weights > 0)
        assert torch.equal(got, exact_nucleus(keys, weights))


TOP_SORTED_CASES = [(2, torch.int64), (16, torch.int64), (1024, torch.int64), (2048, torch.int64),
                    (16, torch.int32)]  # fmt: skip


@pytest.mark.parametrize(("k", "dtype"), TOP_SORTED_CASES)
def test_top_sorted_equals_torch_topk(k, dtype):
    """``top_sorted`` (the bitonic top-k with the add-reduction compare-and-swap) = torch.topk's
    values on rows of random keys, duplicates, and both ends of the key type (the pair sums
    wrap)."""
    import triton.language as tl

    @triton.jit
    def topk_kernel(x_ptr, out_ptr, ROWS: tl.constexpr, B: tl.constexpr, K: tl.constexpr):
        r = tl.arange(0, ROWS)[:, None]
        x = tl.load(x_ptr + r * B + tl.arange(0, B)[None, :])
        tl.store(out_ptr + r * K + tl.arange(0, K)[None, :], kernels.top_sorted(x, K))

    rows, b = 4, 2048
    g = torch.Generator().manual_seed(k)
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max, (rows, b), generator=g, dtype=dtype)
    x[1] = torch.randint(-3, 3, (b,), generator=g)  # many duplicates
    x[2, ::3] = info.min  # EMPTY_KEY, EMPTY_VALUE_KEY
    x[2, 1::7] = info.max
    x[3] = torch.arange(b)  # already sorted (ascending)
    out = torch.empty(rows, k, dtype=dtype, device=DEVICE)
    topk_kernel[(1,)](x.to(DEVICE), out, ROWS=rows, B=b, K=k)
    assert torch.equal(out.cpu(), x.topk(k, dim=-1).values)


# Compiles stage 2 for sm_90 in a process without the interpreter (``triton.compile``, as
# ``kernels/aot.py`` does): argv = splits; prints the cubin's size.
_COMPILE_STAGE2 = """
import sys, triton
from triton.backends.compiler import GPUTarget
from flashspec_export.kernels import verify_resample as kernels

fn = kernels._truncated_summaries_kernel
splits, top_p, logprobs = int(sys.argv[1]), sys.argv[2] == "top_p", sys.argv[3] == "logprobs"
types = dict(
    ws_float_ptr="*fp32", ws_index_ptr="*i32", keys_ptr="*i64", truncated_ptr="*i32",
    top_k_ptr="*i64", top_p_ptr="*fp32", temperature_ptr="*fp32", seed_ptr="*i64",
    positions_ptr="*i64", unsettled_ptr="*i8", sel_ptr="*i64", num_rows="i32", width="i32",
    num_splits="i32", num_kept="i32", count_ptr="*i32", threshold_ptr="*fp32",
)
_, shape, warps = kernels.settle_shape(splits)  # the launch's
constexprs = dict(TOP_K=True, TOP_P=top_p, LIBDEVICE=True, ROWS=1, RETURN_LOGPROBS=logprobs,
                  **shape)
source = triton.compiler.ASTSource(fn, {n: types.get(n, "constexpr") for n in fn.arg_names},
                                   constexprs)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": warps, "enable_fp_fusion": False})
print(len(compiled.asm["cubin"]))
"""


@pytest.mark.parametrize(
    ("splits", "which", "logprobs"),
    [
        (501, "top_k", "logprobs"),
        (501, "top_k", "sample_only"),
        (2048, "top_p", "logprobs"),
        (2048, "top_p", "sample_only"),
    ],
)
def test_stage2_compiles_for_sm90(splits, which, logprobs):
    """The stage-2 kernel compiles for sm_90 without a GPU, as launched on the hand-in's 4096
    keys: top-k alone (with log-probabilities the nucleus compacted; the key widths) and with
    top-p (the cut by mass), each also without log-probabilities (the walk by score); one kernel
    for every split count up to SETTLE_SPLITS."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_STAGE2, str(splits), which, logprobs],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 0


_COMPILE_HAND_IN_TILES = """
import triton
from triton.backends.compiler import GPUTarget
from flashspec_export.kernels import verify_resample as kernels

fn = kernels._verify_tiles_kernel
pointers = dict(
    hidden_ptr="*bf16", lm_head_ptr="*bf16", temperature_ptr="*fp32", seed_ptr="*i64",
    positions_ptr="*i64", ws_float_ptr="*fp32", ws_index_ptr="*i32", truncated_ptr="*i32",
    allowed_ptr="*i32", threshold_ptr="*fp32", count_ptr="*i32",
    hand_in_ptr="*i64",
)
constexprs = dict(
    HIDDEN_SIZE=4096, DOT_PRECISION="tf32", DOT_IN_FP32=False, LIBDEVICE=True,
    RETURN_LOGPROBS=True, BLOCK_N=16, BLOCK_V=64, BLOCK_H=64, EPI_ROWS=4, MASKED=True,
    HAND_IN=True, stride_hh=1, stride_vh=1,
)
types = {n: pointers.get(n, "constexpr" if n in constexprs else "i32") for n in fn.arg_names}
source = triton.compiler.ASTSource(fn, types, constexprs)
compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                          options={"num_warps": 4, "num_stages": 3})
print(len(compiled.asm["cubin"]))
"""


def test_hand_in_tile_kernel_compiles_for_sm90():
    """The portable tile kernel with the hand-in (``_hand_in_tile``: a relaxed atomic per row and
    tile, a cumulative sum over the tile's ids) compiles for sm_90 without a GPU, masked and with
    the online softmax top-p needs."""
    import os
    import subprocess
    import sys

    pytest.importorskip("triton.backends.nvidia")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", _COMPILE_HAND_IN_TILES],
        capture_output=True, text=True, env=env, timeout=300, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert int(result.stdout.split()[-1]) > 0


@triton.jit
def _selection_cut_kernel(x_ptr, on_ptr, need_ptr, most_ptr, cut_ptr, exact_ptr,
                          ROWS: tl.constexpr, B: tl.constexpr):  # fmt: skip
    r = tl.arange(0, ROWS)
    at = r[:, None] * B + tl.arange(0, B)[None, :]
    on = tl.load(on_ptr + at) != 0
    need, most = tl.load(need_ptr + r), tl.load(most_ptr + r)
    cut, exact = kernels._selection_cut(tl.load(x_ptr + at), on, need, most)
    tl.store(cut_ptr + r, cut)
    tl.store(exact_ptr + r, exact.to(tl.int32))


def test_selection_cut_puts_need_to_most_keys_above_it():
    """``_selection_cut`` on rows of unique order keys whose high words are spread wide (not
    exact: ``need`` to ``most`` keys of ``on`` above the cut) or tied on a few values (exact when
    more than ``most`` tie at the boundary: exactly ``need`` at or above the cut, fewer above
    it), with ``most`` = ``need`` (top-k) and ``2 · need`` (top-p's selection). Mutant caught:
    the bisection moving up past a mid with ``need - 1`` keys above it (``c >= need - 1``)."""
    g = torch.Generator().manual_seed(0)
    rows, block = 16, 256
    spread = torch.where(torch.arange(rows) % 2 == 0, 2**31 - 1, 4)[:, None]
    high = (torch.rand(rows, block, generator=g) * spread - spread / 2).to(torch.int64)
    ids = torch.randperm(rows * block, generator=g).view(rows, block)
    x = (high << 32) | ids
    on = torch.rand(rows, block, generator=g) < 0.8
    need = torch.randint(1, 150, (rows,), generator=g)
    most = torch.where(torch.arange(rows) % 4 < 2, need, 2 * need)
    cut, exact = (torch.empty(rows, dtype=t, device=DEVICE) for t in (torch.int64, torch.int32))
    _selection_cut_kernel[(1,)](
        x.to(DEVICE), on.to(torch.int32).to(DEVICE), need.to(torch.int32).to(DEVICE),
        most.to(torch.int32).to(DEVICE), cut, exact, ROWS=rows, B=block,
    )  # fmt: skip
    cut, exact = cut.cpu(), exact.cpu().bool()
    for r in range(rows):
        keys = x[r][on[r]]
        above, at_or_above = int((keys > cut[r]).sum()), int((keys >= cut[r]).sum())
        if exact[r]:
            assert above < need[r] and at_or_above == need[r], (r, above, at_or_above, need[r])
        else:
            assert need[r] <= above <= most[r], (r, above, need[r], most[r])
    assert bool(exact.any()) and not bool(exact.all()), "both kinds of cut taken"


# ---- stage 2 on the Hopper kernel's hand-in (``COUNTED``: ``hopper_tiles._hand_in_chunk``)


@pytest.mark.parametrize("which", ["top_k", "top_p", "both"])
def test_stage2_settles_the_hopper_hand_in(which):
    """Stage 2 from the Hopper kernel's hand-in (raw dots above a threshold, in no order, rekeyed
    by dot / T): each settled row's sample is the reference's truncated Gumbel-max over the whole
    row (``reference/truncation.py``, ``reference/noise.py``), and exactly the rows the hand-in
    cannot settle are reported: a threshold above the k-th dot (top-k) or inside the nucleus, a
    count past the buffer, a NaN threshold. A threshold of -FLT_MAX (every finite dot, as for a
    mask allowing few ids) settles its row from a complete hand-in."""
    from flashspec_export.reference import noise, truncation

    g = torch.Generator().manual_seed(7)
    n, width, vocab, tile, cap = 4, 3, 1024, 128, 256
    rows = n * width
    temperature = torch.tensor([1.0, 0.0, 0.7, 1.3])  # a greedy sequence
    top_k = torch.tensor([5, 40, 8, 3]) if which != "top_p" else None
    top_p = torch.tensor([0.9, 0.8, 0.6, 0.95]) if which != "top_k" else None
    dots = torch.randn(rows, vocab, generator=g) * 4
    dots[4, 10:] = float("-inf")  # a masked row: ten allowed ids
    scale = torch.where(temperature < 1e-5, 1.0, temperature).repeat_interleave(width)
    logits = dots / scale[:, None]  # IEEE division, as the kernels' div_rn
    ordered = dots.sort(dim=1, descending=True).values
    thresholds = ordered[:, 120].clone()  # 121 dots handed in: every top-k and nucleus here
    thresholds[0] = ordered[0, 2]  # 3 dots: below k = 5, and (top-p) inside the nucleus
    thresholds[4] = -torch.finfo(torch.float32).max  # every finite dot: complete
    thresholds[7] = ordered[7, 400]  # 401 dots: past the buffer of 256
    thresholds[9] = float("nan")  # no threshold: nothing handed in
    keys, counts = _counted_hand_in(dots, thresholds, cap, g)
    splits = vocab // tile
    m = logits.view(rows, splits, tile).amax(dim=-1)
    s = torch.exp(logits.view(rows, splits, tile) - m[..., None]).sum(dim=-1)
    floats = torch.randn(kernels.NUM_FLOAT_FIELDS, rows, splits, generator=g)
    floats[kernels.F_MAX.value], floats[kernels.F_SUM_EXP.value] = m, s
    index = torch.randint(0, vocab, (rows, splits), generator=g, dtype=torch.int32)
    workspace = kernels.VerifyWorkspace(floats.to(DEVICE), index.to(DEVICE))
    seed, positions = torch.arange(n) * 5 + 2, torch.randint(0, 1000, (n,), generator=g)
    truncated = torch.ones(n, dtype=torch.int32)
    args = (truncated, top_k, top_p, temperature, seed, positions)
    unsettled = kernels._truncated_summaries(
        workspace, keys.to(DEVICE), counts.to(DEVICE), thresholds.to(DEVICE),
        *(None if t is None else t.to(DEVICE) for t in args),
    ).cpu()  # fmt: skip

    limit = truncation.threshold(logits.view(n, width, vocab), top_k, top_p)
    ids = torch.arange(vocab)
    kept = truncation.kept(logits.view(n, width, vocab), ids, limit).view(rows, vocab)
    position = (positions[:, None] + torch.arange(width)).reshape(rows)
    a, b = noise.row_keys(seed.repeat_interleave(width), position, noise.STREAM_GUMBEL)
    gumbel = noise.gumbel_from_bits(noise.token_bits(a[:, None], b[:, None], ids))
    greedy = (temperature < 1e-5).repeat_interleave(width)[:, None]
    score = torch.where(kept, torch.where(greedy, logits, logits + gumbel), float("-inf"))
    want = score.argmax(dim=1)

    expected = torch.zeros(rows, dtype=torch.bool)
    expected[[7, 9]] = True
    expected[0] = True  # k = 5 past its 3 dots; or the nucleus past them
    assert torch.equal(unsettled, expected), (unsettled, expected)
    settled = ~expected
    assert torch.equal(workspace.index[:, 0].cpu()[settled], want[settled].to(torch.int32))
    assert bool((workspace.floats[kernels.F_BEST_SCORE.value, settled, 0].cpu() == 0).all())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("rows", "tune"), [(3, None), (40, None), (40, (16, 16, 16, 3, 4, 3))])
def test_sampled_logits_are_the_strided_head_s(rows, tune, dtype):
    """``sampled_logits``: its partials sum to the logits of every ``HAND_IN_STRIDE``-th id below
    the vocabulary, for a hidden size that is not a multiple of the kernel's K block, a partial
    last block of sampled ids, and three splits of the hidden size (the last one short)."""
    g = torch.Generator().manual_seed(5)
    vocab, h = 5000, 72
    hidden = torch.randn(rows, h, generator=g).to(dtype)
    lm_head = torch.randn(vocab + 40, h, generator=g).to(dtype)  # padding rows past the vocab
    partials = kernels.sampled_logits(hidden.to(DEVICE), lm_head.to(DEVICE), vocab, tune)
    assert partials.shape[0] == (1 if tune is None else 3)
    got = partials.sum(0).cpu()
    want = hidden.float() @ lm_head[: vocab : kernels.HAND_IN_STRIDE].float().T
    assert got.shape == want.shape == (rows, -(-vocab // kernels.HAND_IN_STRIDE))
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-4)


def test_the_sampled_splits_fit_the_threshold_kernel():
    """The threshold kernel sums at most ``MAX_K_SPLITS`` partials a logit (its loads unrolled):
    every ``SAMPLED_TUNED`` launch (the CUDA library's too) fits, and a tune past it is refused
    by name rather than summed in part."""
    assert max(tune[3] for _, tune in kernels.SAMPLED_TUNED) <= kernels.MAX_K_SPLITS
    hidden = torch.zeros(2, 16 * 9, device=DEVICE)
    with pytest.raises(ValueError, match="tune: K_SPLITS 9 past the threshold's 8"):
        kernels.sampled_logits(hidden, torch.zeros(300, 16 * 9, device=DEVICE), 300,
                               tune=(16, 16, 16, 9, 4, 3))  # fmt: skip


@pytest.mark.parametrize("masked", [False, True])
def test_hand_in_thresholds_take_the_target_rank_of_the_sampled_logits(masked):
    """``_hand_in_thresholds``: per truncated row, the logit of rank ``target · sampled / V``
    among every ``HAND_IN_STRIDE``-th id's allowed logits (target 8 · k for top-k, at least
    ``HAND_IN_MIN``; ``HAND_IN_TARGET`` for k = 0), -FLT_MAX where they hold too few finite
    ones, NaN for untruncated rows; and the hand-in's counts zeroed."""
    g = torch.Generator().manual_seed(3)
    n, width, h, vocab = 4, 2, 16, 80000
    stride = kernels.HAND_IN_STRIDE
    hidden = torch.randn(n * width, h, generator=g)
    lm_head = torch.randn(vocab, h, generator=g)
    top_k = torch.tensor([10, 0, 200, 0])
    top_p = torch.tensor([1.0, 0.9, 1.0, 1.0])
    allowed = None
    if masked:
        keep = torch.rand(n, width, vocab, generator=g) < 0.5
        keep[0, 1] = False
        keep[0, 1, :stride] = True  # one sampled id allowed: too few
        allowed = truncation.pack_allowed(keep)
    counts = torch.full((n * width,), 7, dtype=torch.int32, device=DEVICE)
    truncated = torch.full((n,), 7, dtype=torch.int32, device=DEVICE)
    got = kernels._hand_in_thresholds(
        hidden.to(DEVICE), lm_head.to(DEVICE), vocab, top_k.to(DEVICE), top_p.to(DEVICE), width,
        None if allowed is None else allowed.to(DEVICE), truncated, counts,
    ).cpu()  # fmt: skip
    assert not bool(counts.any()), "the hand-in's counts not zeroed"
    assert truncated.tolist() == [1, 1, 1, 0], truncated
    truncated = truncated.cpu()
    sample = kernels.sampled_logits(hidden.to(DEVICE), lm_head.to(DEVICE), vocab).sum(0).cpu()
    torch.testing.assert_close(sample, hidden @ lm_head[::stride].T, rtol=1e-5, atol=1e-5)
    if masked:
        sample = sample.masked_fill(~keep.view(n * width, vocab)[:, ::stride], float("-inf"))
    sampled = sample.shape[1]
    for r in range(n * width):
        k = int(top_k[r // width])
        target = min(max(8 * k, kernels.HAND_IN_MIN), kernels.HAND_IN_TARGET) if k else (
            kernels.HAND_IN_TARGET
        )  # fmt: skip
        rank = min(max(1, target * sampled // vocab), kernels.HAND_IN_TARGET // stride)
        want = sample[r].sort(descending=True).values[rank - 1].item()
        want = max(want, -torch.finfo(torch.float32).max)
        if truncated[r // width] == 0:
            assert got[r].isnan(), r
        else:
            assert got[r].item() == want, (r, got[r].item(), want)
    if masked:
        assert got[1].item() == -torch.finfo(torch.float32).max
