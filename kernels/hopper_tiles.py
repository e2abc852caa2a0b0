"""Stage 1 of both ops on Hopper (sm_90) from 17 rows: a persistent, warp-specialised GEMM
whose epilogue is the op's per-tile reduction, overlapped with the next tile's tensor-core work.

The portable Triton kernels (``verify_resample``, ``tiled_argmax``) run the matmul and the
epilogue (a hash, two logs and a compare per logit for VerifyResample) one after the other in
the same warps, so at GEMM-shaped row counts the tensor cores idle while the epilogue runs
(verify 1.5-2× the cuBLAS matmul at 128-512 rows: ``git show 51a3298:docs/BENCHMARKS.md``).
Here each CTA (one per SM) walks output tiles ``(vocabulary tile, row block)`` — row blocks
innermost, so the CTAs working at one time share LM-head tiles in L2 and DRAM streams the head
about once — with three partitions connected by mbarriers:

- load (1 warp): TMA copies of the hidden block ``[BLOCK_N, BLOCK_K]`` and the LM-head tile
  ``[BLOCK_V, BLOCK_K]`` into a ring of ``STAGES`` shared-memory slots;
- MMA (the default partition, ``BLOCK_N / 16`` warps): ``wgmma`` over the ring into a fp32
  ``[BLOCK_N, BLOCK_V]`` accumulator, then hands it to the epilogue through shared memory and
  starts the next tile at once;
- epilogue (``EPI_WARPS`` warps): reads the accumulator in chunks of ``CHUNK`` rows and writes
  the same per-(row, tile) summaries as the portable kernels' stage 1 with one tile per split
  (VerifyResample: best noisy score and its id, and with log-probabilities the id's logit and
  the tile's max / sum-exp; TiledArgmax: max logit and its id), so the portable stage 2
  (``_verify_finalize_kernel`` / ``_argmax_finalize_kernel``) finishes unchanged.

TiledArgmax may instead run without the epilogue partition (``EPI_WARPS = 0``): its per-tile
reduction is a row max, cheap enough for the MMA warps to do in registers while the loader
fills the ring with the next tile; the shared memory the accumulator hand-over took goes to a
deeper ring or a 128 x 256 tile of two warpgroups.

The VerifyResample epilogue takes the two-level sample of each (row, tile)
(``_block_sampled_chunk_best``): per logit an IEEE-rounded division by the temperature (without
a branch per logit where the chunk's dots allow: ``_quotients``), a libdevice ``expf`` and the
running sums of its 64-id block in the reference's order, so its summaries are those of the
reference's arithmetic; the hash and the logs are paid per (row, block), once per
tile into a per-CTA scratch (the rows' temperatures too) while the MMA warps work. Fewer rows
than one row block are first copied into a whole block (``_whole_row_block``); TMA zero-fills
the rows of a later partial block and LM-head rows past ``V``; ids at or past ``vocab_size`` and
NaN dots score ``-inf``: the MMA partition sets them to it (``_masked_dots``).

Gluon (Triton 3.6) constraints that shape the code: a worker partition's constexpr arguments
arrive as runtime values, so the op's flags select one epilogue function per op in the kernel
body; the epilogue's chunk loop is a runtime loop (unrolled, its code overflowed the
instruction cache: ``git show 51a3298:docs/BENCHMARKS.md``).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from flashspec_export.kernels.noise import (
    STREAM_GUMBEL,
    STREAM_PICK,
    gumbel_from_bits,
    math_exp,
    math_log,
    row_keys,
    token_bits,
    uniform_from_bits,
)
from flashspec_export.kernels.order_keys import order_key
from flashspec_export.ops.workspace import launch_workspace
from flashspec_export.reference import verify_resample as reference

# Gluon is experimental and renames between Triton releases: the names this file needs, as
# Triton 3.6 and later releases spell them (tests/test_triton_aot.py compiles the kernel under
# the installed Triton).
_cta_barrier = gl.barrier if hasattr(gl, "barrier") else gl.thread_barrier
_tma_load = tma.async_load if hasattr(tma, "async_load") else tma.async_copy_global_to_shared
_PUBLIC_REINTERPRET: gl.constexpr = gl.constexpr(
    hasattr(gl.shared_memory_descriptor, "reinterpret")
)

GREEDY_BELOW: gl.constexpr = gl.constexpr(reference.GREEDY_BELOW)  # T below it: a greedy row
# Keys a truncated row may hand in (``_hand_in_chunk``): ``verify_resample`` aims its threshold at
# about half of it; a row that reaches it is recomputed.
HAND_IN_CAP: gl.constexpr = gl.constexpr(4096)
LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)  # log2(e), the ex2 form of exp
# ``_quotients``' range (``_chunk_flags``): dots of magnitude up to 2^64 (or zero, or from 2^-64),
# temperatures from 2^-40 to 2^40, so that no quotient, product or remainder leaves the normal
# floats.
QUOTIENT_DOT_MAX: gl.constexpr = gl.constexpr(2.0**64)
QUOTIENT_T_MAX: gl.constexpr = gl.constexpr(2.0**40)
SAMPLE_BLOCK: gl.constexpr = gl.constexpr(reference.SAMPLE_BLOCK)
SAMPLE_RUN: gl.constexpr = gl.constexpr(reference.SAMPLE_RUN)
# The per-CTA scratch's int32 words per row of a tile: the temperature, and per 64-id block of a
# tile of at most 256 ids its Gumbel and uniform (plugins/common/tritonAot.h: kRowScratchBytes).
SCRATCH_PER_ROW: gl.constexpr = gl.constexpr(1 + 2 * 256 // reference.SAMPLE_BLOCK)


@gluon.jit
def _argmax_combine(value_a, index_a, value_b, index_b):
    """(max, its id) with ties to the lowest id — ``tl.max(..., return_indices=True)``'s rule."""
    take_a = (value_a > value_b) | ((value_a == value_b) & (index_a < index_b))
    return gl.where(take_a, value_a, value_b), gl.where(take_a, index_a, index_b)


