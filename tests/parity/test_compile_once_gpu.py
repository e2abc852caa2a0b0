"""A serving loop whose batch and γ change does not recompile the Triton kernels: every kernel
that runs (stage 1 — portable or, on Hopper, warp-specialised — and both finalize kernels)
compiles once per row of the launch table (``kernels/tiles.py``), whatever N and γ inside it
(the verify finalize once per block of draft positions: γ 0..3 and 4..7,
``verify_resample.FINALIZE_MIN_ROWS``).

The kernels counted are the ones the profiler saw launch, so a path that runs but is not counted
fails the test instead of passing unseen."""

from __future__ import annotations

import pytest
import torch

from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels import tiled_argmax as argmax_kernel
from flashspec_export.kernels import verify_resample as verify_kernel
from flashspec_export.kernels.tiles import choose_config
from tests.cases import make_case

pytestmark = pytest.mark.gpu

# (N, γ) with N · (γ + 1) in 65..128 rows: one row of both ops' tables; γ 0..7, rows that are
# and are not multiples of 16, and γ = 1 (a unit row stride of the drafts).
BATCHES = [(17, 3), (20, 4), (32, 3), (40, 2), (66, 0), (21, 5), (64, 1), (10, 7)]
HIDDEN, VOCAB = 256, 5000
KERNELS = {
    k.fn.__name__: k
    for k in (
        verify_kernel._verify_tiles_kernel,
        verify_kernel._verify_finalize_kernel,
        argmax_kernel._argmax_tiles_kernel,
        argmax_kernel._argmax_finalize_kernel,
        hopper_tiles.hopper_tiles_kernel,
    )
}


def _compiled(kernel) -> int:
    """Compiled variants of a Triton kernel on any device (Triton's per-device cache)."""
    return sum(len(caches[0]) for caches in kernel.device_caches.values())


@pytest.fixture(autouse=True)
def _cuda():
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


def _step(i, n, gamma):
    case = make_case(n, gamma, HIDDEN, VOCAB, torch.bfloat16, seed=i)
    hidden, lm_head, drafts, temps, seeds, positions, vocab = (
        t.cuda() if isinstance(t, torch.Tensor) else t for t in case
    )
    verify_kernel.verify_resample(hidden, lm_head, drafts, temps, seeds, positions, vocab)
    verify_kernel.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, vocab, return_logprobs=True
    )
    argmax_kernel.tiled_argmax(hidden.reshape(-1, HIDDEN), lm_head, vocab)


def test_the_batch_and_gamma_change_and_nothing_recompiles():
    device = torch.device("cuda")
    for op in ("verify_resample", "tiled_argmax"):
        configs = {
            choose_config(op, n * (g + 1), HIDDEN, VOCAB, torch.bfloat16, device)
            for n, g in BATCHES
        }
        assert len(configs) == 1, f"{op}: the batches must fall in one row of the launch table"
    # compiles (or finds the variants an earlier test compiled): γ 3 and γ 4, the finalize's two
    _step(0, *BATCHES[0])
    _step(1, *BATCHES[1])
    before = {name: _compiled(k) for name, k in KERNELS.items()}
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for i, (n, gamma) in enumerate(BATCHES):
            _step(i, n, gamma)
        torch.cuda.synchronize()
    launched = {e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA}
    ran = {name for name in KERNELS if any(name in event for event in launched)}
    finalize = {"_verify_finalize_kernel", "_argmax_finalize_kernel"}
    assert finalize <= ran, launched
    assert len(ran - finalize) >= 1, f"no stage-1 kernel among {sorted(launched)}"
    after = {name: _compiled(k) for name, k in KERNELS.items()}
    grown = {name: (before[name], after[name]) for name in ran if after[name] != before[name]}
    assert not grown, f"recompiled (variants before, after): {grown}"
