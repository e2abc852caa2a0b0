"""The Hopper stage 1 (``kernels/hopper_tiles.py``: persistent, warp-specialised, TMA + wgmma)
against the portable Triton kernels it replaces from 17 rows on sm_90.

Both compute each logit with the same fp32 accumulation order (64-wide K chunks in order) and
the same per-logit arithmetic, and write the same per-(row, tile) summaries (over tiles of
their own widths), so the tokens, counts and max logits must be equal bit for bit; the
log-probabilities' normaliser is reduced in another order and over other splits, so they agree
to a few ulps of
the normaliser (|LSE| up to ~100 here: an ulp is 8e-6). Every case asserts which stage 1
ran and that drafts were accepted (the multi-token path is taken).
"""

from __future__ import annotations

import pytest
import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl

from flashspec_export.config import HeadShape
from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import choose_config, hopper_row
from flashspec_export.kernels.verify_resample import verify_resample
from flashspec_export.reference import truncation
from flashspec_export.reference.verify_resample import tile_summaries
from tests.parity.test_llm_shapes_gpu import _argmax_case, _case


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


pytestmark = pytest.mark.skipif(
    not _on_hopper(), reason="needs a Hopper (sm_90) CUDA GPU: the kernel uses TMA and wgmma"
)

# One row count per HOPPER_TUNED row of either op that runs the Hopper kernel, plus odd counts:
# fewer rows than one block (copied into a whole block), and partial later blocks (TMA
# zero-fills their missing rows).
ROWS = (18, 32, 64, 96, 128, 160, 200, 300, 352, 448, 512)
LOGPROB_ULPS = 4 * 7.63e-6  # four ulps of an fp32 value in [64, 128)


def _configs(op: str, rows: int, shape: HeadShape, dtype: torch.dtype):
    args = (op, rows, shape.hidden_size, shape.vocab_size, dtype, torch.device("cuda"))
    return choose_config(*args), choose_config(*args, hopper=False)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", ["llama3-8b", "gemma3-12b"])