@gluon.jit
def _lanes_to_blocks(v, blocks_layout: gl.constexpr):
    """A per-lane ``[CHUNK, LANES]`` value as ``[CHUNK, NB, RUNS]`` (a block's four lanes on the
    last axis) in ``blocks_layout``: the same threads."""
    RUNS: gl.constexpr = blocks_layout.threads_per_warp[2]
    shape: gl.constexpr = [v.shape[0], v.shape[1] // RUNS, RUNS]
    return gl.convert_layout(gl.reshape(v, shape), blocks_layout, assert_trivial=True)


@gluon.jit
def _blocks_to_lanes(v, lanes_layout: gl.constexpr):
    """A per-block ``[CHUNK, NB]`` value (``SliceLayout(2, blocks_layout)``) on each of the
    block's lanes: ``[CHUNK, LANES]`` in ``lanes_layout``."""
    blocks_layout: gl.constexpr = v.type.layout.parent
    RUNS: gl.constexpr = blocks_layout.threads_per_warp[2]
    wide = gl.expand_dims(v, 2) + gl.zeros([v.shape[0], v.shape[1], RUNS], v.dtype, blocks_layout)
    return gl.convert_layout(
        gl.reshape(wide, [v.shape[0], v.shape[1] * RUNS]), lanes_layout, assert_trivial=True
    )


@gluon.jit
def _or_combine(x, y):
    return x | y


@gluon.jit
def _chunk_flags(acc, scale, greedy, row_ok):
    """Two facts about a chunk, in one reduction across the partition's warps: bit 0, whether a
    row is greedy; bit 1, whether a live row's dots or temperature leave the range where
    ``_quotients`` is exact (dots zero or of magnitude in [2^-64, 2^64], T in [2^-40, 2^40]):
    an infinite dot (NaN, or past the vocabulary: the last tile), a huge or a subnormal one."""
    a = gl.abs(acc)
    top = gl.max(a, 1)
    low = gl.min(gl.where(a == 0.0, 1.0, a), 1)
    fits = (top <= QUOTIENT_DOT_MAX) & (low >= 1.0 / QUOTIENT_DOT_MAX)
    fits &= (scale >= 1.0 / QUOTIENT_T_MAX) & (scale <= QUOTIENT_T_MAX)
    flags = greedy.to(gl.int32) | gl.where(fits | ~row_ok, 0, 2)
    return gl.reduce(flags, 0, _or_combine)


@gluon.jit
def _quotients(acc, scale):
    """``acc / scale`` per row, IEEE-rounded, with no per-dot branch: ``y = RN(1 / T)`` once a
    row, then ``q = RN(x·y)`` and two corrections ``q + RN(x - T·q)·y`` (fused multiply-adds).
    ``q`` starts within 1.5 ulps of ``x / T``; the first correction brings it within one, and
    then Markstein's theorem (y within half an ulp of 1/T, q within one ulp of x/T: ``RN(q +
    (x - T·q)·y) = RN(x / T)``, the remainder exact, without underflow or overflow; Muller et
    al., Handbook of Floating-Point Arithmetic, ch. 4) makes the second exact. ``div.rn`` runs a
    like sequence (a reciprocal refined per dot, one correction) behind a range check and a
    branch per dot (``FCHK``), which split the epilogue's 16 divisions a thread into 16 basic
    blocks (~14 instructions a dot against 5 here). Exact where
    ``_chunk_flags`` says so (``tests/parity/test_hopper_tiles_gpu.py`` compares it with
    ``torch``'s division over the range's edges)."""
    t = gl.expand_dims(scale, 1)
    y = gl.expand_dims(gl.div_rn(gl.full_like(scale, 1.0), scale), 1)
    q = acc * y
    q = gl.fma(gl.fma(-t, q, acc), y, q)
    return gl.fma(gl.fma(-t, q, acc), y, q)


@gluon.jit
def _scaled(acc, scale, words, fast, run_layout: gl.constexpr, MASKED: gl.constexpr):
    """``acc / scale`` per row (``scale [CHUNK]``, > 0), IEEE-rounded as the reference's
    ``l / T`` (``_quotients`` where ``fast``, else ``div.rn``); with ``MASKED``, -inf where
    the mask ``words`` forbid (``_kept``). The mask is applied to the quotients, not the dots:
    ``div.rn`` takes a slow path when its dividend is infinite or zero, so masked dots (-inf)
    sent down it cost a random half-vocabulary mask 1.41x plain verify at 512 rows on an H200
    (``docs/bench/mask_cost_h200.log``)."""
    quotient = _quotients(acc, scale) if fast else gl.div_rn(acc, gl.expand_dims(scale, 1))
    return _kept(quotient, words, run_layout, MASKED)


@gluon.jit
def _tile_softmax(acc, scale):
    """Per row of a chunk: its max logit ``max(dot) / T`` (IEEE division, as the reference's
    ``l / T``: rounding is monotone, so it is the max of the rounded logits) and
    ``Σ exp(logit - max)``, formed from the dots as ``2^((dot - max dot) · log2(e) / T)``: a
    subtract, a multiply and an ``ex2`` per dot, no division (the log-probabilities' and top-p's
    normaliser; H100, 512 rows, top-p's tile pass 1041 µs dividing each dot first, 837 so,
    top-k's 800: ``docs/bench/stage2_breakdown_h100.log``). The exponent's rounding, ~2^-23 of
    it, is below the reference's own (``l / T`` rounded before ``l - max``). Padded, masked and
    NaN dots (-inf) add 0; a +inf dot makes the sum NaN, as the reference's ``inf - inf``
    does."""
    top = gl.max(acc, 1)
    top_ref = gl.where(top == float("-inf"), 0.0, top)
    per_dot = LOG2E / scale  # log2(e) / T per row
    x = (acc - gl.expand_dims(top_ref, 1)) * gl.expand_dims(per_dot, 1)
    return gl.div_rn(top, scale), gl.sum(gl.exp2(x), 1)


@gluon.jit
def _block_sampled_chunk_best(acc, words, ids, scale, greedy, flags, g_ptr, u_ptr, in_chunk,
                              v_start, NB: gl.constexpr, run_layout: gl.constexpr,
                              MASKED: gl.constexpr):  # fmt: skip
    """Per row of a chunk: the two-level sample over the tile's blocks
    (``reference.verify_resample.block_samples``): the best block score (lowest block on ties),
    its pick (a global id) and the pick's logit ``dot / T``; greedy rows: the max logit, its id
    (lowest on ties) and itself.

    ``acc [CHUNK, BLOCK_V]`` the dots (-inf at NaN and past the vocabulary), ``words`` (with
    ``MASKED``) the rows' mask words (``_mask_words``), ``ids`` their ids (``v_start`` on),
    ``scale`` T (1 for greedy rows), ``flags`` the chunk's ``_chunk_flags``; ``g_ptr``, ``u_ptr``:
    the tile's blocks' Gumbels and uniforms, ``[BLOCK_N, NB]`` float32 in the CTA's scratch, rows
    ``in_chunk``. Each thread holds one row's run of ``SAMPLE_RUN`` ids (``run_layout``), so a block
    is four lanes: the running sums inside a run are the thread's own, in order, and the sums of the
    runs before it are formed in order from the four lanes' totals (each gathered by a reduction
    that adds zeros, exact) — the reference's order. Per logit: an IEEE division, an ``expf``, an
    add for the running sum, one for the offset and a compare (the division branch-free where the
    chunk's dots allow, ``_quotients``; only there can no logit be +inf, so the search for a block's
    first +inf logit, its pick, is left to the other chunks)."""
    CHUNK: gl.constexpr = acc.shape[0]
    BLOCK_V: gl.constexpr = acc.shape[1]
    RUN: gl.constexpr = run_layout.size_per_thread[2]
    gl.static_assert(RUN == SAMPLE_RUN, "a thread's run of ids must be one run of the sample")
    RUNS: gl.constexpr = SAMPLE_BLOCK // SAMPLE_RUN
    LANES: gl.constexpr = BLOCK_V // RUN
    row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    lanes_layout: gl.constexpr = gl.SliceLayout(2, run_layout)
    blocks_layout: gl.constexpr = gl.BlockedLayout(
        [1, 1, 1],
        [run_layout.threads_per_warp[0], run_layout.threads_per_warp[1] // RUNS, RUNS],
        [run_layout.warps_per_cta[0], 1, 1],
        [2, 1, 0],
    )
    nb_layout: gl.constexpr = gl.SliceLayout(2, blocks_layout)  # [CHUNK, NB]
    fast = (flags & 2) == 0
    logits = _scaled(acc, scale, words, fast, run_layout, MASKED)
    x = gl.convert_layout(gl.reshape(logits, [CHUNK, LANES, RUN]), run_layout, assert_trivial=True)
    m = gl.max(_lanes_to_blocks(gl.max(x, 2), blocks_layout), 2)  # [CHUNK, NB] block max
    finite = (m > float("-inf")) & (m < float("inf"))
    # A block of -inf logits sums exp(-inf) = 0; one with a +inf max sums inf or NaN, but its
    # pick and score are set apart below: no per-logit guard.
    shift = _blocks_to_lanes(gl.where(finite, m, 0.0), lanes_layout)
    e = math_exp(x - gl.expand_dims(shift, 2), True)
    c = gl.associative_scan(e, 2, _add_combine)  # inside the thread's run, in order
    totals = _lanes_to_blocks(gl.max(c, 2), blocks_layout)  # [CHUNK, NB, RUNS] run totals
    r_layout: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, blocks_layout))
    r = gl.expand_dims(gl.expand_dims(gl.arange(0, RUNS, layout=r_layout), 0), 0)  # [1, 1, RUNS]
    t0 = gl.sum(gl.where(r == 0, totals, 0.0), 2)
    t1 = gl.sum(gl.where(r == 1, totals, 0.0), 2)
    t2 = gl.sum(gl.where(r == 2, totals, 0.0), 2)
    t3 = gl.sum(gl.where(r == 3, totals, 0.0), 2)
    p2 = t0 + t1
    p3 = p2 + t2
    total = p3 + t3  # S_b, [CHUNK, NB]
    before = gl.where(r == 0, 0.0, gl.expand_dims(t0, 2))
    before = gl.where(r == 2, gl.expand_dims(p2, 2), before)
    before = gl.where(r == 3, gl.expand_dims(p3, 2), before)
    before = gl.convert_layout(gl.reshape(before, [CHUNK, LANES]), lanes_layout)
    sums = gl.expand_dims(before, 2) + c  # C, the block's running sums
    rows = gl.convert_layout(in_chunk, gl.SliceLayout(1, nb_layout))
    nb = gl.arange(0, NB, layout=gl.SliceLayout(0, nb_layout))
    at = gl.expand_dims(rows, 1) * NB + gl.expand_dims(nb, 0)
    g = gl.load(g_ptr + at).to(gl.float32, bitcast=True)
    u = gl.load(u_ptr + at).to(gl.float32, bitcast=True)
    target = _blocks_to_lanes(u * total, lanes_layout)
    below = (sums <= gl.expand_dims(target, 2)).to(gl.int32)
    pick = gl.sum(_lanes_to_blocks(gl.sum(below, 2), blocks_layout), 2)  # [CHUNK, NB]
    pick = gl.where(total > 0.0, pick, 0)
    if not fast:  # a block with a +inf logit picks its first one
        j = gl.arange(0, RUN, layout=gl.SliceLayout(0, gl.SliceLayout(0, run_layout)))
        lane = gl.arange(0, LANES, layout=gl.SliceLayout(0, lanes_layout))
        in_block = gl.expand_dims(gl.expand_dims((lane % RUNS) * RUN, 0), 2) + gl.expand_dims(
            gl.expand_dims(j, 0), 0
        )  # [1, LANES, RUN]: the id's place in its block
        first_inf = gl.min(gl.where(x == float("inf"), in_block, SAMPLE_BLOCK), 2)
        first_inf = gl.min(_lanes_to_blocks(first_inf, blocks_layout), 2)
        pick = gl.where(m == float("inf"), first_inf, pick)
    score = gl.where(m == float("inf"), float("inf"), m + math_log(total, True) + g)
    score = gl.where(m == float("-inf"), float("-inf"), score)
    best, best_block = gl.reduce(
        (score, gl.expand_dims(nb, 0) + gl.zeros([CHUNK, NB], gl.int32, nb_layout)),
        1,
        _argmax_combine,
    )
    best_pick = gl.sum(gl.where(gl.expand_dims(nb, 0) == gl.expand_dims(best_block, 1), pick, 0), 1)
    best = gl.convert_layout(best, row_layout)
    best_id = gl.convert_layout(v_start + best_block * SAMPLE_BLOCK + best_pick, row_layout)
    if (flags & 1) != 0:  # greedy rows: the argmax of their logits (dot / 1, the dots)
        greedy_best, greedy_id = gl.reduce((logits, ids), 1, _argmax_combine)
        best = gl.where(greedy, greedy_best, best)
        best_id = gl.where(greedy, greedy_id, best_id)
    best_logit = gl.sum(gl.where(ids == gl.expand_dims(best_id, 1), logits, 0.0), 1)
    return best, best_id, best_logit


