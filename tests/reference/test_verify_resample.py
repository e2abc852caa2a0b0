"""VerifyResample: the tiled reference against the materialised standard path, golden cases,
determinism and independence from tiling and batch layout."""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import verify_resample as ref
from tests.cases import make_case
from tests.tolerances import LOGPROB_ATOL, LOGPROB_RTOL

DTYPES = [torch.float32, torch.bfloat16, torch.float16]
MIXED_T = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.0, 0.7])


def _run(case, backend, **kw):
    hidden, lm_head, drafts, temps, seeds, positions, vocab = case
    return ops.verify_resample(
        hidden,
        lm_head,
        drafts,
        temps,
        seeds,
        positions,
        vocab,
        return_logprobs=True,
        backend=backend,
        **kw,
    )


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("gamma", range(9))
@pytest.mark.parametrize("temperature", [0.0, 0.5, 1.0, 2.0, "mixed"])
def test_reference_matches_standard(dtype, gamma, temperature):
    """Same seeds -> identical tokens from the tiled reference and the materialised path.
    The vocabulary (1000 of 1024 padded rows) is not a multiple of the reference tile."""
    temps = MIXED_T if temperature == "mixed" else temperature
    case = make_case(7, gamma, 40, 1000, dtype, padded_vocab=1024, temperature=temps, seed=gamma)
    tokens, emitted, logprobs = _run(case, "reference")
    s_tokens, s_emitted, s_logprobs = _run(case, "standard")
    assert torch.equal(tokens, s_tokens)
    assert torch.equal(emitted, s_emitted)
    torch.testing.assert_close(logprobs, s_logprobs, atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)


def test_reference_matches_standard_many_cases():
    """A wider sweep over vocabularies, with every outcome (1..γ+1 emitted) represented, so
    the equality is not vacuous."""
    for n, vocab, padded in [(400, 111, 111), (400, 4099, 4160), (100, 32000, 32000)]:
        case = make_case(n, 4, 24, vocab, torch.float32, padded_vocab=padded, seed=vocab)
        tokens, emitted, _ = _run(case, "reference")
        s_tokens, s_emitted, _ = _run(case, "standard")
        assert torch.equal(tokens, s_tokens)
        assert torch.equal(emitted, s_emitted)
        assert set(emitted.tolist()) == {1, 2, 3, 4, 5}, vocab


def test_output_layout():
    """Accepted drafts, then one recovered/bonus token, then -1; logprobs are 0 past it."""
    case = make_case(64, 5, 16, 300, torch.float32, seed=3)
    tokens, emitted, logprobs = _run(case, "reference")
    drafts = case[2]
    for n in range(64):
        k = int(emitted[n])
        assert 1 <= k <= 6
        assert torch.equal(tokens[n, : k - 1], drafts[n, : k - 1])
        assert 0 <= int(tokens[n, k - 1]) < 300
        if k - 1 < 5:  # a rejection: the recovered token differs from the rejected draft
            assert int(tokens[n, k - 1]) != int(drafts[n, k - 1])
        assert bool((tokens[n, k:] == -1).all())
        assert bool((logprobs[n, k:] == 0).all()) and bool((logprobs[n, :k] <= 0).all())


def test_logprobs_are_target_log_softmax():
    hidden, lm_head, drafts, temps, seeds, positions, _ = make_case(
        9, 3, 16, 200, torch.float32, temperature=MIXED_T[:2].repeat(5)[:9], seed=5
    )
    tokens, emitted, logprobs = ops.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, return_logprobs=True
    )
    scale = torch.where(temps == 0, 1.0, temps)[:, None, None]
    expected = torch.log_softmax(hidden @ lm_head.T / scale, dim=-1)
    for n in range(9):
        for i in range(int(emitted[n])):
            want = float(expected[n, i, tokens[n, i]])
            assert float(logprobs[n, i]) == pytest.approx(want, abs=LOGPROB_ATOL)


def _one_hot_case(logits_rows, drafts, temperature, seed=0):
    """lm_head = identity, so hidden rows are the logits (times T): hand-made distributions."""
    vocab = logits_rows.shape[-1]
    hidden = logits_rows[None].float()  # [1, γ+1, V]
    lm_head = torch.eye(vocab)
    return ops.verify_resample(
        hidden,
        lm_head,
        torch.tensor([drafts], dtype=torch.int64),
        temperature,
        seed,
        0,
        return_logprobs=True,
    )