@pytest.mark.parametrize("rows", ROWS)
def test_verify_equals_the_portable_kernel(rows, head, dtype):
    shape = HeadShape.from_name(head)
    n, gamma = (rows // 4, 3) if rows % 4 == 0 else (rows // 2, 1)
    case = _case(shape, n=n, gamma=gamma, dtype=dtype, seed=rows)
    fast, portable = _configs("verify_resample", rows, shape, dtype)
    assert fast.hopper is not None and portable.hopper is None
    for logprobs in (False, True):
        mine = verify_resample(*case, return_logprobs=logprobs, config=fast)
        theirs = verify_resample(*case, return_logprobs=logprobs, config=portable)
        assert torch.equal(mine.tokens, theirs.tokens)
        assert torch.equal(mine.num_emitted, theirs.num_emitted)
        if logprobs:
            torch.testing.assert_close(mine.logprobs, theirs.logprobs, rtol=0, atol=LOGPROB_ULPS)
    assert int(mine.num_emitted.max()) > 1, "no draft accepted: the multi-token path never ran"


def _allowed(drafts, vocab_size: int, density: float, seed: int) -> torch.Tensor:
    """Random allowed-token masks ``[N, γ + 1, W]`` that allow each draft in its own row (so that
    drafts can be accepted), packed as ``reference/truncation.py`` reads them."""
    n, gamma = drafts.shape
    g = torch.Generator(device="cuda").manual_seed(seed)
    keep = torch.rand(n, gamma + 1, vocab_size, device="cuda", generator=g) < density
    keep[:, :gamma].scatter_(2, drafts[:, :, None], True)
    return truncation.pack_allowed(keep.cpu()).cuda()


@pytest.mark.parametrize("density", [0.5, 0.002])
@pytest.mark.parametrize("head", ["llama3-8b", "gemma3-12b"])
@pytest.mark.parametrize("rows", ROWS)
def test_masked_verify_equals_the_portable_kernel(rows, head, density):
    """The mask read in the Hopper kernel's epilogue (``_allowed``): the same tokens as the
    portable kernel's, every emitted token allowed in its row."""
    shape = HeadShape.from_name(head)
    n, gamma = (rows // 4, 3) if rows % 4 == 0 else (rows // 2, 1)
    case = _case(shape, n=n, gamma=gamma, dtype=torch.bfloat16, seed=rows)
    allowed = _allowed(case[2], shape.vocab_size, density, seed=rows)
    fast, portable = _configs("verify_resample", rows, shape, torch.bfloat16)
    assert fast.hopper is not None and portable.hopper is None
    for logprobs in (False, True):
        mine = verify_resample(*case, return_logprobs=logprobs, config=fast, allowed_tokens=allowed)
        theirs = verify_resample(
            *case, return_logprobs=logprobs, config=portable, allowed_tokens=allowed
        )
        assert torch.equal(mine.tokens, theirs.tokens)
        assert torch.equal(mine.num_emitted, theirs.num_emitted)
        if logprobs:
            torch.testing.assert_close(mine.logprobs, theirs.logprobs, rtol=0, atol=LOGPROB_ULPS)
    ids = mine.tokens.clamp(min=0)
    words = allowed.gather(2, (ids // 32)[..., None])[..., 0]
    allowed_bit = ((words >> (ids % 32).to(torch.int32)) & 1) == 1
    assert bool(allowed_bit[mine.tokens >= 0].all())
    plain = verify_resample(*case, config=fast)
    assert not torch.equal(plain.tokens, mine.tokens), "the mask changed no token"
    assert int(mine.num_emitted.max()) > 1, "no draft accepted: the multi-token path never ran"


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", ["llama3-8b", "qwen3-8b"])
@pytest.mark.parametrize("rows", (17, 40, 64, 100, 300, 512))
def test_argmax_equals_the_portable_kernel(rows, head, dtype):
    shape = HeadShape.from_name(head)
    hidden, lm_head = _argmax_case(shape, rows, dtype)
    fast, portable = _configs("tiled_argmax", rows, shape, dtype)
    assert fast.hopper is not None
    m_tok, m_max = tiled_argmax(hidden, lm_head, shape.vocab_size, config=fast)
    p_tok, p_max = tiled_argmax(hidden, lm_head, shape.vocab_size, config=portable)
    assert torch.equal(m_tok, p_tok) and torch.equal(m_max, p_max)
    assert int(m_tok.max()) < shape.vocab_size  # padded LM-head rows are never chosen


def test_padded_vocabulary_and_small_hidden():
    """A head with padding rows past ``vocab_size`` (masked to -inf) and H = 256 (4 K chunks)."""
    shape = HeadShape("padded", vocab_size=1000, hidden_size=256, padded_vocab=1024)
    case = _case(shape, n=32, gamma=3, dtype=torch.bfloat16, seed=3)
    fast, portable = _configs("verify_resample", 128, shape, torch.bfloat16)
    mine = verify_resample(*case, return_logprobs=True, config=fast)
    theirs = verify_resample(*case, return_logprobs=True, config=portable)
    assert torch.equal(mine.tokens, theirs.tokens)
    assert int(mine.tokens.max()) < shape.vocab_size


def test_strided_hidden_falls_back_to_the_portable_kernel():
    """Rows that are not one [R, H] view cannot be TMA'd: the call runs the portable kernel."""
    shape = HeadShape.from_name("llama3-8b")
    hidden, *rest = _case(shape, n=32, gamma=3, dtype=torch.bfloat16, seed=5)
    strided = torch.empty(32, 4, 2 * shape.hidden_size, device="cuda", dtype=hidden.dtype)
    strided = strided[..., : shape.hidden_size]
    strided.copy_(hidden)
    mine = verify_resample(strided, *rest)
    theirs = verify_resample(hidden, *rest)
    assert torch.equal(mine.tokens, theirs.tokens)


@pytest.mark.parametrize("n", [8, 32])  # 32 rows: copied into a whole row block; 128: not
def test_hopper_kernel_in_a_cuda_graph(n):
    """After one eager call (compile, scratch), the call replays from a captured graph."""
    shape = HeadShape.from_name("llama3-8b")
    case = _case(shape, n=n, gamma=3, dtype=torch.bfloat16, seed=7)
    fast, _ = _configs("verify_resample", 4 * n, shape, torch.bfloat16)
    assert fast.hopper is not None
    eager = verify_resample(*case)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = verify_resample(*case)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.tokens, eager.tokens)


@pytest.mark.parametrize("rows", [40, 300])  # 64 x 256 tiles from a whole block; 128 x 256
def test_argmax_reduced_by_the_mma_warps_in_a_cuda_graph(rows):
    """The argmax's Hopper rows have no epilogue partition (the MMA warps reduce in registers);
    captured after one eager call, the graph replays the eager tokens."""
    shape = HeadShape.from_name("qwen3-8b")
    hidden, lm_head = _argmax_case(shape, rows, torch.bfloat16)
    fast, _ = _configs("tiled_argmax", rows, shape, torch.bfloat16)
    assert fast.hopper is not None and fast.hopper.epi_warps == 0
    eager = tiled_argmax(hidden, lm_head, shape.vocab_size)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = tiled_argmax(hidden, lm_head, shape.vocab_size)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0], eager[0]) and torch.equal(captured[1], eager[1])


def test_rows_left_in_the_whole_block_do_not_leak():
    """Fewer rows than one block run from a buffer that keeps an earlier, larger call's rows past
    them (``hopper_tiles._whole_row_block``): each output row is its own row's dots, and those
    rows are never stored, so NaN and inf rows left there change nothing."""
    shape = HeadShape.from_name("llama3-8b")
    poison = torch.full((60, shape.hidden_size), float("nan"), device="cuda")
    poison[1::2] = float("inf")
    hidden, lm_head = _argmax_case(shape, 20, torch.bfloat16)
    tiled_argmax(poison.bfloat16(), lm_head, shape.vocab_size)  # fills the block's 60 rows
    fast, portable = _configs("tiled_argmax", 20, shape, torch.bfloat16)
    assert fast.hopper is not None and fast.block_n > 20
    m_tok, m_max = tiled_argmax(hidden, lm_head, shape.vocab_size, config=fast)
    p_tok, p_max = tiled_argmax(hidden, lm_head, shape.vocab_size, config=portable)
    assert torch.equal(m_tok, p_tok) and torch.equal(m_max, p_max)


def _exact_bf16_rows(values: torch.Tensor):
    """``values [rows, V]`` rounded to 22 significant bits, as ``hidden [rows, H]`` and
    ``lm_head [V, H]`` (bf16) whose products are exactly those values: row r's hidden is one at
    columns 3r .. 3r + 2, where the LM head holds the value's three bf16 parts. Every partial
    sum of the parts is an fp32 number, so any accumulation order gives the value exactly."""
    mantissa, exponent = torch.frexp(values)
    rest = torch.ldexp(torch.round(mantissa * 2.0**22) * 2.0**-22, exponent)
    rows, vocab = values.shape
    hidden_size = -(-3 * rows // 64) * 64
    lm_head = torch.zeros(vocab, hidden_size, device="cuda", dtype=torch.bfloat16)
    hidden = torch.zeros(rows, hidden_size, device="cuda", dtype=torch.bfloat16)
    for j in range(3):
        part = rest.to(torch.bfloat16)
        lm_head[:, j : 3 * rows : 3] = part.T
        hidden[torch.arange(rows), 3 * torch.arange(rows) + j] = 1.0
        rest = rest - part.double()
    assert not rest.any()
    return hidden, lm_head


@pytest.mark.parametrize("n", [32, 64])  # 128 rows: the 64 x 256 tile; 256: the 128 x 128 one
def test_summaries_equal_the_reference_bit_for_bit(n):
    """Every (row, tile) summary of the Hopper kernel — the best block's score, its pick, the
    pick's logit — equals the reference's (torch on the GPU: the same IEEE division, ``expf``,
    ``logf`` and order of running sums) bit for bit, on dots every accumulation order forms
    exactly (``_exact_bf16_rows``), greedy and sampled rows, with and without log-probabilities;
    the blocks hold a +inf and a block of -inf only too, and rows of dots past ``_quotients``'
    range (2^70 and 2^-70 times the others) send their chunks to ``div.rn``."""
    gamma, vocab = 3, 1024
    rows = n * (gamma + 1)
    config = hopper_row("verify_resample", rows)
    tile = config.block_v
    g = torch.Generator(device="cuda").manual_seed(n)
    dots = torch.randn(rows, vocab, device="cuda", generator=g, dtype=torch.float64) * 3
    dots[1, 5] = float("inf")
    dots[2, 64:128] = float("-inf")
    dots[40] *= 2.0**70  # rows 32-47 (one epilogue chunk) past _quotients' range
    dots[56] *= 2.0**-70  # rows 48-63
    hidden, lm_head = _exact_bf16_rows(dots.nan_to_num(posinf=0.0, neginf=0.0))
    lm_head[5, 3] = float("inf")  # row 1 (its hidden is one at columns 3 .. 5): id 5 is +inf
    lm_head[64:128, 6] = float("-inf")  # row 2: the block of ids 64 .. 127 is -inf
    temps = torch.tensor([1.0, 0.7, 0.0, 1.3], device="cuda").repeat(n // 4 + 1)[:n]
    seeds = torch.randint(0, 2**62, (n,), device="cuda", generator=g)
    positions = torch.randint(0, 100_000, (n,), device="cuda", generator=g)
    tiles = vocab // tile
    for logprobs in (False, True):
        summaries = [torch.empty(rows, tiles, device="cuda") for _ in range(5)]
        summaries[1] = torch.empty(rows, tiles, device="cuda", dtype=torch.int32)
        hopper_tiles.launch(
            hidden, lm_head, vocab, tuple(summaries), verify=True, return_logprobs=logprobs,
            temperature=temps, seed=seeds, positions=positions, gamma=gamma, config=config,
        )  # fmt: skip
        expected = tile_summaries(
            hidden.view(n, gamma + 1, -1), lm_head, temps, seeds, positions, vocab, tile, logprobs
        )
        assert torch.equal(summaries[1].long(), expected.best_index.reshape(rows, tiles))
        assert torch.equal(summaries[0], expected.best_score.reshape(rows, tiles))
        if logprobs:
            assert torch.equal(summaries[2], expected.best_logit.reshape(rows, tiles))
    assert int(summaries[1][1, 0]) == 5  # the +inf id wins its tile


TRUNCATIONS = {  # name: the per-sequence parameters of ``_truncation``
    "top_k": ("top_k",),
    "top_p": ("top_p",),
    "top_k_top_p_masked": ("top_k", "top_p", "mask"),
    "large_k": ("large_k",),
}


def _truncation(name: str, drafts, vocab_size: int, seed: int) -> dict:
    """Top-k in [1, 4) (``large_k``: [200, 1024]), top-p in [0.3, 0.8), a mask of half the ids,
    per sequence; a quarter of the sequences untruncated (k 0, p 1: the noisy best beside the
    hand-in)."""
    n = drafts.shape[0]
    g = torch.Generator(device="cuda").manual_seed(seed)
    off = torch.rand(n, device="cuda", generator=g) < 0.25
    out = {}
    if "top_k" in TRUNCATIONS[name] or "large_k" in TRUNCATIONS[name]:
        low, high = (200, 1025) if name == "large_k" else (1, 4)
        k = torch.randint(low, high, (n,), device="cuda", generator=g)
        out["top_k"] = torch.where(off, 0, k)
    if "top_p" in TRUNCATIONS[name]:
        p = torch.rand(n, device="cuda", generator=g) * 0.5 + 0.3
        out["top_p"] = torch.where(off, 1.0, p)
    if "mask" in TRUNCATIONS[name]:
        out["allowed_tokens"] = _allowed(drafts, vocab_size, 0.5, seed)
    return out


@pytest.mark.parametrize("truncate", TRUNCATIONS)
@pytest.mark.parametrize("head", ["llama3-8b", "gemma3-12b"])
@pytest.mark.parametrize("rows", ROWS)
def test_truncated_verify_equals_the_portable_kernel(rows, head, truncate):
    """Top-k / top-p through the Hopper kernel's hand-in (``_hand_in_chunk``, stage 2 on its
    keys): the portable kernel's tokens and counts (its own hand-in, or its recompute) and
    log-probabilities, with untruncated sequences in the same launch; the hand-in settles all but
    at most 1% of the rows."""
    shape = HeadShape.from_name(head)
    n, gamma = (rows // 4, 3) if rows % 4 == 0 else (rows // 2, 1)
    case = _case(shape, n=n, gamma=gamma, dtype=torch.bfloat16, seed=rows)
    options = _truncation(truncate, case[2], shape.vocab_size, seed=rows)
    fast, portable = _configs("verify_resample", rows, shape, torch.bfloat16)
    assert fast.hopper is not None and portable.hopper is None
    for logprobs in (False, True):
        mine = verify_resample(*case, return_logprobs=logprobs, config=fast, **options)
        theirs = verify_resample(*case, return_logprobs=logprobs, config=portable, **options)
        assert torch.equal(mine.tokens, theirs.tokens)
        assert torch.equal(mine.num_emitted, theirs.num_emitted)
        if logprobs:  # a kept set's LSE, summed in hand-in order (up to 1024 terms)
            torch.testing.assert_close(mine.logprobs, theirs.logprobs, rtol=0, atol=1e-4)
    # A row is left to the recompute when its threshold, from 1/128 of its ids, lets fewer than k
    # or more than HAND_IN_CAP dots through (~1% of rows for k near 1024) or its nucleus passes
    # them; the tokens above include those rows' recompute.
    _, unsettled = verify_resample(*case, config=fast, settle_only=True, **options)
    assert float(unsettled.float().mean()) <= 0.01, f"{int(unsettled.sum())} rows unsettled"
    if truncate != "large_k":  # (k of 200-1024 keeps these peaked rows' samples)
        plain = verify_resample(*case, config=fast)
        assert not torch.equal(plain.tokens, mine.tokens), "the truncation changed no token"


@gluon.jit
def _quotients_kernel(x_ptr, t_ptr, out_ptr, COLS: gl.constexpr):
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [4, 1], [1, 0])
    ROWS: gl.constexpr = 16
    r = gl.program_id(0) * ROWS + gl.arange(0, ROWS, layout=gl.SliceLayout(1, layout))
    c = gl.arange(0, COLS, layout=gl.SliceLayout(0, layout))
    at = gl.expand_dims(r.to(gl.int64) * COLS, 1) + gl.expand_dims(c, 0)
    quotient = hopper_tiles._quotients(gl.load(x_ptr + at), gl.load(t_ptr + r))
    gl.store(out_ptr + at, quotient)


def _floats(n: int, low: int, high: int, g: torch.Generator) -> torch.Tensor:
    """``n`` fp32 values of random sign, exponent in [low, high] and significand (half of them
    within 64 ulps of 1 or of 2, where a quotient's rounding is closest to a tie or an ulp
    boundary)."""
    exponent = torch.randint(low, high + 1, (n,), device="cuda", generator=g)
    significand = 1.0 + torch.rand(n, device="cuda", generator=g, dtype=torch.float64)
    edge = torch.randint(0, 64, (n,), device="cuda", generator=g).double() * 2.0**-23
    pick = torch.randint(0, 4, (n,), device="cuda", generator=g)
    significand = torch.where(pick == 1, 1.0 + edge, significand)
    significand = torch.where(pick == 2, 2.0 - 2.0**-23 - edge, significand)
    sign = torch.where(torch.rand(n, device="cuda", generator=g) < 0.5, -1.0, 1.0)
    return (sign * torch.ldexp(significand, exponent.double())).float()


@pytest.mark.parametrize("temperatures", ["serving", "range"])
def test_quotients_equal_the_ieee_division(temperatures):
    """``_quotients`` (the epilogue's branch-free division) equals ``torch``'s IEEE division bit
    for bit over its whole range (``_chunk_flags``): 2^26 dots of magnitude 2^-64 .. 2^64 and
    zeros over temperatures in [1e-5, 4] (``serving``) or 2^-40 .. 2^40, significands crowded at
    the ulp boundaries."""
    g = torch.Generator(device="cuda").manual_seed(0 if temperatures == "serving" else 1)
    rows, cols = 2**19, 128
    x = _floats(rows * cols, -64, 63, g).view(rows, cols)
    x[::7, ::5] = 0.0
    if temperatures == "serving":
        t = torch.rand(rows, device="cuda", generator=g) * 4 + 1e-5
        t[::3] = torch.tensor([1.0, 0.7, 1e-5], device="cuda").repeat(rows)[: t[::3].numel()]
    else:
        t = _floats(rows, -40, 39, g).abs()
    out = torch.empty_like(x)
    _quotients_kernel[(rows // 16,)](x, t, out, COLS=cols, num_warps=4)
    expected = x / t[:, None]
    wrong = (out.view(torch.int32) != expected.view(torch.int32)) & (expected != 0)
    assert not wrong.any(), (x[wrong][:4], t.expand(cols, rows).T[wrong][:4], out[wrong][:4])
    assert torch.equal(out == 0, expected == 0)
