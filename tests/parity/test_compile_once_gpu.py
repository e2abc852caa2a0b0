"""A serving loop whose batch changes does not recompile the Triton kernels: the tile kernels
compile once per row of the launch table (``kernels/tiles.py``), whatever N and γ inside it."""

from __future__ import annotations

import pytest
import torch

from flashspec_export.kernels import tiled_argmax as argmax_kernel
from flashspec_export.kernels import verify_resample as verify_kernel
from flashspec_export.kernels.tiles import choose_config
from tests.cases import make_case

pytestmark = pytest.mark.gpu

# (N, γ) with N · (γ + 1) in 65..128 rows: one row of both ops' tables.
BATCHES = [(17, 3), (20, 4), (32, 3), (40, 2), (66, 0), (21, 5)]
HIDDEN, VOCAB = 256, 5000


def _compiled(kernel) -> int:
    """Compiled variants of a Triton kernel on any device (Triton's per-device cache)."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def test_the_batch_changes_and_nothing_recompiles():
    device = torch.device("cuda")
    configs = {
        choose_config("verify_resample", n * (g + 1), HIDDEN, VOCAB, torch.bfloat16, device)
        for n, g in BATCHES
    }
    assert len(configs) == 1, "the batches must fall in one row of the launch table"
    kernels = (
        verify_kernel._verify_tiles_kernel,
        argmax_kernel._argmax_tiles_kernel,
        argmax_kernel._argmax_finalize_kernel,
    )
    counts = []
    for i, (n, gamma) in enumerate(BATCHES):
        case = make_case(n, gamma, HIDDEN, VOCAB, torch.bfloat16, seed=i)
        hidden, lm_head, drafts, temps, seeds, positions, vocab = (
            t.cuda() if isinstance(t, torch.Tensor) else t for t in case
        )
        verify_kernel.verify_resample(hidden, lm_head, drafts, temps, seeds, positions, vocab)
        argmax_kernel.tiled_argmax(hidden.reshape(-1, HIDDEN), lm_head, vocab)
        counts.append([_compiled(k) for k in kernels])
    # The first batch may compile (or find the variant compiled by an earlier test); no later
    # batch adds a variant.
    assert all(c == counts[0] for c in counts), counts