@gluon.jit
def _mask_words(allowed_ptr, rows, row_ok, v_start, num_words, BLOCK_V: gl.constexpr,
                run_layout: gl.constexpr):  # fmt: skip
    """The allowed-token mask words of a chunk's ``rows`` (``allowed_ptr``: [R, num_words]
    int32, bit j of word w allows id 32·w + j) over its tile's ids from ``v_start``: one word per
    thread, ``[CHUNK, LANES]`` in ``SliceLayout(2, run_layout)`` (a thread's run of ``RUN`` ids, a
    divisor of 32 starting at a multiple of it, lies in one word), shifted so that its bit j
    allows the run's j-th id; 0 for rows past ``row_ok``."""
    RUN: gl.constexpr = run_layout.size_per_thread[2]
    gl.static_assert(32 % RUN == 0, "a thread's run of ids must lie inside one mask word")
    lanes_layout: gl.constexpr = gl.SliceLayout(2, run_layout)
    lane = gl.arange(0, BLOCK_V // RUN, layout=gl.SliceLayout(0, lanes_layout))
    word = (v_start + lane * RUN) // 32
    run_rows: gl.constexpr = gl.SliceLayout(1, lanes_layout)
    r = gl.convert_layout(rows, run_rows, assert_trivial=True)
    ok = gl.expand_dims(gl.convert_layout(row_ok, run_rows, assert_trivial=True), 1)
    ok = ok & gl.expand_dims(word < num_words, 0)
    offsets = gl.expand_dims(r.to(gl.int64) * num_words, 1) + gl.expand_dims(word, 0)
    words = gl.load(allowed_ptr + offsets, mask=ok, other=0)
    return words >> gl.expand_dims((v_start + lane * RUN) % 32, 0)


@gluon.jit
def _kept(x, words, run_layout: gl.constexpr, MASKED: gl.constexpr):
    """``x [CHUNK, BLOCK_V]`` with -inf at the ids the mask ``words`` (``_mask_words``) forbid
    (with ``MASKED``; else ``x``): per id a test of a bit at a constant place (each thread's word
    is shifted to its run, ``run_layout``) and a select. (Testing the tile's bit places per
    thread instead held 16 shifted masks in registers and spilled the tests' predicates into a
    bit field: ~5 instructions an id.)"""
    if MASKED:
        CHUNK: gl.constexpr = x.shape[0]
        RUN: gl.constexpr = run_layout.size_per_thread[2]
        LANES: gl.constexpr = x.shape[1] // RUN
        j = gl.arange(0, RUN, layout=gl.SliceLayout(0, gl.SliceLayout(0, run_layout)))
        bits = (gl.expand_dims(words, 2) >> gl.expand_dims(gl.expand_dims(j, 0), 0)) & 1
        runs = gl.reshape(x, [CHUNK, LANES, RUN])
        runs = gl.convert_layout(runs, run_layout, assert_trivial=True)
        runs = gl.where(bits != 0, runs, float("-inf"))
        return gl.convert_layout(gl.reshape(runs, x.shape), x.type.layout, assert_trivial=True)
    return x


@gluon.jit
def _add_combine(x, y):
    return x + y


@gluon.jit
def _hand_in_chunk(acc, rows, row_ok, threshold_ptr, count_ptr, hand_in_ptr, v_start,
                   run_layout: gl.constexpr):  # fmt: skip
    """Top-k / top-p's hand-in: every dot of the chunk ``acc [CHUNK, BLOCK_V]`` (ids from
    ``v_start``) at or above its row's threshold (``threshold_ptr [R]`` float32; NaN: none, as for
    rows past ``row_ok``), appended to the row's keys (``hand_in_ptr [R, HAND_IN_CAP]`` int64,
    ``order_key`` of the raw dot and its id, in no order) at the slots its count
    (``count_ptr [R]`` int32) hands out. One relaxed atomic per thread and row that keeps a dot
    (each thread holds a run of one row's ids, ``run_layout``), then one predicated store per
    kept dot; counts past ``HAND_IN_CAP`` keep counting and store nothing (stage 2 then does not
    settle the row). No noise: the truncated rows' Gumbel-max is taken over their kept keys in
    stage 2."""
    CHUNK: gl.constexpr = acc.shape[0]
    BLOCK_V: gl.constexpr = acc.shape[1]
    RUN: gl.constexpr = run_layout.size_per_thread[2]
    LANES: gl.constexpr = BLOCK_V // RUN
    lanes_layout: gl.constexpr = gl.SliceLayout(2, run_layout)
    run_rows: gl.constexpr = gl.SliceLayout(1, lanes_layout)
    r = gl.convert_layout(rows, run_rows, assert_trivial=True)
    ok = gl.convert_layout(row_ok, run_rows, assert_trivial=True)
    theta = gl.load(threshold_ptr + r, mask=ok, other=float("nan"))
    dots = gl.convert_layout(gl.reshape(acc, [CHUNK, LANES, RUN]), run_layout, assert_trivial=True)
    keep = dots >= gl.expand_dims(gl.expand_dims(theta, 1), 2)  # NaN threshold: none
    take = keep.to(gl.int32)
    lane_count = gl.sum(take, 2)  # [CHUNK, LANES]: inside each thread
    row_of = gl.expand_dims(r, 1) + gl.zeros([CHUNK, LANES], gl.int32, lanes_layout)
    base = gl.atomic_add(count_ptr + row_of, lane_count, mask=lane_count > 0, sem="relaxed")
    slot = gl.expand_dims(base, 2) + gl.associative_scan(take, 2, _add_combine) - take
    lane = gl.arange(0, LANES, layout=gl.SliceLayout(0, lanes_layout))
    j_layout: gl.constexpr = gl.SliceLayout(0, gl.SliceLayout(0, run_layout))
    j = gl.expand_dims(gl.expand_dims(gl.arange(0, RUN, layout=j_layout), 0), 0)
    ids = gl.expand_dims(gl.expand_dims(v_start + lane * RUN, 0), 2) + j
    offsets = gl.expand_dims(gl.expand_dims(r.to(gl.int64) * HAND_IN_CAP, 1), 2) + slot
    gl.store(hand_in_ptr + offsets, order_key(dots, ids), mask=keep & (slot < HAND_IN_CAP))


@gluon.jit
def _load_partition(shared):
    """TMA producer: for every K chunk of every tile of this CTA, one ring slot."""
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, params = shared[:7]
    num_tiles, row_blocks = params[0], params[1]
    BLOCK_N: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_V: gl.constexpr = b_desc.block_type.shape[0]
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    k_iters = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        v_tile = tile // row_blocks
        row_block = tile - v_tile * row_blocks
        for kk in range(k_iters):
            slot = it % STAGES
            mbarrier.wait(empty.index(slot), ((it // STAGES) & 1) ^ 1)
            mbarrier.expect(ready.index(slot), a_desc.block_type.nbytes + b_desc.block_type.nbytes)
            _tma_load(
                a_desc, [row_block * BLOCK_N, kk * BLOCK_K], ready.index(slot), a_bufs.index(slot)
            )
            _tma_load(
                b_desc, [v_tile * BLOCK_V, kk * BLOCK_K], ready.index(slot), b_bufs.index(slot)
            )
            it += 1


@gluon.jit
def _accumulate(a_bufs, b_bufs, ready, empty, it, k_iters, layout: gl.constexpr):
    """One output tile's fp32 accumulator: wgmma over ``k_iters`` ring slots from the
    ``it``-th, each slot given back to the loader once read. Returns (acc, the next ``it``)."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_N: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_V: gl.constexpr = b_bufs.type.shape[1]
    acc = gl.zeros([BLOCK_N, BLOCK_V], gl.float32, layout)
    for kk in range(k_iters):
        slot = it % STAGES
        mbarrier.wait(ready.index(slot), (it // STAGES) & 1)
        acc = warpgroup_mma(
            a_bufs.index(slot), b_bufs.index(slot).permute((1, 0)), acc, is_async=True
        )
        # One wgmma in flight: the previous one has read its slot, which goes back to the
        # loader.
        acc = warpgroup_mma_wait(num_outstanding=1, deps=(acc,))
        _cta_barrier()
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=kk > 0)
        it += 1
    acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
    _cta_barrier()
    mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
    return acc, it


@gluon.jit
def _masked_dots(acc, v_tile, vocab_size, layout: gl.constexpr):
    """``acc`` with -inf at NaN dots (``reference.no_nan``: a NaN logit counts as -inf) and at
    the ids past ``vocab_size`` (the last vocabulary tile's padding), so that no op's reduction
    masks per element."""
    BLOCK_V: gl.constexpr = acc.type.shape[1]
    # One instruction per element: the NaN-ignoring max (max.f32 returns the operand that is not
    # NaN) turns NaN into -inf and leaves every other value, -0.0 included, as it is. (A compare
    # and a select cost the MMA warps' in-register argmax 2-6% at 128-256 rows on an H200.)
    acc = gl.maximum(acc, float("-inf"))
    if (v_tile + 1) * BLOCK_V > vocab_size:  # the last tile, partial
        cols = v_tile * BLOCK_V + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, layout))
        acc = gl.where(gl.expand_dims(cols < vocab_size, 0), acc, float("-inf"))
    return acc


@gluon.jit
def _mma_partition(
    a_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    acc_buf,
    acc_ready,
    acc_empty,
    num_tiles,
    row_blocks,
    vocab_size,
):
    """wgmma consumer: one fp32 accumulator tile per output tile, handed over in shared memory
    (NaN dots and ids past ``vocab_size`` at -inf)."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = acc_buf.type.shape[0]
    BLOCK_V: gl.constexpr = acc_buf.type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1], instr_shape=[16, BLOCK_V, 16]
    )
    k_iters = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        count = tile // gl.num_programs(0)  # this CTA's tiles before this one
        acc, it = _accumulate(a_bufs, b_bufs, ready, empty, it, k_iters, layout)
        acc = _masked_dots(acc, tile // row_blocks, vocab_size, layout)
        mbarrier.wait(acc_empty, (count & 1) ^ 1)
        acc_buf.store(acc)
        _cta_barrier()
        mbarrier.arrive(acc_ready)


@gluon.jit
def _mma_argmax_partition(a_desc, a_bufs, b_bufs, ready, empty, params):
    """TiledArgmax without an epilogue partition: the wgmma warps reduce their own accumulator
    in registers (max logit and its id per row and tile) while the loader fills the ring with
    the next tile. The tensor cores pause for the reduction (a few hundred instructions per
    thread, against the tile's 64 wgmma steps of H = 4096); in exchange no accumulator tile
    goes through shared memory, which leaves it to the ring and to two warpgroups of 64 x 256
    (``git show 51a3298:docs/BENCHMARKS.md``, "the argmax reduced in the wgmma warps'
    registers")."""
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = a_bufs.type.shape[1]
    BLOCK_V: gl.constexpr = b_bufs.type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1], instr_shape=[16, BLOCK_V, 16]
    )
    num_tiles, row_blocks, num_rows, vocab_size = params[0], params[1], params[2], params[3]
    best_score_ptr, best_index_ptr = params[8], params[9]
    num_splits = gl.cdiv(vocab_size, BLOCK_V)
    k_iters = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        v_tile = tile // row_blocks
        row_block = tile - v_tile * row_blocks
        acc, it = _accumulate(a_bufs, b_bufs, ready, empty, it, k_iters, layout)
        acc = _masked_dots(acc, v_tile, vocab_size, layout)
        cols = v_tile * BLOCK_V + gl.arange(0, BLOCK_V, layout=gl.SliceLayout(0, layout))
        ids = gl.expand_dims(cols, 0) + gl.zeros([BLOCK_N, BLOCK_V], gl.int32, layout)
        best, best_id = gl.reduce((acc, ids), 1, _argmax_combine)
        rows = row_block * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, layout))
        ws_off = rows * num_splits + v_tile
        gl.store(best_score_ptr + ws_off, best, mask=rows < num_rows)
        gl.store(best_index_ptr + ws_off, best_id, mask=rows < num_rows)


