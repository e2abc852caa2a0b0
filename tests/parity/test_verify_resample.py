"""VerifyResample parity: every backend emits the reference's tokens, exactly.

Shapes break the tiling on purpose: odd batches, γ = 0..8, a logical vocabulary that is neither a
multiple of any tile nor the LM head's row count (padding rows must never be chosen), H not a
multiple of the hidden chunk. Temperatures are mixed per row (0 = greedy next to sampled rows),
seeds and positions differ per row and reach the ends of their ranges. Drafts are the target's
own greedy choice for most positions (make_case), so multi-token emission, rejection and the bonus
token all occur. Log-probabilities are compared with the tolerances of tests/tolerances.py.

Under the Triton interpreter (no GPU) the kernels are slow: shapes stay tiny.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import noise
from tests.cases import make_case
from tests.parity.conftest import runnable
from tests.tolerances import LOGPROB_ATOL, LOGPROB_RTOL

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]
# Greedy rows sit next to sampled rows of several temperatures in every batch.
MIXED_T = torch.tensor([0.0, 1.0, 0.7, 0.0, 1.5, 0.5, 2.0])


@pytest.fixture(params=[b for b in ops.backends("verify_resample") if b != "reference"])
def backend(request):
    return runnable(request.param)


def _case(n, gamma, hidden_size, vocab, padded, dtype, seed):
    """make_case with mixed temperatures and keys at the ends of their ranges, on DEVICE."""
    temps = MIXED_T[torch.arange(n) % len(MIXED_T)]
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        n, gamma, hidden_size, vocab, dtype, padded_vocab=padded, temperature=temps, seed=seed
    )
    seeds[0] = noise.MAX_SEED  # both halves of the seed in play
    seeds[n // 2] = 2**31 + n  # just past the low half
    positions[-1] = noise.MAX_POSITION - gamma  # the last position any row may key
    tensors = (hidden, lm_head, drafts, temps, seeds, positions)
    return (*(t.to(DEVICE) for t in tensors), vocab)


def _run(case, backend):
    return ops.verify_resample(*case, return_logprobs=True, backend=backend)


def _assert_parity(case, backend):
    tokens, emitted, logprobs = _run(case, "reference")
    b_tokens, b_emitted, b_logprobs = _run(case, backend)
    assert torch.equal(b_tokens, tokens), (b_tokens, tokens)
    assert torch.equal(b_emitted, emitted)
    torch.testing.assert_close(b_logprobs, logprobs, atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)
    return tokens, emitted


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("n", "gamma", "hidden_size", "vocab", "padded"),
    [
        (1, 0, 40, 111, 128),  # one sequence, bonus token only, tiny vocabulary
        (3, 4, 72, 1000, 1024),
        (17, 1, 40, 4099, 4099),  # odd batch, vocabulary one past a power-of-two tile
        (4, 8, 72, 4099, 4160),  # the longest draft
    ],
)
def test_tokens_match_reference(backend, dtype, n, gamma, hidden_size, vocab, padded):
    case = _case(n, gamma, hidden_size, vocab, padded, dtype, seed=n + gamma)
    _assert_parity(case, backend)


@pytest.mark.parametrize("gamma", range(9))
def test_every_gamma(backend, gamma):
    """γ = 0..8 on an odd batch; the dtype rotates with γ to keep the sweep small."""
    case = _case(3, gamma, 40, 1000, 1024, DTYPES[gamma % 3], seed=100 + gamma)
    _assert_parity(case, backend)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_an_all_greedy_batch_matches_the_reference(backend, dtype):
    """T = 0 in every row (greedy serving): the kernels skip the noise of such row blocks; the
    tokens are still the reference's (96 rows: more than one row block)."""
    case = list(_case(24, 3, 40, 1000, 1024, dtype, seed=11))
    case[3] = torch.zeros_like(case[3])
    _, emitted = _assert_parity(tuple(case), backend)
    assert emitted.max() > 1  # drafts accepted: the greedy chain is checked beyond row 0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_tiny_temperatures_are_greedy_and_finite(backend, dtype):
    """T below 1e-5 (GREEDY_BELOW) is greedy in every backend: the tokens and log-probabilities
    of T = 0, all finite. Dividing by T = 1e-38 overflows the logits to ±inf instead (token 0 or
    another +inf id wins, NaN log-probabilities)."""
    case = list(_case(12, 3, 40, 1000, 1024, dtype, seed=13))
    case[3] = torch.zeros_like(case[3])
    zero = _run(tuple(case), "reference")
    for tiny in (1e-38, 1e-30, 1e-6, 9.99e-6):
        case[3] = torch.full_like(case[3], tiny)
        _assert_parity(tuple(case), backend)
        got = _run(tuple(case), backend)
        assert torch.equal(got[0], zero[0]) and torch.equal(got[1], zero[1]), tiny
        assert bool(got[2].isfinite().all()), tiny
        torch.testing.assert_close(got[2], zero[2], atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)


