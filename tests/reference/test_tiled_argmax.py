"""TiledArgmax: the tiled reference against the materialised argmax."""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference.tiled_argmax import tiled_argmax as tiled_reference
from tests.tolerances import LOGIT_ATOL, LOGIT_RTOL


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize(
    ("n", "hidden_size", "vocab", "padded"),
    [
        (1, 40, 111, 111),
        (3, 72, 1000, 1024),
        (17, 16, 4099, 4160),
        (64, 24, 32000, 32000),
    ],
)
def test_matches_materialised_argmax(dtype, n, hidden_size, vocab, padded):
    g = torch.Generator().manual_seed(vocab)
    hidden = torch.randn(n, hidden_size, generator=g).to(dtype)
    lm_head = torch.randn(padded, hidden_size, generator=g).to(dtype)
    token, max_logit = ops.tiled_argmax(hidden, lm_head, vocab)
    s_token, s_max = ops.tiled_argmax(hidden, lm_head, vocab, backend="standard")
    assert torch.equal(token, s_token)
    torch.testing.assert_close(max_logit, s_max, atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
    assert token.dtype == torch.int64 and max_logit.dtype == torch.float32


def test_ties_go_to_the_lowest_index_across_tiles():
    """Rows 3, 70 and 200 of the LM head are identical maxima; with tiles of 64 they lie in
    different tiles, and the lowest index must win."""
    lm_head = torch.zeros(256, 4)
    lm_head[[3, 70, 200]] = torch.tensor([1.0, 2.0, 3.0, 4.0])
    hidden = torch.tensor([[1.0, 1.0, 1.0, 1.0]])
    for block_v in (1, 64, 4096):
        token, max_logit = tiled_reference(hidden, lm_head, 256, block_v=block_v)
        assert token.tolist() == [3] and max_logit.tolist() == [10.0]


def test_padding_rows_are_never_chosen():
    lm_head = torch.eye(8)
    hidden = torch.tensor([[0.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 9.0]])
    assert ops.tiled_argmax(hidden, lm_head)[0].tolist() == [7]
    assert ops.tiled_argmax(hidden, lm_head, vocab_size=7)[0].tolist() == [1]


@pytest.mark.parametrize("block_v", [1, 5, 128])
def test_independent_of_tile_size(block_v):
    g = torch.Generator().manual_seed(0)
    hidden, lm_head = torch.randn(9, 32, generator=g), torch.randn(300, 32, generator=g)
    base = tiled_reference(hidden, lm_head, 300)
    tiled = tiled_reference(hidden, lm_head, 300, block_v=block_v)
    assert torch.equal(base[0], tiled[0])