@gluon.jit
def _epilogue_partition(
    shared,
    VERIFY: gl.constexpr,
    RETURN_LOGPROBS: gl.constexpr,
    MASKED: gl.constexpr,
    HAND_IN: gl.constexpr = False,
):
    """Per tile: the op's reduction of the accumulator into per-(row, tile) summaries (with
    ``MASKED``, of the dots the rows' allowed-token masks keep: each chunk's mask words are
    loaded while the chunk before it is reduced, a tile's first chunk's while the CTA's previous
    tile's last chunk is: loaded only once the accumulator was ready, they cost a random
    half-vocabulary mask 1.10x plain verify at 512 rows on an H200, against 1.06 without the
    loads, ``docs/bench/mask_loads_h200.log``). With
    ``HAND_IN`` (top-k / top-p) the truncated sequences' rows hand in their dots above a threshold
    (``_hand_in_chunk``) instead of a noisy best, which the other rows still get; a block of
    truncated rows only scores no noise and writes no best (stage 2 rewrites their summaries)."""
    params = shared[6]
    acc_buf, acc_ready, acc_empty = shared[7:]
    num_tiles = params[0]
    row_blocks = params[1]
    num_rows = params[2]
    vocab_size = params[3]
    gamma = params[4]
    temperature_ptr = params[5]
    seed_ptr = params[6]
    positions_ptr = params[7]
    best_score_ptr = params[8]
    best_index_ptr = params[9]
    best_logit_ptr = params[10]
    max_ptr = params[11]
    sum_exp_ptr = params[12]
    allowed_ptr = params[14]
    num_words = params[15]
    truncated_ptr = params[16]
    threshold_ptr = params[17]
    count_ptr = params[18]
    hand_in_ptr = params[19]
    NUM_CHUNKS: gl.constexpr = acc_buf.type.shape[0]
    CHUNK: gl.constexpr = acc_buf.type.shape[1]
    BLOCK_V: gl.constexpr = acc_buf.type.shape[2]
    BLOCK_N: gl.constexpr = NUM_CHUNKS * CHUNK
    NB: gl.constexpr = BLOCK_V // SAMPLE_BLOCK  # the tile's blocks of the two-level sample
    # this CTA's scratch: the rows' temperatures [BLOCK_N], the blocks' Gumbels and uniforms
    # [BLOCK_N, NB] each (SCRATCH_PER_ROW int32 words a row at most)
    keys_ptr = params[13] + gl.program_id(0) * (SCRATCH_PER_ROW * BLOCK_N)
    EPI_WARPS: gl.constexpr = gl.num_warps()
    # A chunk [CHUNK, BLOCK_V] over the partition: each warp CHUNK / EPI_WARPS whole rows, each
    # lane a run of one row's ids. The per-row work (the winner's exact score, the keys) is
    # repeated by every lane of a row, so fewer lanes per row (more ids per lane) amortise it.
    ROWS_PER_WARP: gl.constexpr = CHUNK // EPI_WARPS
    LANES_PER_ROW: gl.constexpr = 32 // ROWS_PER_WARP
    RUN: gl.constexpr = BLOCK_V // LANES_PER_ROW
    layout: gl.constexpr = gl.BlockedLayout(
        [1, RUN], [ROWS_PER_WARP, LANES_PER_ROW], [EPI_WARPS, 1], [1, 0]
    )
    run_layout: gl.constexpr = gl.BlockedLayout(
        [1, 1, RUN], [ROWS_PER_WARP, LANES_PER_ROW, 1], [EPI_WARPS, 1, 1], [2, 1, 0]
    )
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, layout)
    block_layout: gl.constexpr = gl.BlockedLayout([1], [32], [EPI_WARPS], [0])
    noise_layout: gl.constexpr = gl.BlockedLayout([1, 1], [32, 1], [EPI_WARPS, 1], [1, 0])
    num_splits = gl.cdiv(vocab_size, BLOCK_V)
    if MASKED:  # the first chunk's mask words of this CTA's first tile
        v_first = gl.program_id(0) // row_blocks
        first_rows = (gl.program_id(0) - v_first * row_blocks) * BLOCK_N
        first_rows += gl.arange(0, CHUNK, layout=row_layout)
        words = _mask_words(
            allowed_ptr, first_rows, first_rows < num_rows, v_first * BLOCK_V, num_words, BLOCK_V,
            run_layout,
        )  # fmt: skip
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        count = tile // gl.num_programs(0)  # this CTA's tiles before this one
        v_tile = tile // row_blocks
        row_block = tile - v_tile * row_blocks
        if VERIFY:
            # The block's rows: temperatures and the blocks' noise, once per tile, shared through
            # the CTA's scratch (per chunk, an L1 hit instead of a dependent global load).
            block_rows = row_block * BLOCK_N + gl.arange(0, BLOCK_N, layout=block_layout)
            block_ok = block_rows < num_rows
            block_seq = block_rows // (gamma + 1)
            block_t = gl.load(temperature_ptr + block_seq, mask=block_ok, other=0.0)
            plain = block_ok
            if HAND_IN:  # the truncated sequences' rows take no noisy best
                plain &= gl.load(truncated_ptr + block_seq, mask=block_ok, other=1) == 0
            any_sampled = gl.max(gl.where(plain & (block_t >= GREEDY_BELOW), 1, 0), 0) > 0
            any_plain = gl.max(gl.where(plain, 1, 0), 0) > 0
            # The blocks' noise of the tile's rows, once per tile (while the MMA runs): each
            # (row, 64-id block) its Gumbel and its pick's uniform, into the CTA's scratch.
            noise_rows = gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, noise_layout))
            row = gl.expand_dims(row_block * BLOCK_N + noise_rows, 1)  # [BLOCK_N, 1]
            noise_ok = row < num_rows
            noise_seq = row // (gamma + 1)
            noise_pos = gl.load(positions_ptr + noise_seq, mask=noise_ok, other=0)
            noise_pos += row - noise_seq * (gamma + 1)
            noise_seed = gl.load(seed_ptr + noise_seq, mask=noise_ok, other=0)
            g_a, g_b = row_keys(noise_seed, noise_pos, STREAM_GUMBEL)  # [BLOCK_N, 1]
            u_a, u_b = row_keys(noise_seed, noise_pos, STREAM_PICK)
            nb = gl.arange(0, NB, layout=gl.SliceLayout(0, noise_layout))
            block_id = gl.expand_dims(v_tile * NB + nb, 0)  # [1, NB]
            g = gumbel_from_bits(token_bits(g_a, g_b, block_id), True)  # [BLOCK_N, NB]
            u = uniform_from_bits(token_bits(u_a, u_b, block_id))
            noise_at = gl.expand_dims(noise_rows, 1) * NB + gl.expand_dims(nb, 0)
            _cta_barrier()  # the previous tile's reads of this CTA's scratch are done
            in_block = gl.arange(0, BLOCK_N, layout=block_layout)
            gl.store(keys_ptr + in_block, block_t.to(gl.int32, bitcast=True))
            gl.store(keys_ptr + BLOCK_N + noise_at, g.to(gl.int32, bitcast=True))
            gl.store(keys_ptr + (1 + NB) * BLOCK_N + noise_at, u.to(gl.int32, bitcast=True))
            _cta_barrier()
        first_rows = row_block * BLOCK_N + gl.arange(0, CHUNK, layout=row_layout)
        mbarrier.wait(acc_ready, count & 1)
        cols = v_tile * BLOCK_V + gl.arange(0, BLOCK_V, layout=col_layout)
        # Only the chunks with rows below num_rows (a partial last row block skips the rest).
        live_chunks = gl.cdiv(gl.minimum(num_rows - row_block * BLOCK_N, BLOCK_N), CHUNK)
        for chunk in range(live_chunks):
            rows = first_rows + chunk * CHUNK
            row_ok = rows < num_rows
            acc = acc_buf.index(chunk).load(layout)  # [CHUNK, BLOCK_V] fp32
            chunk_words = 0  # (without MASKED, never read)
            if MASKED:
                # this chunk's words, and the next chunk's in flight: after the tile's last
                # chunk, the first of this CTA's next tile (its latency hidden behind this
                # chunk, not paid when that tile's accumulator is ready)
                chunk_words = words
                last = (chunk + 1 == live_chunks).to(gl.int32)
                next_tile = tile + gl.num_programs(0)
                next_v = next_tile // row_blocks
                next_block = next_tile - next_v * row_blocks
                jump = (next_block - row_block) * BLOCK_N - (chunk + 1) * CHUNK  # to its row 0
                next_rows = rows + CHUNK + jump * last
                next_ok = (next_rows < num_rows) & ((last == 0) | (next_tile < num_tiles))
                words = _mask_words(
                    allowed_ptr, next_rows, next_ok, (v_tile + (next_v - v_tile) * last) * BLOCK_V,
                    num_words, BLOCK_V, run_layout,
                )  # fmt: skip
            ids = gl.expand_dims(cols, 0) + gl.zeros([CHUNK, BLOCK_V], gl.int32, layout)
            ws_off = rows * num_splits + v_tile
            if VERIFY:
                in_chunk = chunk * CHUNK + gl.arange(0, CHUNK, layout=row_layout)
                temperature = gl.load(keys_ptr + in_chunk)
                temperature = temperature.to(gl.float32, bitcast=True)
                greedy = temperature < GREEDY_BELOW  # reference.verify_resample.GREEDY_BELOW
                scale = gl.where(greedy, 1.0, temperature)
                if any_plain:
                    if any_sampled:
                        flags = _chunk_flags(acc, scale, greedy, row_ok)
                        best, best_id, best_logit = _block_sampled_chunk_best(
                            acc, chunk_words, ids, scale, greedy, flags, keys_ptr + BLOCK_N,
                            keys_ptr + (1 + NB) * BLOCK_N, in_chunk, v_tile * BLOCK_V, NB,
                            run_layout, MASKED,
                        )  # fmt: skip
                    else:  # greedy rows only: the scores are the logits, dot / 1
                        kept = _kept(acc, chunk_words, run_layout, MASKED)
                        best, best_id = gl.reduce((kept, ids), 1, _argmax_combine)
                        best_logit = best
                    gl.store(best_score_ptr + ws_off, best, mask=row_ok)
                    gl.store(best_index_ptr + ws_off, best_id, mask=row_ok)
                    if RETURN_LOGPROBS:
                        gl.store(best_logit_ptr + ws_off, best_logit, mask=row_ok)
                if RETURN_LOGPROBS:
                    m, s = _tile_softmax(_kept(acc, chunk_words, run_layout, MASKED), scale)
                    gl.store(max_ptr + ws_off, m, mask=row_ok)
                    gl.store(sum_exp_ptr + ws_off, s, mask=row_ok)
                if HAND_IN:
                    _hand_in_chunk(
                        _kept(acc, chunk_words, run_layout, MASKED), rows, row_ok, threshold_ptr,
                        count_ptr, hand_in_ptr, v_tile * BLOCK_V, run_layout,
                    )  # fmt: skip
            else:
                best, best_id = gl.reduce((acc, ids), 1, _argmax_combine)
                gl.store(best_score_ptr + ws_off, best, mask=row_ok)
                gl.store(best_index_ptr + ws_off, best_id, mask=row_ok)
        _cta_barrier()  # every read of acc_buf is done
        mbarrier.arrive(acc_empty)