def test_ragged_drafts_equal_each_sequence_verified_alone(backend):
    """Drafts may end early (-1 from some position on): sequence i then verifies only its own
    drafts and emits the sample of its first placeholder row, exactly as verifying it alone with
    its γ_i drafts does."""
    case = list(_case(9, 4, 40, 1000, 1024, torch.float32, seed=21))
    drafts = case[2].clone()
    lengths = [0, 1, 2, 3, 4, 0, 2, 4, 1]
    for row, length in enumerate(lengths):
        drafts[row, length:] = -1
    case[2] = drafts
    tokens, emitted = _assert_parity(tuple(case), backend)
    for row, length in enumerate(lengths):
        alone = [t if i == 1 else t[row : row + 1] for i, t in enumerate(case[:6])]
        alone[0], alone[2] = alone[0][:, : length + 1], alone[2][:, :length]
        t, e = ops.verify_resample(*alone, case[6], backend=backend)
        assert int(e) == int(emitted[row]) <= length + 1
        assert tokens[row, : int(e)].tolist() == t[0, : int(e)].tolist()
    assert max(emitted.tolist()) > 1


def test_a_placeholder_is_never_compared_as_a_token(backend):
    """Golden: every row's sample is token 0 (its logit dominates) and the drafts are [0, -1];
    the step accepts 0, then stops at the placeholder and emits row 1's sample, 0 — a backend
    that read -1 as token 0 (a clamp) would accept it and emit a third token."""
    hidden = torch.zeros(1, 3, 8)
    hidden[..., 0] = 1.0
    lm_head = torch.eye(8) * 50.0
    drafts = torch.tensor([[0, -1]])
    keys = (torch.zeros(1), torch.tensor([3]), torch.tensor([0]))
    case = (*(t.to(DEVICE) for t in (hidden, lm_head, drafts, *keys)), 8)
    tokens, emitted = _assert_parity(case, backend)
    assert tokens.tolist() == [[0, 0, -1]] and emitted.tolist() == [2]


def test_every_outcome_is_exercised(backend):
    """Enough sequences that 1..γ+1 emitted tokens all occur (checked on the reference, so the
    parity is not vacuous); 96 flattened rows also span more than one row block."""
    case = _case(24, 3, 40, 1000, 1000, torch.float32, seed=7)
    _, emitted = _assert_parity(case, backend)
    assert set(emitted.tolist()) == {1, 2, 3, 4}


