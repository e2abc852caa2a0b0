"""Statistical exactness: what VerifyResample emits is distributed as the target's own sampling.

Set-up: ``lm_head`` is the identity, so each hidden row *is* a logit vector ``z`` and the target
distribution of row i is ``p_i = softmax(z_i / T)``, known in closed form. Each test draws
``N_SAMPLES`` = 20 000 independent steps (one per seed) and applies Pearson's chi-square test at
level ``ALPHA`` = 1e-3 (tests/stats.py). Seeds are fixed, so the outcome is deterministic.

The greedy-draft op uses the coupled rule: per row one two-level sample ``y`` (a Gumbel-max over
blocks of 64 ids, then an id inside the block by inverse CDF), drafts are accepted while they
equal ``y``, and the step emits ``y_0 .. y_k``. Its tests spread the 8 categories over four blocks
of a 256-id head (``tests/spread.py``), so both levels are exercised.

Power: every case states the deviation of a named wrong sampler; ``test_wrong_samplers_are_caught``
runs those wrong samplers through the same tests and requires rejection, and
``test_power_against_residual_bug`` computes the analytic power (noncentral chi-square).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import noise, sampled_verify
from flashspec_export.reference.sampled_verify import (
    acceptance_uniform,
    exponential_race,
    select_emitted,
)
from flashspec_export.reference.verify_resample import (
    VerifyResult,
    block_samples,
    count_accepted,
)
from tests import spread
from tests.stats import ALPHA, chi_square_pvalue, power

N_SAMPLES = 20_000
VOCAB = 8
DRAFT = 2  # the drafted token of row 0
ROW1 = np.array([1.0, -1.0, 0.0, 2.0, 0.5, -0.5, 0.0, 1.0])  # logits of row 1 (after the draft)
ROW2 = np.array([0.0, 1.5, -1.0, 0.5, 0.0, 2.0, -0.5, 0.5])
DRAFT1 = 3  # the drafted token of row 1

# Row-0 logit vectors (before temperature), all with the draft at index DRAFT.
CASES = {
    "peaked": np.array([0.0, 0.5, 2.5, 1.0, 0.0, -1.0, 0.0, 0.0]),
    "flat": np.zeros(VOCAB),
    "p(x)~1": np.array([0.0, 0.0, 8.0, 0.0, 0.0, 0.0, 0.0, 0.0]),  # p(x) = 0.9976 at T = 1
    "p(x)~0": np.array([0.0, 0.0, -6.0, 0.0, 0.5, 0.0, 0.0, 0.0]),  # p(x) = 3e-4 at T = 1
    "tie": np.array([2.0, 0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 0.0]),  # draft tied with token 0
}
TEMPERATURES = [0.5, 1.0, 2.0]
# The fused Triton and CUDA kernels run these tests on a GPU (Triton under the CPU interpreter
# would take minutes; its CPU parity with the reference is in tests/parity).
BACKENDS = [
    "reference",
    "standard",
    pytest.param("triton", marks=pytest.mark.gpu),
    pytest.param("cuda", marks=pytest.mark.cuda_kernels),
]


def softmax(z: np.ndarray, temperature: float) -> np.ndarray:
    e = np.exp((z - z.max()) / temperature)
    return e / e.sum()


def pair_probs(p0: np.ndarray, p1: np.ndarray, q0: np.ndarray) -> np.ndarray:
    """Law of the first two emitted tokens as categories: ``y`` (step stopped after one token)
    and ``V + y * V + z`` (first token y was an accepted draft, second z).

    For a draft x ~ q0: P(accepted, x = y) = min(q0(y), p0(y)), then the next token is drawn
    from p1 (its hidden state is that of the accepted prefix); P(first = y, stop) =
    p0(y) - min(q0(y), p0(y)). A greedy draft is q0 = one-hot(x).
    """
    accepted = np.minimum(q0, p0)
    return np.concatenate([p0 - accepted, (accepted[:, None] * p1[None, :]).ravel()])


def pair_categories(tokens: torch.Tensor, emitted: torch.Tensor) -> np.ndarray:
    first, second = tokens[:, 0].numpy(), tokens[:, 1].numpy()
    return np.where(emitted.numpy() == 1, first, VOCAB + first * VOCAB + second)


def _hidden(rows: list[np.ndarray]) -> torch.Tensor:
    """[N_SAMPLES, len(rows), V] fp32 hidden states = the logit rows (lm_head = identity)."""
    return torch.tensor(np.stack(rows), dtype=torch.float32)[None].expand(N_SAMPLES, -1, -1)


def greedy_draft_step(rows, drafts, temperature, backend="reference"):
    """N_SAMPLES independent VerifyResample steps, seeds 0..N-1 (on the GPU for Triton), on the
    spread head; returns the emitted categories and the counts."""
    n = N_SAMPLES
    device = "cuda" if backend in ("triton", "cuda") else "cpu"
    tokens, emitted = ops.verify_resample(
        spread.hidden(rows, n).to(device),
        spread.lm_head(device),
        spread.ids([drafts]).to(device).expand(n, -1),
        temperature,
        torch.arange(n, device=device),
        torch.full((n,), 100, device=device),
        backend=backend,
    )
    return spread.categories(tokens.cpu()), emitted.cpu()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("case", CASES)
def test_first_token_is_target_distributed(backend, temperature, case):
    """First emitted token ~ softmax(z0 / T) (one draft, x = 2)."""
    z0 = CASES[case]
    tokens, _ = greedy_draft_step([z0, ROW1], [DRAFT], temperature, backend)
    assert chi_square_pvalue(tokens[:, 0].numpy(), softmax(z0, temperature)) > ALPHA


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("case", CASES)
def test_first_two_tokens_follow_two_step_sampling(backend, temperature, case):
    """(first, second) ~ the target's own two-step sampling given the drafts (γ = 2, so the
    second token comes from the middle row: accepted draft or recovered)."""
    z0 = CASES[case]
    tokens, emitted = greedy_draft_step([z0, ROW1, ROW2], [DRAFT, DRAFT1], temperature, backend)
    p0, p1 = softmax(z0, temperature), softmax(ROW1, temperature)
    expected = pair_probs(p0, p1, np.eye(VOCAB)[DRAFT])
    assert chi_square_pvalue(pair_categories(tokens, emitted), expected) > ALPHA


@pytest.mark.parametrize("temperature", TEMPERATURES)
def test_number_emitted_follows_acceptance_chain(temperature):
    """γ = 4 drafts: P(num_emitted = k) = Π_{i<k-1} p_i(d_i) · (1 - p_{k-1}(d_{k-1})), and
    Π_i p_i(d_i) for k = γ + 1 (acceptances are independent given the drafts)."""
    rows = [CASES["peaked"], ROW1, ROW2, CASES["tie"], ROW1]
    drafts = [DRAFT, DRAFT1, 5, 0]
    _, emitted = greedy_draft_step(rows, drafts, temperature)
    accept = np.array([softmax(rows[i], temperature)[d] for i, d in enumerate(drafts)])
    survive = np.concatenate([[1.0], np.cumprod(accept)])
    expected = np.concatenate([survive[:-1] * (1 - accept), survive[-1:]])
    assert chi_square_pvalue(emitted.numpy() - 1, expected) > ALPHA


@pytest.mark.parametrize("backend", BACKENDS)
def test_greedy_target_is_deterministic_argmax(backend):
    """T = 0: every seed emits the argmax (ties: lowest index)."""
    tokens, emitted = greedy_draft_step([CASES["tie"], ROW1], [DRAFT], 0.0, backend)
    assert bool((tokens[:, 0] == 0).all()) and bool((emitted == 1).all())


# --- sampled drafts (general q): Leviathan et al. Algorithm 1 -----------------------------------

Q0 = softmax(np.array([0.0, 1.0, 1.5, -1.0, 0.0, 0.5, -0.5, 2.0]), 1.0)
Q1 = softmax(np.array([1.0, 0.0, 0.0, 1.5, -1.0, 0.0, 0.5, 0.0]), 1.0)


def sampled_step(rows, q_rows, temperature, residual="max(0, p - q)", accept="min(1, p/q)"):
    """N_SAMPLES steps of the sampled-draft reference, drafts drawn from q by the draft stream.
    ``residual`` / ``accept`` select wrong variants for the power test (defaults are correct)."""
    n = N_SAMPLES
    logits = _hidden(rows)
    q = torch.tensor(np.stack(q_rows), dtype=torch.float32)[None].expand(n, -1, -1)
    seeds, positions = torch.arange(n), torch.full((n,), 100)
    temps = torch.full((n,), temperature)
    drafts = sampled_verify.sample_draft(q, seeds, positions)
    if residual == "max(0, p - q)" and accept == "min(1, p/q)":
        return drafts, sampled_verify.verify_sampled(logits, q, drafts, temps, seeds, positions)
    # Wrong variants, built from the same pieces.
    gamma = drafts.shape[1]
    p = sampled_verify.target_probs(logits, temps)
    p_x = p[:, :gamma].gather(-1, drafts[..., None]).squeeze(-1)
    q_x = q.gather(-1, drafts[..., None]).squeeze(-1)
    u = acceptance_uniform(seeds, positions, gamma)
    accepted = u <= p_x if accept == "p" else u * q_x <= p_x
    weights = p[:, :gamma] if residual == "p" else (p[:, :gamma] - q).clamp_min(0)
    weights = torch.cat([weights, p[:, gamma:]], dim=1)
    row_pos = positions[:, None] + torch.arange(gamma + 1)
    candidates = exponential_race(weights, seeds, row_pos, noise.STREAM_GUMBEL)
    k = count_accepted(accepted)
    return drafts, VerifyResult(select_emitted(k, drafts, candidates, -1), k + 1)


def test_draft_sampler_follows_q():
    drafts, _ = sampled_step([CASES["flat"], ROW1], [Q0], 1.0)
    assert chi_square_pvalue(drafts[:, 0].numpy(), Q0) > ALPHA


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("case", CASES)
def test_sampled_first_token_is_target_distributed(temperature, case):
    z0 = CASES[case]
    _, result = sampled_step([z0, ROW1], [Q0], temperature)
    assert chi_square_pvalue(result.tokens[:, 0].numpy(), softmax(z0, temperature)) > ALPHA


@pytest.mark.parametrize("temperature", TEMPERATURES)
@pytest.mark.parametrize("case", CASES)
def test_sampled_first_two_tokens_follow_two_step_sampling(temperature, case):
    z0 = CASES[case]
    _, result = sampled_step([z0, ROW1, ROW2], [Q0, Q1], temperature)
    expected = pair_probs(softmax(z0, temperature), softmax(ROW1, temperature), Q0)
    assert chi_square_pvalue(pair_categories(result.tokens, result.num_emitted), expected) > ALPHA


def test_sampled_with_one_hot_q_has_the_greedy_draft_law():
    """A one-hot q is a greedy draft: Leviathan's rule then has the greedy op's pair law (its
    tokens differ: it accepts by a uniform of its own instead of coupling through y)."""
    rows = [CASES["peaked"], ROW1, ROW2]
    one_hot = [np.eye(VOCAB)[DRAFT], np.eye(VOCAB)[DRAFT1]]
    drafts, result = sampled_step(rows, one_hot, 1.0)
    assert bool((drafts == torch.tensor([DRAFT, DRAFT1])).all())
    expected = pair_probs(softmax(rows[0], 1.0), softmax(ROW1, 1.0), np.eye(VOCAB)[DRAFT])
    assert chi_square_pvalue(pair_categories(result.tokens, result.num_emitted), expected) > ALPHA
    tokens, _ = greedy_draft_step(rows, [DRAFT, DRAFT1], 1.0, "standard")
    assert not torch.equal(result.tokens, tokens)


# --- the tests have power -------------------------------------------------------------------


def _row_samples(logits, seeds, row_pos, streams=(noise.STREAM_GUMBEL, noise.STREAM_PICK)):
    """Each row's two-level sample (``reference.verify_resample.block_samples`` over the whole
    spread row ``logits [N, R, 256]``), its noise keyed by (seed, ``row_pos [N, R]``) on
    ``streams`` (the blocks' Gumbels, the pick's uniform); returns categories."""
    keys = [noise.row_keys(seeds[:, None], row_pos, stream) for stream in streams]
    score, index = block_samples(logits, 0, *keys)
    return spread.categories(index.gather(-1, score.argmax(dim=-1, keepdim=True)).squeeze(-1))


def _greedy_mutant(rows, drafts, temperature, mutation):
    """Materialised greedy-draft verification (the coupled rule) with one deliberate bug."""
    n, gamma = N_SAMPLES, len(drafts)
    logits = _hidden(rows) / temperature  # [N, γ + 1, 8]
    spread_logits = (spread.hidden(rows, n) @ spread.lm_head().T) / temperature  # [N, γ + 1, 256]
    d = torch.tensor([drafts]).expand(n, -1)
    seeds, positions = torch.arange(n), torch.full((n,), 100)
    row_pos = positions[:, None] + torch.arange(gamma + 1)  # [N, γ + 1]
    y = _row_samples(spread_logits, seeds, row_pos)  # [N, γ + 1]
    accepted = d == y[:, :gamma]
    emitted = y
    if mutation == "accept by a separate uniform but emit the Gumbel argmax":
        p_x = torch.softmax(logits[:, :gamma], dim=-1).gather(-1, d[..., None]).squeeze(-1)
        accepted = acceptance_uniform(seeds, positions, gamma) <= p_x
    elif mutation == "accept with the next row's sample":
        accepted = d == y[:, 1:]
    elif mutation == "one noise vector for every row":
        row0 = positions[:, None].expand(-1, gamma + 1)  # row 0's noise on every row
        emitted = _row_samples(spread_logits, seeds, row0)
        accepted = d == emitted[:, :gamma]
    elif mutation == "blocks scored by their max logit, not their mass":
        keys = [
            noise.row_keys(seeds[:, None], row_pos, st)
            for st in (noise.STREAM_GUMBEL, noise.STREAM_PICK)
        ]
        score, index = block_samples(spread_logits, 0, *keys)
        blocks = spread_logits.unflatten(-1, (-1, 64))
        max_only = score - torch.logsumexp(blocks, dim=-1) + blocks.amax(dim=-1)  # M_b + g_b
        emitted = spread.categories(index.gather(-1, max_only.argmax(-1, keepdim=True))[..., 0])
        accepted = d == emitted[:, :gamma]
    elif mutation == "recovery redrawn from p":
        streams = (noise.STREAM_DRAFT, noise.STREAM_ACCEPT)
        emitted = _row_samples(spread_logits, seeds, row_pos, streams)
    k = count_accepted(accepted)
    return select_emitted(k, d, emitted, -1), k + 1


GREEDY_MUTANTS = [
    "accept by a separate uniform but emit the Gumbel argmax",  # decoupled: x over-emitted
    "accept with the next row's sample",  # off-by-one in the acceptance rule
    "one noise vector for every row",  # positions share noise: rows correlated
    "recovery redrawn from p",  # a rejection may emit the draft again
    "blocks scored by their max logit, not their mass",  # the first level's law is wrong
]


@pytest.mark.parametrize("mutation", [None, *GREEDY_MUTANTS])
def test_wrong_samplers_are_caught(mutation):
    """Each wrong greedy-draft sampler fails the pair test on the 'peaked' case at T = 1;
    the harness itself (mutation None) passes and equals the standard path."""
    rows = [CASES["peaked"], ROW1, ROW2]
    tokens, emitted = _greedy_mutant(rows, [DRAFT, DRAFT1], 1.0, mutation)
    expected = pair_probs(softmax(rows[0], 1.0), softmax(ROW1, 1.0), np.eye(VOCAB)[DRAFT])
    pvalue = chi_square_pvalue(pair_categories(tokens, emitted), expected)
    if mutation is None:
        assert pvalue > ALPHA
        s_tokens, _ = greedy_draft_step(rows, [DRAFT, DRAFT1], 1.0, "standard")
        assert torch.equal(tokens, s_tokens)
    else:
        assert pvalue < ALPHA, mutation


@pytest.mark.parametrize(
    "variant", [dict(residual="p"), dict(accept="p")], ids=["residual is p", "accept ignores q"]
)
def test_wrong_sampled_draft_rules_are_caught(variant):
    """Resampling from p instead of max(0, p - q), or accepting with p(x) instead of
    min(1, p(x)/q(x)), fails the sampled pair test ('peaked', T = 1)."""
    rows = [CASES["peaked"], ROW1, ROW2]
    _, result = sampled_step(rows, [Q0, Q1], 1.0, **variant)
    expected = pair_probs(softmax(rows[0], 1.0), softmax(ROW1, 1.0), Q0)
    assert chi_square_pvalue(pair_categories(result.tokens, result.num_emitted), expected) < ALPHA


def _measurable(case: str, temperature: float) -> bool:
    """The residual bug moves (1 - p(x))·p(x) of mass; below 1e-3 no sample size used here can
    see it (p(x) ~ 0 at any T, p(x) ~ 1 at T <= 1: the draft is (almost) never or always kept)."""
    px = softmax(CASES[case], temperature)[DRAFT]
    return (1 - px) * px >= 1e-3


@pytest.mark.parametrize(
    ("case", "temperature"),
    [(c, t) for c in CASES for t in TEMPERATURES if _measurable(c, t)],
)
def test_power_against_residual_bug(case, temperature):
    """Analytic power of the first-token test against 'residual includes the draft'
    (P'(x) = p(x) + (1 - p(x))·p(x), P'(y) = (1 - p(x))·p(y)): at least 0.99 with N_SAMPLES at
    level ALPHA wherever the bug moves at least 1e-3 of probability mass."""
    p = softmax(CASES[case], temperature)
    px = p[DRAFT]
    wrong = (1 - px) * p
    wrong[DRAFT] += px
    assert power(p, wrong, N_SAMPLES) >= 0.99