@gluon.jit
def verify_epilogue(shared):
    """The VerifyResample epilogue partition (best noisy score and its id per row and tile)."""
    _epilogue_partition(shared, True, False, False)


@gluon.jit
def verify_logprobs_epilogue(shared):
    """The VerifyResample epilogue partition with log-probabilities (also the id's logit and the
    tile's max and sum-exp)."""
    _epilogue_partition(shared, True, True, False)


@gluon.jit
def verify_masked_epilogue(shared):
    """``verify_epilogue`` over the dots the allowed-token masks keep."""
    _epilogue_partition(shared, True, False, True)


@gluon.jit
def verify_masked_logprobs_epilogue(shared):
    """``verify_logprobs_epilogue`` over the dots the allowed-token masks keep."""
    _epilogue_partition(shared, True, True, True)


@gluon.jit
def verify_hand_in_epilogue(shared):
    """``verify_epilogue`` with the truncated rows' hand-in (top-k)."""
    _epilogue_partition(shared, True, False, False, True)


@gluon.jit
def verify_hand_in_logprobs_epilogue(shared):
    """``verify_logprobs_epilogue`` with the truncated rows' hand-in (top-p, or log-probabilities:
    the tiles' max and sum-exp normalise top-p)."""
    _epilogue_partition(shared, True, True, False, True)