def test_greedy_ties_go_to_the_lowest_index(backend):
    """Golden case: integer-valued inputs make exact ties, whatever the summation order.

    Rows 11, 500, 700 and 3000 of the LM head are equal and score highest: ties within a tile,
    across tiles and (with the interpreter's configuration) across splits. Greedy rows (T = 0)
    must take 11: a draft of 500 is rejected (500 != argmax) and 11 is emitted in its place.
    """
    g = torch.Generator().manual_seed(3)
    n, gamma, hidden_size, vocab = 2, 2, 40, 4099
    hidden = torch.randint(-2, 3, (n, gamma + 1, hidden_size), generator=g).float()
    lm_head = torch.randint(-1, 2, (vocab + 61, hidden_size), generator=g).float()
    hidden[:, :] = hidden[0, 0]  # every row sees the same tie
    for row in (11, 500, 700, 3000):
        lm_head[row] = 4 * hidden[0, 0].sign()  # the largest dot product: 4 · Σ|h|
    drafts = torch.tensor([[500, 11], [11, 11]])
    keys = (torch.zeros(n), torch.tensor([5, 6]), torch.tensor([0, 9]))
    case = (*(t.to(DEVICE) for t in (hidden, lm_head, drafts, *keys)), vocab)
    tokens, emitted = _assert_parity(case, backend)
    # Sequence 0: draft 500 loses the tie -> 11 emitted. Sequence 1: 11, 11 accepted, bonus 11.
    assert tokens.tolist() == [[11, -1, -1], [11, 11, 11]]
    assert emitted.tolist() == [1, 3]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_without_logprobs(backend, dtype):
    """Without log-probabilities the kernels skip the online softmax (a separate compiled
    variant): same tokens as the reference, every outcome 1..γ+1 present."""
    case = _case(24, 3, 40, 1000, 1024, dtype, seed=12)
    tokens, emitted = ops.verify_resample(*case, backend=backend)
    r_tokens, r_emitted = ops.verify_resample(*case, backend="reference")
    assert torch.equal(tokens, r_tokens)
    assert torch.equal(emitted, r_emitted)
    assert set(r_emitted.tolist()) == {1, 2, 3, 4}


def test_golden_coupled_rule_tokens(backend):
    """The frozen tokens of tests/reference/test_verify_resample.py on this backend."""
    from tests.reference import test_verify_resample as golden

    case = make_case(**golden.GOLDEN_CASE, temperature=golden.MIXED_T)
    tokens, _ = ops.verify_resample(*(t.to(DEVICE) for t in case[:6]), case[6], backend=backend)
    assert tokens.tolist() == golden.GOLDEN_TOKENS


# ---- Triton-specific: launch configurations and workspaces the heuristic would not pick


@pytest.fixture
def triton_verify():
    pytest.importorskip("triton")
    from flashspec_export.kernels import verify_resample as kernel

    return kernel


def test_triton_small_tiles_empty_split_and_strided_inputs(triton_verify):
    """BLOCK_V = 64 over 1000 ids is 16 tiles; 5 splits of 4 tiles leave the last split past the
    vocabulary (it must not contribute). 5 · 5 = 25 rows span two 16-row blocks; H = 40 leaves
    a tail of the 16-wide hidden chunk. hidden and lm_head are strided views."""
    from flashspec_export.kernels.tiles import KernelConfig

    hidden, lm_head, drafts, temps, seeds, positions, vocab = _case(
        5, 4, 40, 1000, 1024, torch.float32, seed=21
    )
    wide_hidden = torch.zeros(5, 5, 56, device=DEVICE)
    wide_hidden[..., 8:48] = hidden
    wide_head = torch.zeros(1024, 64, device=DEVICE)
    wide_head[:, 3:43] = lm_head
    config = KernelConfig(block_n=16, block_v=64, block_h=16, num_splits=5)
    args = (wide_hidden[..., 8:48], wide_head[:, 3:43], drafts, temps, seeds, positions, vocab)
    result = triton_verify.verify_resample(*args, return_logprobs=True, config=config)
    expected = ops.verify_resample(*args, return_logprobs=True, backend="reference")
    assert torch.equal(result.tokens, expected[0])
    assert torch.equal(result.num_emitted, expected[1])
    torch.testing.assert_close(result.logprobs, expected[2], atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)


