"""TiledArgmax parity: every backend picks the reference's token, exactly.

Odd batches (1, 3, 17) and one past a 64-row block (70), vocabularies that are not a multiple of
any tile with padded LM-head rows past ``vocab_size``, H not a multiple of the hidden chunk, and
every dtype. ``max_logit`` is compared with the tolerances of tests/tolerances.py.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from tests.parity.conftest import runnable
from tests.tolerances import LOGIT_ATOL, LOGIT_RTOL

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


@pytest.fixture(params=[b for b in ops.backends("tiled_argmax") if b != "reference"])
def backend(request):
    return runnable(request.param)


def _case(n, hidden_size, padded, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, hidden_size, generator=g).to(dtype)
    # Padding rows score highest on purpose: choosing one would be a masking bug.
    lm_head = torch.randn(padded, hidden_size, generator=g)
    lm_head = (lm_head * (3.0 / hidden_size**0.5)).to(dtype)
    return hidden.to(DEVICE), lm_head.to(DEVICE)


def _assert_parity(hidden, lm_head, vocab, backend):
    token, max_logit = ops.tiled_argmax(hidden, lm_head, vocab, backend="reference")
    b_token, b_max_logit = ops.tiled_argmax(hidden, lm_head, vocab, backend=backend)
    assert torch.equal(b_token, token), (b_token, token)
    torch.testing.assert_close(b_max_logit, max_logit, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
    return token


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(
    ("n", "hidden_size", "vocab", "padded"),
    [(1, 40, 111, 128), (3, 72, 1000, 1000), (17, 40, 4099, 4160), (70, 72, 1000, 1024)],
)
def test_tokens_match_reference(backend, dtype, n, hidden_size, vocab, padded):
    hidden, lm_head = _case(n, hidden_size, padded, dtype, seed=n)
    if padded > vocab:
        # Make the padding rows the true argmax of every row, so masking is really tested.
        lm_head[vocab:] = (hidden.float().sum(0) * 10).to(dtype)
    token = _assert_parity(hidden, lm_head, vocab, backend)
    assert bool((token < vocab).all())


def test_ties_go_to_the_lowest_index(backend):
    """Golden case: integer-valued inputs make exact ties whatever the summation order.
    Rows 700, 42 and 3000 are equal and maximal (in different tiles, and different splits for
    the interpreter's configuration): 42 wins."""
    g = torch.Generator().manual_seed(5)
    hidden = torch.randint(-2, 3, (3, 40), generator=g).float()
    hidden[1:] = hidden[0]
    lm_head = torch.randint(-1, 2, (4099, 40), generator=g).float()
    for row in (700, 42, 3000):
        lm_head[row] = 4 * hidden[0].sign()
    token = _assert_parity(hidden.to(DEVICE), lm_head.to(DEVICE), 4099, backend)
    assert token.tolist() == [42, 42, 42]


def test_triton_small_tiles_empty_split_and_strided_inputs():
    """BLOCK_V = 64 over 1000 ids with 5 splits of 4 tiles: the last split lies past the
    vocabulary. 40 rows span three 16-row blocks; hidden and lm_head are strided views."""
    pytest.importorskip("triton")
    from flashspec_export.kernels.tiled_argmax import tiled_argmax
    from flashspec_export.kernels.tiles import KernelConfig

    hidden, lm_head = _case(40, 40, 1024, torch.float32, seed=9)
    wide_hidden = torch.zeros(40, 64, device=DEVICE)
    wide_hidden[:, 5:45] = hidden
    wide_head = torch.zeros(1024, 48, device=DEVICE)
    wide_head[:, 8:48] = lm_head
    config = KernelConfig(block_n=16, block_v=64, block_h=16, num_splits=5)
    args = (wide_hidden[:, 5:45], wide_head[:, 8:48], 1000)
    token, max_logit = tiled_argmax(*args, config=config)
    r_token, r_max_logit = ops.tiled_argmax(*args, backend="reference")
    assert torch.equal(token, r_token)
    torch.testing.assert_close(max_logit, r_max_logit, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)


@pytest.mark.parametrize("triton_version, refused", [("3.6.0", True), ("3.7.0", False)])
def test_the_interpreter_with_numpy_2_4_is_refused_by_name(monkeypatch, triton_version, refused):
    """NumPy >= 2.4 breaks the Triton 3.6 interpreter's runtime loop bounds: a clear error
    instead of the interpreter's 'only 0-dimensional arrays can be converted'. Triton 3.7 fixed
    it (triton-lang/triton#9171): there the kernel runs."""
    pytest.importorskip("triton")
    import triton

    from flashspec_export.kernels import tiles

    if not triton.knobs.runtime.interpret:
        pytest.skip("checks the interpreter (compiled kernels are not affected)")
    monkeypatch.setattr(tiles.numpy, "__version__", "2.4.0")
    monkeypatch.setattr(tiles.triton, "__version__", triton_version)
    hidden, lm_head = torch.randn(2, 16), torch.randn(40, 16)
    if refused:
        with pytest.raises(RuntimeError, match=r"install numpy<2.4"):
            ops.tiled_argmax(hidden, lm_head, backend="triton")
    else:
        token, _ = ops.tiled_argmax(hidden, lm_head, backend="triton")
        assert torch.equal(token, ops.tiled_argmax(hidden, lm_head, backend="reference")[0])