@gluon.jit
def verify_masked_hand_in_epilogue(shared):
    """``verify_masked_epilogue`` with the truncated rows' hand-in."""
    _epilogue_partition(shared, True, False, True, True)


@gluon.jit
def verify_masked_hand_in_logprobs_epilogue(shared):
    """``verify_masked_logprobs_epilogue`` with the truncated rows' hand-in."""
    _epilogue_partition(shared, True, True, True, True)


@gluon.jit
def argmax_epilogue(shared):
    """The TiledArgmax epilogue partition (max logit and its id per row and tile)."""
    _epilogue_partition(shared, False, False, False)


@gluon.jit(do_not_specialize=["num_rows", "gamma"])  # one compiled kernel whatever N and γ
def hopper_tiles_kernel(
    a_desc,  # hidden [R, H], block [BLOCK_N, BLOCK_K]
    b_desc,  # lm_head [V, H], block [BLOCK_V, BLOCK_K]
    temperature_ptr,  # [N] float32 (VerifyResample)
    seed_ptr,  # [N] int64
    positions_ptr,  # [N] int64
    best_score_ptr,  # [R, S] float32: best noisy score (argmax: max logit) per (row, tile)
    best_index_ptr,  # [R, S] int32: its id
    best_logit_ptr,  # [R, S] float32: its logit (log-probabilities only)
    max_ptr,  # [R, S] float32: the tile's max logit (log-probabilities only)
    sum_exp_ptr,  # [R, S] float32: Σ exp(logit - max) over the tile (log-probabilities only)
    keys_ptr,  # [grid, 3, BLOCK_N] int32 scratch: a CTA's current rows' keys and temperatures
    num_rows,
    gamma,
    vocab_size,
    allowed_ptr,  # [R, num_words] int32 allowed-token bit masks (MASKED only)
    num_words,  # ceil(vocab_size / 32)
    truncated_ptr,  # [N] int32: 1 where top-k / top-p apply (HAND_IN only)
    threshold_ptr,  # [R] float32: the dot a row hands in from (HAND_IN only; NaN: none)
    count_ptr,  # [R] int32: keys handed in, zero before the launch (HAND_IN only)
    hand_in_ptr,  # [R, HAND_IN_CAP] int64: the handed-in keys (HAND_IN only)
    VERIFY: gl.constexpr,  # VerifyResample (else TiledArgmax)
    RETURN_LOGPROBS: gl.constexpr,  # VerifyResample's log-probability summaries too
    STAGES: gl.constexpr,
    CHUNK: gl.constexpr,
    EPI_WARPS: gl.constexpr,
    EPI_REGS: gl.constexpr,
    MASKED: gl.constexpr = False,  # VerifyResample over the allowed tokens only
    HAND_IN: gl.constexpr = False,  # VerifyResample's top-k / top-p hand-in (_hand_in_chunk)
):
    BLOCK_N: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_V: gl.constexpr = b_desc.block_type.shape[0]
    row_blocks = gl.cdiv(num_rows, BLOCK_N)
    num_tiles = gl.cdiv(vocab_size, BLOCK_V) * row_blocks

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_V, BLOCK_K], b_desc.layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)

    params = (
        num_tiles,
        row_blocks,
        num_rows,
        vocab_size,
        gamma,
        temperature_ptr,
        seed_ptr,
        positions_ptr,
        best_score_ptr,
        best_index_ptr,
        best_logit_ptr,
        max_ptr,
        sum_exp_ptr,
        keys_ptr,
        allowed_ptr,
        num_words,
        truncated_ptr,
        threshold_ptr,
        count_ptr,
        hand_in_ptr,
    )
    # The worker partitions' one argument (partitions must share a signature): the loader reads
    # its first seven fields, the epilogue the rest and the params.
    loads = (a_desc, b_desc, a_bufs, b_bufs, ready, empty, params)
    if EPI_WARPS == 0:  # TiledArgmax only: the wgmma warps reduce their own accumulator
        gl.warp_specialize(
            [
                (_mma_argmax_partition, (a_desc, a_bufs, b_bufs, ready, empty, params)),
                (_load_partition, (loads,)),
            ],
            [1],
            [24],
        )
    else:
        _specialize_with_epilogue(
            loads, num_tiles, row_blocks, VERIFY, RETURN_LOGPROBS, MASKED, HAND_IN, CHUNK,
            EPI_WARPS, EPI_REGS,
        )  # fmt: skip


