"""The Hopper stage 1 (``kernels/hopper_tiles.py``: persistent, warp-specialised, TMA + wgmma)
against the portable Triton kernels it replaces from 64 rows on sm_90.

Both compute each logit with the same fp32 accumulation order (64-wide K chunks in order) and
the same per-logit arithmetic, and write the same per-(row, 128-id tile) summaries, so the
tokens, counts and max logits must be equal bit for bit; the log-probabilities' normaliser is
reduced in another order (and over other splits at 64 rows), so they agree to a few ulps of
the normaliser (|LSE| up to ~100 here: an ulp is 8e-6). Every case asserts which stage 1
ran and that drafts were accepted (the multi-token path is taken).
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import choose_config
from flashspec_export.kernels.verify_resample import verify_resample
from tests.parity.test_llm_shapes_gpu import _argmax_case, _case


def _on_hopper() -> bool:
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9


pytestmark = pytest.mark.skipif(
    not _on_hopper(), reason="needs a Hopper (sm_90) CUDA GPU: the kernel uses TMA and wgmma"
)

# One row count per HOPPER_TUNED row of either op that runs the Hopper kernel, plus odd counts
# (partial row blocks: TMA zero-fills the missing rows).
ROWS = (64, 96, 128, 200, 512)
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", ["llama3-8b", "qwen3-8b"])
@pytest.mark.parametrize("rows", (129, 256, 300, 512))
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


def test_hopper_kernel_in_a_cuda_graph():
    """After one eager call (compile, scratch), the call replays from a captured graph."""
    shape = HeadShape.from_name("llama3-8b")
    case = _case(shape, n=32, gamma=3, dtype=torch.bfloat16, seed=7)
    fast, _ = _configs("verify_resample", 128, shape, torch.bfloat16)
    assert fast.hopper is not None
    eager = verify_resample(*case)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = verify_resample(*case)
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured.tokens, eager.tokens)
