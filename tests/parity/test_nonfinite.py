"""One rule for non-finite logits in every backend (docs/DESIGN.md, "Non-finite logits").

A NaN logit counts as -inf (never sampled, never the argmax, nothing in the LSE); +inf wins with
the lowest id; a row without a logit above -inf emits its lowest id; the log-probability of such
a row (a +inf logit, or none above -inf) is NaN and every other one is finite.

Golden cases, each built so that a backend breaking the rule emits another token: NaN rows of
the LM head at the first id, inside a tile and at the last id (a merge that keeps a NaN that
came first, or a `max` that propagates it, picks them); the first 256 ids at -inf, so every tile
or split of the first stretch starts from -inf logits (`exp(-inf - -inf)` in an online softmax
makes the LSE NaN); two +inf ids (the lower must win, its log-probability NaN); and a hidden row
of NaN (every logit NaN: id 0, NaN log-probability). The expected tokens are computed here from
materialised logits, independently of the reference, which every backend and the ONNX function
body must then match token for token. ``check_values=False``: the Python API refuses non-finite
inputs by default; engines and the runtime's hot loop do not check.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import noise
from tests.parity.conftest import runnable
from tests.tolerances import LOGIT_ATOL, LOGPROB_ATOL, LOGPROB_LARGE_H_ATOL, LOGPROB_RTOL

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
KINDS = ("nan_rows", "neg_inf_start", "pos_inf", "dead_row")
GAMMA = 2
NAN_IDS = (0, 150)  # and the last id
POS_INF_IDS = (7, 200)


def _inputs(kind: str, hidden_size: int, vocab: int, dtype: torch.dtype, rows: int):
    """hidden [rows, H] (column 0 positive) and lm_head [vocab + 20, H] with the kind's
    non-finite entries; ids past ``vocab`` are padding."""
    g = torch.Generator().manual_seed(KINDS.index(kind))
    hidden = torch.randn(rows, hidden_size, generator=g)
    hidden[:, 0] = hidden[:, 0].abs() + 0.5  # -inf · h0 = -inf, +inf · h0 = +inf
    lm_head = torch.randn(vocab + 20, hidden_size, generator=g) * (4.0 / hidden_size**0.5)
    if kind == "nan_rows":
        lm_head[[*NAN_IDS, vocab - 1]] = float("nan")
    elif kind == "neg_inf_start":
        lm_head[:256] = 0.0
        lm_head[:256, 0] = float("-inf")
    elif kind == "pos_inf":
        lm_head[list(POS_INF_IDS)] = 0.0
        lm_head[list(POS_INF_IDS), 0] = float("inf")
    elif kind == "dead_row":
        hidden[1] = float("nan")
    return hidden.to(dtype), lm_head.to(dtype)


def _rule_logits(hidden, lm_head, vocab):
    """Materialised fp32 logits with NaN as -inf (not through any backend)."""
    dots = hidden.float() @ lm_head[:vocab].float().T
    return torch.where(dots.isnan(), float("-inf"), dots)


def _expected_samples(hidden, lm_head, vocab, temperature, seed, positions):
    """y [N, γ + 1]: greedy rows the argmax (the lowest id of the maximum); sampled rows the
    two-level sample in float64 — the 64-id block of largest ``log Σ exp(l) + g_b``, then the
    id at its uniform in the block's cumulative probabilities — except where softmax is undefined
    (a +inf logit: the lowest +inf id; none above -inf: id 0)."""
    scale = torch.where(temperature == 0, 1.0, temperature)[:, None, None]
    logits = _rule_logits(hidden, lm_head, vocab) / scale  # [N, R, V]
    row_pos = positions[:, None] + torch.arange(hidden.shape[1])
    pad = torch.full((*logits.shape[:-1], -vocab % 64), float("-inf"))
    blocks = torch.cat([logits, pad], dim=-1).double().unflatten(-1, (-1, 64))  # [N, R, nb, 64]
    nb = torch.arange(blocks.shape[-2])
    g = noise.gumbel(seed[:, None, None], row_pos[..., None], nb, noise.STREAM_GUMBEL)
    block = (torch.logsumexp(blocks, dim=-1) + g.double()).argmax(dim=-1)  # [N, R]
    u = noise.uniform(seed[:, None], row_pos, block, noise.STREAM_PICK).double()
    chosen = blocks.gather(2, block[..., None, None].expand(-1, -1, 1, 64))[:, :, 0]
    cdf = torch.softmax(chosen, dim=-1).cumsum(dim=-1)
    sampled = block * 64 + (cdf <= u[..., None]).sum(dim=-1).clamp(max=63)
    undefined = (logits == float("inf")).any(dim=-1) | (logits == float("-inf")).all(dim=-1)
    greedy = (temperature == 0)[:, None] | undefined
    return torch.where(greedy, logits.argmax(dim=-1), sampled)


def _verify_case(kind, n=3, hidden_size=32, vocab=300, dtype=torch.float32):
    """A VerifyResample case (greedy and sampled sequences) whose drafts are each row's own
    sample except for the last sequence's second draft: every row is emitted somewhere and one
    rejection occurs. Returns (the op's arguments on DEVICE, the expected samples y)."""
    hidden, lm_head = _inputs(kind, hidden_size, vocab, dtype, n * (GAMMA + 1))
    hidden = hidden.reshape(n, GAMMA + 1, hidden_size)
    temperature = torch.tensor([0.0, 1.0, 0.7] * n)[:n]
    seed = torch.arange(n) * (2**40 + 3) + 11
    positions = torch.arange(n) * 977
    y = _expected_samples(hidden, lm_head, vocab, temperature, seed, positions)
    drafts = y[:, :GAMMA].clone()
    drafts[-1, 1] = (y[-1, 1] + 1) % vocab
    args = (hidden, lm_head, drafts, temperature, seed, positions)
    return (*(a.to(DEVICE) for a in args), vocab), y


def _verify(case, backend):
    return ops.verify_resample(*case, return_logprobs=True, backend=backend, check_values=False)


@pytest.mark.parametrize("kind", KINDS)
def test_the_reference_follows_the_rule(kind):
    case, y = _verify_case(kind)
    tokens, _, logprobs = (t.cpu() for t in _verify(case, "reference"))
    emitted = tokens >= 0
    assert torch.equal(tokens[emitted], y[emitted])
    assert int(emitted.sum()) == 3 * (GAMMA + 1) - 1  # the last sequence stops at its 2nd row
    undefined = torch.zeros_like(emitted)  # rows whose log-probability is NaN
    if kind == "nan_rows":
        assert not any(bool((tokens == t).any()) for t in (*NAN_IDS, case[-1] - 1))
    elif kind == "neg_inf_start":
        assert bool((tokens[emitted] >= 256).all())
    elif kind == "pos_inf":
        assert bool((tokens[emitted] == POS_INF_IDS[0]).all())
        undefined[:] = True
    elif kind == "dead_row":
        assert int(tokens[0, 1]) == 0  # hidden row 1 (sequence 0, row 1): every logit NaN
        undefined[0, 1] = True
    assert bool(logprobs[emitted & undefined].isnan().all())
    assert bool(logprobs[emitted & ~undefined].isfinite().all())


def _assert_same(got, want, atol=LOGPROB_ATOL):
    tokens, emitted, logprobs = (t.cpu() for t in got)
    r_tokens, r_emitted, r_logprobs = (t.cpu() for t in want)
    assert torch.equal(tokens, r_tokens), (tokens, r_tokens)
    assert torch.equal(emitted, r_emitted)
    torch.testing.assert_close(logprobs, r_logprobs, atol=atol, rtol=LOGPROB_RTOL, equal_nan=True)


@pytest.mark.parametrize(
    "backend", [b for b in ops.backends("verify_resample") if b != "reference"]
)
@pytest.mark.parametrize("kind", KINDS)
def test_verify_backends_follow_the_rule(backend, kind):
    case, _ = _verify_case(kind)
    _assert_same(_verify(case, runnable(backend)), _verify(case, "reference"))


@pytest.mark.parametrize("backend", ops.backends("tiled_argmax"))
@pytest.mark.parametrize("kind", KINDS)
def test_argmax_backends_follow_the_rule(backend, kind):
    hidden, lm_head = _inputs(kind, 32, 300, torch.float32, 9)
    logits = _rule_logits(hidden, lm_head, 300)
    token, max_logit = ops.tiled_argmax(
        hidden.to(DEVICE), lm_head.to(DEVICE), 300, backend=runnable(backend), check_values=False
    )
    assert torch.equal(token.cpu(), logits.argmax(dim=-1))
    torch.testing.assert_close(max_logit.cpu(), logits.amax(dim=-1), atol=LOGIT_ATOL, rtol=0)
    if kind == "dead_row":
        assert int(token[1]) == 0 and float(max_logit[1]) == float("-inf")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("n", [3, 8])  # 9 rows: the portable kernels; 24: Hopper's (sm_90)
@pytest.mark.parametrize("kind", KINDS)
def test_deployed_shape_bf16(backend, n, kind):
    """bf16 at H = 4096 (the compiled-in kernels of the CUDA library, and on Hopper from 17 rows
    the warp-specialised kernels) against the reference on the same inputs."""
    case, _ = _verify_case(kind, n, 4096, 1000, torch.bfloat16)
    got, want = _verify(case, runnable(backend)), _verify(case, "reference")
    _assert_same(got, want, atol=LOGPROB_LARGE_H_ATOL)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("backend", ["triton", "cuda"])
@pytest.mark.parametrize("rows", [9, 24, 160])  # 9: the portable kernels; 24, 160: Hopper's
@pytest.mark.parametrize("kind", KINDS)
def test_deployed_shape_bf16_argmax(backend, rows, kind):
    """The argmax at bf16, H = 4096 (on Hopper from 17 rows the warp-specialised kernel, its MMA
    warps mapping NaN dots to -inf) against materialised logits."""
    hidden, lm_head = (t.to(DEVICE) for t in _inputs(kind, 4096, 1000, torch.bfloat16, rows))
    logits = _rule_logits(hidden, lm_head, 1000)
    token, max_logit = ops.tiled_argmax(
        hidden, lm_head, 1000, backend=runnable(backend), check_values=False
    )
    assert torch.equal(token, logits.argmax(dim=-1))
    torch.testing.assert_close(max_logit, logits.amax(dim=-1), atol=1e-4, rtol=1e-5)


def test_the_onnx_function_body_follows_the_rule():
    ort = pytest.importorskip("onnxruntime")
    from onnx import TensorProto

    from flashspec_export.onnx import functions

    names = ("hidden", "lm_head", "draft_tokens", "temperature", "seed", "positions")
    for kind in KINDS:
        case, _ = _verify_case(kind)
        feeds = {name: t.cpu().numpy() for name, t in zip(names, case[:-1], strict=True)}
        model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, case[-1])
        session = ort.InferenceSession(
            model.SerializeToString(), providers=["CPUExecutionProvider"]
        )
        got = [torch.from_numpy(x) for x in session.run(None, feeds)]
        _assert_same(got, _verify(case, "reference"))