@gluon.jit
def _specialize_with_epilogue(
    loads,
    num_tiles,
    row_blocks,
    VERIFY: gl.constexpr,
    RETURN_LOGPROBS: gl.constexpr,
    MASKED: gl.constexpr,
    HAND_IN: gl.constexpr,
    CHUNK: gl.constexpr,
    EPI_WARPS: gl.constexpr,
    EPI_REGS: gl.constexpr,
):
    """The three partitions (load, wgmma, epilogue), the accumulator tile handed over in shared
    memory."""
    a_desc, b_desc, a_bufs, b_bufs, ready, empty, params = loads
    BLOCK_N: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_V: gl.constexpr = b_desc.block_type.shape[0]
    acc_layout: gl.constexpr = gl.SwizzledSharedLayout(
        vec=4, per_phase=1, max_phase=8, order=[1, 0]
    )
    acc_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_V], acc_layout)
    # The epilogue's view: chunks of CHUNK rows (a multiple of the swizzle's 8-row period, so
    # both views address every element alike).
    chunks_shape: gl.constexpr = [BLOCK_N // CHUNK, CHUNK, BLOCK_V]
    if _PUBLIC_REINTERPRET:
        acc_chunks = acc_buf.reinterpret(gl.float32, chunks_shape, acc_layout)
    else:
        acc_chunks = acc_buf._reinterpret(gl.float32, chunks_shape, acc_layout)
    acc_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    mbarrier.init(acc_ready, count=1)
    mbarrier.init(acc_empty, count=1)
    shared = (
        a_desc,
        b_desc,
        a_bufs,
        b_bufs,
        ready,
        empty,
        params,
        acc_chunks,
        acc_ready,
        acc_empty,
    )
    worker_args = (shared,)
    mma_args = (
        a_desc,
        a_bufs,
        b_bufs,
        ready,
        empty,
        acc_buf,
        acc_ready,
        acc_empty,
        num_tiles,
        row_blocks,
        params[3],
    )
    # One call per epilogue: a partition's function is named in the call itself (neither a
    # constexpr argument nor a local can carry it).
    if HAND_IN:
        _specialize_hand_in(mma_args, worker_args, RETURN_LOGPROBS, MASKED, EPI_WARPS, EPI_REGS)
    elif not VERIFY:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (argmax_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    elif MASKED and RETURN_LOGPROBS:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_masked_logprobs_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    elif MASKED:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_masked_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    elif RETURN_LOGPROBS:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_logprobs_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )


@gluon.jit
def _specialize_hand_in(
    mma_args,
    worker_args,
    RETURN_LOGPROBS: gl.constexpr,
    MASKED: gl.constexpr,
    EPI_WARPS: gl.constexpr,
    EPI_REGS: gl.constexpr,
):
    """``_specialize_with_epilogue``'s partitions with a hand-in epilogue."""
    if MASKED and RETURN_LOGPROBS:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_masked_hand_in_logprobs_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    elif MASKED:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_masked_hand_in_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    elif RETURN_LOGPROBS:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_hand_in_logprobs_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )
    else:
        gl.warp_specialize(
            [
                (_mma_partition, mma_args),
                (verify_hand_in_epilogue, worker_args),
                (_load_partition, worker_args),
            ],
            [EPI_WARPS, 1],
            [EPI_REGS, 24],
        )