@pytest.mark.parametrize("epi_rows", [1, 2, 4, 8])
def test_triton_scoring_only_the_launched_rows(triton_verify, epi_rows):
    """With ``epi_rows`` below the 16-row block, only that many rows are scored (the dot still
    spans 16): every summary equals the full-block kernel's, bit for bit, and the tokens and
    log-probabilities the reference's. One sequence of γ + 1 = epi_rows rows (all sampled,
    T = 0.7; so a draft copied from the target's token must be accepted), and a batch of
    single rows with mixed temperatures; more rows than epi_rows are refused."""
    from flashspec_export.kernels.tiles import KernelConfig

    cases = [_case(1, epi_rows - 1, 40, 1000, 1024, torch.float32, seed=40 + epi_rows)]
    cases.append(_case(epi_rows, 0, 40, 1000, 1024, torch.float32, seed=50 + epi_rows))
    full = KernelConfig(block_n=16, block_v=64, block_h=16, num_splits=3)
    few = full._replace(epi_rows=epi_rows)
    for case in cases:
        summaries = []
        for config in (full, few):
            workspace = triton_verify.make_workspace(epi_rows, 3, torch.device(DEVICE))
            result = triton_verify.verify_resample(
                *case, return_logprobs=True, config=config, workspace=workspace
            )
            summaries.append((workspace.floats.clone(), workspace.index.clone(), result))
        (floats, index, result), (few_floats, few_index, few_result) = summaries
        assert torch.equal(few_index, index)
        assert torch.equal(few_floats.view(torch.int32), floats.view(torch.int32))
        expected = ops.verify_resample(*case, return_logprobs=True, backend="reference")
        assert torch.equal(few_result.tokens, expected[0])
        assert torch.equal(few_result.num_emitted, expected[1])
        torch.testing.assert_close(
            few_result.logprobs, expected[2], atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL
        )
    one_sequence = cases[0]
    if epi_rows > 1:  # the multi-token path: the draft is the target's own first token
        drafts = one_sequence[2].clone()
        drafts[0, 0] = triton_verify.verify_resample(*one_sequence, config=few).tokens[0, 0]
        accepted = triton_verify.verify_resample(
            *one_sequence[:2], drafts, *one_sequence[3:], config=few
        )
        assert int(accepted.num_emitted[0]) > 1
    too_many = _case(epi_rows + 1, 0, 40, 1000, 1024, torch.float32, seed=60)
    with pytest.raises(ValueError, match=r"config\.epi_rows"):
        triton_verify.verify_resample(*too_many, config=few)


def test_triton_preallocated_workspace_is_reused(triton_verify):
    """A caller-owned workspace gives the same result on every call (nothing leaks between
    calls through it); a workspace of the wrong shape is refused with a clear message."""
    from flashspec_export.kernels.tiles import KernelConfig

    case = _case(3, 2, 40, 111, 128, torch.float16, seed=31)
    config = KernelConfig(block_n=16, block_v=64, block_h=32, num_splits=2)
    workspace = triton_verify.make_workspace(9, 2, torch.device(DEVICE))
    first = triton_verify.verify_resample(*case, config=config, workspace=workspace)
    workspace.floats.fill_(float("nan"))
    second = triton_verify.verify_resample(*case, config=config, workspace=workspace)
    reference = ops.verify_resample(*case, backend="reference")
    for result in (first, second):
        assert torch.equal(result.tokens, reference[0])
        assert torch.equal(result.num_emitted, reference[1])
    wrong = triton_verify.make_workspace(9, 3, torch.device(DEVICE))
    with pytest.raises(ValueError, match=r"workspace: expected make_workspace\(9, 2\)"):
        triton_verify.verify_resample(*case, config=config, workspace=wrong)


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-tensor error without a GPU")
def test_triton_refuses_cpu_tensors_outside_the_interpreter(monkeypatch):
    triton = pytest.importorskip("triton")
    monkeypatch.setattr(triton.knobs.runtime, "interpret", False)
    hidden, lm_head, drafts, temps, seeds, positions, _ = make_case(2, 1, 8, 16, torch.float32)
    with pytest.raises(ValueError, match="hidden: the triton backend needs CUDA tensors"):
        ops.verify_resample(hidden, lm_head, drafts, temps, seeds, positions, backend="triton")


@pytest.mark.cuda_kernels
def test_cuda_tensor_core_path_takes_a_hidden_size_beyond_shared_memory():
    """bf16 with H = 90112 (176 KB a row, a multiple of the k chunk): the tensor-core path
    stages no hidden rows, so it must not be refused for the FMA path's shared-memory limit.
    Tokens exact; log-probabilities to 1e-3 (fp32 sums of 90112 products in another order:
    measured 2e-4 on an H100)."""
    runnable("cuda")
    case = _case(2, 1, 90112, 300, 320, torch.bfloat16, seed=5)
    tokens, emitted, logprobs = _run(case, "reference")
    c_tokens, c_emitted, c_logprobs = _run(case, "cuda")
    assert torch.equal(c_tokens, tokens) and torch.equal(c_emitted, emitted)
    torch.testing.assert_close(c_logprobs, logprobs, atol=1e-3, rtol=1e-3)