def test_golden_greedy_target():
    """T = 0: drafts 2 and 0 match the argmax of rows 0 and 1; row 2's argmax is 3, not the
    draft 1, so the step emits [2, 0, 3] and stops (the bonus row 3 is never reached)."""
    rows = torch.tensor([[0.0, 1, 5, 2], [9.0, 1, 5, 2], [0.0, 4, 1, 6], [7.0, 0, 0, 0]])
    tokens, emitted, _ = _one_hot_case(rows, [2, 0, 1], 0.0)
    assert tokens.tolist() == [[2, 0, 3, -1]]
    assert emitted.tolist() == [3]


def test_golden_greedy_ties_lowest_index():
    """T = 0 ties go to the lowest index: the draft 1 is rejected against the tie {0, 1}."""
    rows = torch.tensor([[3.0, 3.0, 1.0], [0.0, 0.0, 1.0]])
    tokens, emitted, _ = _one_hot_case(rows, [1], 0.0)
    assert tokens.tolist() == [[0, -1]] and emitted.tolist() == [1]
    tokens, _, _ = _one_hot_case(rows, [0], 0.0)
    assert tokens.tolist() == [[0, 2]]  # accepted, then the bonus argmax of row 1


def test_golden_certain_accept_and_certain_reject():
    """p(x) = 1 (all other logits 200 below) is accepted for every seed; p(x) = 0 (the draft
    200 below) is rejected for every seed and the recovered token is never the draft."""
    sure = torch.tensor([[0.0, -200.0, -200.0], [-200.0, 0.0, -200.0], [0.0, 0.0, 0.0]])
    for seed in range(50):
        tokens, emitted, _ = _one_hot_case(sure, [0, 1], 1.0, seed)
        assert tokens[0, :2].tolist() == [0, 1] and emitted.tolist() == [3]
    never = torch.tensor([[-200.0, 0.0, 0.0], [0.0, 0.0, 0.0]])
    for seed in range(50):
        tokens, emitted, _ = _one_hot_case(never, [0], 1.0, seed)
        assert emitted.tolist() == [1] and int(tokens[0, 0]) in (1, 2)


# Frozen from the reference when the two-level sample landed (regenerate only with a rule change):
# make_case(7, 3, 8, 300, float32, temperature=MIXED_T, seed=16), a vocabulary of five blocks.
# Seeds and positions are random int64s, so the noise decides these tokens; every outcome 1..4
# occurs.
GOLDEN_CASE = dict(n=7, gamma=3, hidden_size=8, vocab=300, dtype=torch.float32, seed=16)
GOLDEN_TOKENS = [
    [4, 180, 17, 112],
    [152, 82, -1, -1],
    [112, -1, -1, -1],
    [147, -1, -1, -1],
    [85, 145, 42, -1],
    [180, 169, 256, -1],
    [0, 169, -1, -1],
]


@pytest.mark.parametrize("backend", ["reference", "standard"])
def test_golden_coupled_rule_tokens(backend):
    case = make_case(**GOLDEN_CASE, temperature=MIXED_T)
    tokens, emitted, _ = _run(case, backend)
    assert tokens.tolist() == GOLDEN_TOKENS
    assert emitted.tolist() == [sum(t >= 0 for t in row) for row in GOLDEN_TOKENS]


def test_every_emitted_token_is_its_positions_own_sample():
    """The coupled rule: the token a step emits at row i is what a γ = 0 step at position
    p + i emits from the same hidden row (its own Gumbel-max sample), whatever the drafts.
    Drafts are set to those samples up to a per-sequence cut, so 1..γ+1 tokens are emitted."""
    gamma, n = 5, 12
    hidden, lm_head, _, _, seeds, positions, vocab = make_case(n, gamma, 16, 300, torch.float32)
    temps = MIXED_T[:4].repeat(3)
    samples = torch.stack(
        [
            ops.verify_resample(
                hidden[:, i : i + 1],
                lm_head,
                torch.zeros(n, 0).long(),
                temps,
                seeds,
                positions + i,
                vocab,
            )[0][:, 0]
            for i in range(gamma + 1)
        ],
        dim=1,
    )  # [N, γ + 1]
    cut = torch.arange(n) % (gamma + 1)  # sequence n's drafts agree with the samples before cut
    drafts = torch.where(
        torch.arange(gamma)[None, :] < cut[:, None],
        samples[:, :gamma],
        (samples[:, :gamma] + 1) % vocab,
    )
    for backend in ("reference", "standard"):
        tokens, emitted = ops.verify_resample(
            hidden, lm_head, drafts, temps, seeds, positions, vocab, backend=backend
        )
        assert emitted.tolist() == (cut + 1).tolist()
        for row in range(n):
            k = int(emitted[row])
            assert tokens[row, :k].tolist() == samples[row, :k].tolist()