class HopperConfig(NamedTuple):
    """Launch configuration of ``hopper_tiles_kernel``.

    block_n : rows per output tile (64 or 128: ``block_n / 16`` MMA warps)
    block_v : vocabulary ids per output tile (the wgmma N, at most 256)
    block_k : hidden-dimension chunk of one TMA copy / wgmma group
    stages : shared-memory ring slots
    chunk : accumulator rows the epilogue reduces at a time (a multiple of 8, the swizzle period)
    epi_warps, epi_regs : the epilogue partition's warps and registers per thread; 0 warps
        (TiledArgmax only): no epilogue partition, the MMA warps reduce their accumulator in
        registers (``_mma_argmax_partition``) and ``chunk`` is unused
    """

    block_n: int = 128
    block_v: int = 128
    block_k: int = 64
    stages: int = 4
    chunk: int = 16
    epi_warps: int = 4
    epi_regs: int = 152


@functools.cache
def sm_count(device_index: int) -> int:
    """Streaming multiprocessors of CUDA device ``device_index``."""
    return torch.cuda.get_device_properties(device_index).multi_processor_count


@functools.cache
def device_name(device_index: int) -> str:
    """The name of CUDA device ``device_index`` (``TUNED_BY_DEVICE``'s key)."""
    return torch.cuda.get_device_name(device_index)


def _keys_scratch(device: torch.device, numel: int) -> torch.Tensor:
    """The rows' scratch (keys and temperatures as int32 bits): one buffer per (device, stream),
    fresh during CUDA-graph capture (``flashspec_export.ops.workspace``)."""
    return launch_workspace(device, "hopper_keys", ((numel,), torch.int32))[0]


def _whole_row_block(hidden2d: torch.Tensor, block_n: int) -> torch.Tensor:
    """``hidden2d`` itself, or where it has fewer rows than one row block, those rows copied into
    a ``[block_n, H]`` buffer (one per (device, stream, dtype); fresh during CUDA-graph capture:
    ``flashspec_export.ops.workspace``).

    TMA fills a box that reaches past the tensor's last row more slowly than a whole one: on an
    H200 verify on the 64 x 128 tile at 32 rows took 289-293 µs on Llama-3 straight from the rows
    and 273 from the whole block, the copy included (``git show 51a3298:docs/BENCHMARKS.md``).
    The rows past ``R`` hold an earlier call's rows or uninitialised memory: each output row is
    its own row's dot products, and the epilogue never stores rows past ``R``.
    """
    rows, hidden_size = hidden2d.shape
    if rows >= block_n:
        return hidden2d
    tag = ("hopper_rows", hidden2d.dtype)
    (block,) = launch_workspace(hidden2d.device, tag, ((block_n, hidden_size), hidden2d.dtype))
    block[:rows].copy_(hidden2d)
    return block


def runs_on(hidden2d: torch.Tensor, lm_head: torch.Tensor) -> bool:
    """Whether ``hopper_tiles_kernel`` serves these operands: compiled (not interpreted) on an
    sm_90 GPU, 16-bit floats, and TMA-able (contiguous rows, 16-byte aligned base and stride)."""
    if not hidden2d.is_cuda or triton.knobs.runtime.interpret:
        return False
    if torch.cuda.get_device_capability(hidden2d.device)[0] != 9:
        return False
    if hidden2d.dtype not in (torch.bfloat16, torch.float16) or lm_head.dtype != hidden2d.dtype:
        return False
    return all(
        t.stride(-1) == 1 and t.data_ptr() % 16 == 0 and (t.stride(0) * t.element_size()) % 16 == 0
        for t in (hidden2d, lm_head)
    )


def launch(
    hidden2d: torch.Tensor,
    lm_head: torch.Tensor,
    vocab_size: int,
    summaries: tuple[torch.Tensor, ...],
    *,
    verify: bool,
    return_logprobs: bool = False,
    temperature: torch.Tensor | None = None,
    seed: torch.Tensor | None = None,
    positions: torch.Tensor | None = None,
    gamma: int = 0,
    allowed_tokens: torch.Tensor | None = None,
    hand_in: tuple[torch.Tensor, ...] | None = None,
    config: HopperConfig,
) -> None:
    """Stage 1 over ``hidden2d [R, H]``: fills the per-(row, tile) summaries, one split per
    ``config.block_v`` ids (``S = cdiv(vocab_size, block_v)``).

    ``summaries``: ``(best_score [R, S] float32, best_index [R, S] int32)`` and, with
    ``return_logprobs``, ``best_logit, max, sum_exp`` (each ``[R, S]`` float32), contiguous.
    VerifyResample (``verify=True``) also takes its ``temperature, seed, positions [N]`` and
    ``gamma`` (rows are ``n · (γ + 1) + i``) and optionally ``allowed_tokens``, contiguous
    ``[N, γ + 1, ceil(vocab_size / 32)]`` int32 bit masks (``reference/truncation.py``; a row's
    forbidden ids score -inf); TiledArgmax's best score is the max logit.

    ``hand_in`` (VerifyResample's top-k / top-p): ``(truncated [N] int32, thresholds [R] float32,
    counts [R] int32 zeroed, keys [R, HAND_IN_CAP] int64)``: the truncated sequences' rows append
    every dot at or above their threshold to their keys (``_hand_in_chunk``) and get no best
    (their summaries are stage 2's to write); with ``return_logprobs`` every row still gets the
    tiles' max and sum-exp.
    """
    if verify and config.epi_warps == 0:
        raise ValueError("config.epi_warps: VerifyResample needs an epilogue partition (>= 4)")
    rows, _ = hidden2d.shape
    dtype = gl.bfloat16 if hidden2d.dtype == torch.bfloat16 else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([config.block_n, config.block_k], dtype)
    a_desc = TensorDescriptor.from_tensor(
        _whole_row_block(hidden2d, config.block_n), [config.block_n, config.block_k], smem
    )
    smem = gl.NVMMASharedLayout.get_default_for([config.block_v, config.block_k], dtype)
    b_desc = TensorDescriptor.from_tensor(lm_head, [config.block_v, config.block_k], smem)
    best_score, best_index = summaries[:2]
    extra = summaries[2:] if return_logprobs else (best_score,) * 3  # never written
    scalars = (temperature, seed, positions) if verify else (best_score, best_index, best_index)
    num_tiles = triton.cdiv(vocab_size, config.block_v) * triton.cdiv(rows, config.block_n)
    device = hidden2d.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    grid = (min(num_tiles, sm_count(index)),)
    keys = _keys_scratch(device, grid[0] * SCRATCH_PER_ROW * config.block_n)
    hopper_tiles_kernel[grid](
        a_desc,
        b_desc,
        *scalars,
        best_score,
        best_index,
        *extra,
        keys,
        rows,
        gamma,
        vocab_size,
        allowed_tokens if allowed_tokens is not None else keys,  # placeholder, never read
        triton.cdiv(vocab_size, 32),
        *(hand_in if hand_in is not None else (keys,) * 4),  # placeholders, never read
        VERIFY=verify,
        RETURN_LOGPROBS=return_logprobs,
        STAGES=config.stages,
        CHUNK=config.chunk,
        EPI_WARPS=config.epi_warps,
        EPI_REGS=config.epi_regs,
        MASKED=allowed_tokens is not None,
        HAND_IN=hand_in is not None,
        num_warps=config.block_n // 16,
    )
