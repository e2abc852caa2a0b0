"""The two-level sample of a vocabulary tile in Triton (``reference.verify_resample``).

A tile of ``BLOCK_V`` ids is ``BLOCK_V / 64`` blocks of 64; each block scores ``M_b + log S_b +
g_b`` and picks an id by the inverse CDF of its running sums at its uniform; the tile keeps its
best block (the lowest on ties). The running sums follow the reference's order: sequential inside
each run of 16 ids (``tl.cumsum``: sequential under the interpreter; on a GPU the association
may differ in the last bits, which moves a pick only where the target falls within rounding of a
running sum), then each run's sums plus the sequential sum of the runs before it.
"""

from __future__ import annotations

import triton
import triton.language as tl

from flashspec_export.kernels.noise import (
    gumbel_from_bits,
    math_exp,
    math_log,
    token_bits,
    uniform_from_bits,
)
from flashspec_export.reference import verify_resample as reference

SAMPLE_BLOCK: tl.constexpr = tl.constexpr(reference.SAMPLE_BLOCK)
SAMPLE_RUN: tl.constexpr = tl.constexpr(reference.SAMPLE_RUN)
_RUNS: tl.constexpr = tl.constexpr(reference.SAMPLE_BLOCK // reference.SAMPLE_RUN)


@triton.jit
def tile_block_sample(logits, first_block, g_a, g_b, u_a, u_b, LIBDEVICE: tl.constexpr):
    """The best block of a tile and its pick, per row.

    ``logits [ROWS, BLOCK_V]`` fp32 (NaN and ids past the vocabulary as ``-inf``; ``BLOCK_V`` a
    multiple of 64) are blocks ``first_block ..``; ``g_a, g_b`` and ``u_a, u_b``: the rows' keys
    on ``STREAM_GUMBEL`` and ``STREAM_PICK`` (uint32 ``[ROWS]``). Returns ``score
    [ROWS]`` (the best block's ``s_b``), ``index [ROWS]`` (its pick, a global id, int32) and
    ``arg [ROWS]`` (the pick's column in the tile)."""
    ROWS: tl.constexpr = logits.shape[0]
    BLOCK_V: tl.constexpr = logits.shape[1]
    NB: tl.constexpr = BLOCK_V // SAMPLE_BLOCK
    x = tl.reshape(logits, [ROWS, NB, _RUNS, SAMPLE_RUN])
    m = tl.max(tl.max(x, 3), 2)  # [ROWS, NB]
    finite = (m > float("-inf")) & (m < float("inf"))
    shift = tl.where(finite, m, 0.0)
    e = math_exp(x - shift[:, :, None, None], LIBDEVICE)
    e = tl.where(finite[:, :, None, None], e, 0.0)
    c = tl.cumsum(e, 3)  # inside each run
    run_total = tl.max(c, 3)  # the run's last sum (running sums of e >= 0 never decrease)
    inclusive = tl.cumsum(run_total, 2)  # [ROWS, NB, RUNS]
    r = tl.arange(0, _RUNS)
    # the runs before each run: the inclusive sum one run back, 0 for the first (exact: one term)
    before = tl.sum(
        tl.where(r[:, None] + 1 == r[None, :], inclusive[:, :, :, None], 0.0), 2
    )  # [ROWS, NB, RUNS]
    sums = before[:, :, :, None] + c  # [ROWS, NB, RUNS, RUN]
    total = tl.max(tl.max(sums, 3), 2)  # S_b, the last running sum
    block = first_block + tl.arange(0, NB)  # [NB]
    u = uniform_from_bits(token_bits(u_a[:, None], u_b[:, None], block[None, :]))
    g = gumbel_from_bits(token_bits(g_a[:, None], g_b[:, None], block[None, :]), LIBDEVICE)
    below = (sums <= (u * total)[:, :, None, None]).to(tl.int32)
    pick = tl.sum(tl.sum(below, 3), 2)
    pick = tl.where(total > 0.0, pick, 0)
    j = tl.reshape(tl.arange(0, SAMPLE_BLOCK), [1, 1, _RUNS, SAMPLE_RUN])
    first_inf = tl.min(tl.min(tl.where(x == float("inf"), j, SAMPLE_BLOCK), 3), 2)
    pick = tl.where(m == float("inf"), first_inf, pick)
    score = tl.where(m == float("inf"), float("inf"), m + math_log(total, LIBDEVICE) + g)
    score = tl.where(m == float("-inf"), float("-inf"), score)
    best, best_block = tl.max(score, 1, return_indices=True, return_indices_tie_break_left=True)
    nb = tl.arange(0, NB)
    best_pick = tl.sum(tl.where(nb[None, :] == best_block[:, None], pick, 0), 1)
    arg = best_block * SAMPLE_BLOCK + best_pick
    return best, (first_block * SAMPLE_BLOCK + arg).to(tl.int32), arg