def test_gamma_zero_emits_only_the_bonus_token():
    rows = torch.tensor([[0.0, 8.0, 0.0]])
    tokens, emitted, logprobs = _one_hot_case(rows, [], 0.0)
    assert tokens.tolist() == [[1]] and emitted.tolist() == [1]
    want = -float(torch.log1p(2 * torch.exp(torch.tensor(-8.0))))
    assert float(logprobs[0, 0]) == pytest.approx(want, abs=LOGPROB_ATOL)


def test_vocab_padding_is_never_emitted():
    """Padded LM-head rows carry the largest logits but lie past vocab_size."""
    hidden, lm_head, drafts, temps, seeds, positions, _ = make_case(50, 3, 16, 100, torch.float32)
    lm_head = torch.cat([lm_head, hidden[0, :1].repeat(28, 1) * 50])  # 28 padded rows
    for backend in ("reference", "standard"):
        tokens, _ = ops.verify_resample(
            hidden, lm_head, drafts, temps, seeds, positions, 100, backend=backend
        )
        assert int(tokens.max()) < 100


def test_deterministic_and_seed_sensitive():
    case = make_case(200, 3, 16, 500, torch.float32, temperature=1.5, seed=1)
    first = _run(case, "reference")
    again = _run(case, "reference")
    assert all(torch.equal(a, b) for a, b in zip(first, again, strict=True))
    hidden, lm_head, drafts, temps, seeds, positions, vocab = case
    other = ops.verify_resample(hidden, lm_head, drafts, temps, seeds + 1, positions, vocab)
    assert not torch.equal(first[0], other[0])
    moved = ops.verify_resample(hidden, lm_head, drafts, temps, seeds, positions + 1, vocab)
    assert not torch.equal(first[0], moved[0])


@pytest.mark.parametrize("block_v", [64, 128, 192, 512, 4096])
def test_independent_of_tile_size(block_v):
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        60, 4, 16, 500, torch.float32, temperature=MIXED_T[:3].repeat(20), seed=2
    )
    base = ref.verify_resample(hidden, lm_head, drafts, temps, seeds, positions, vocab)
    tiled = ref.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, vocab, block_v=block_v
    )
    assert torch.equal(base.tokens, tiled.tokens)
    assert torch.equal(base.num_emitted, tiled.num_emitted)


def test_independent_of_batch_layout():
    """A sequence's tokens depend on its own inputs only: permuting the batch permutes the
    output, and running a sequence alone gives the same tokens."""
    case = make_case(30, 3, 16, 400, torch.float32, temperature=MIXED_T[:3].repeat(10), seed=4)
    tokens, emitted, _ = _run(case, "reference")
    perm = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    hidden, lm_head, drafts, temps, seeds, positions, vocab = case
    p_tokens, p_emitted = ops.verify_resample(
        hidden[perm], lm_head, drafts[perm], temps[perm], seeds[perm], positions[perm], vocab
    )
    assert torch.equal(p_tokens, tokens[perm]) and torch.equal(p_emitted, emitted[perm])
    alone, _ = ops.verify_resample(
        hidden[5:6], lm_head, drafts[5:6], temps[5:6], seeds[5:6], positions[5:6], vocab
    )
    assert torch.equal(alone[0], tokens[5])


def test_scalar_arguments_broadcast():
    hidden, lm_head, drafts, *_ = make_case(5, 2, 16, 50, torch.float32)
    a = ops.verify_resample(hidden, lm_head, drafts, 0.8, 123, 7)
    b = ops.verify_resample(
        hidden, lm_head, drafts, torch.full((5,), 0.8), torch.full((5,), 123), torch.full((5,), 7)
    )
    assert all(torch.equal(x, y) for x, y in zip(a, b, strict=True))
