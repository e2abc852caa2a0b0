"""Stage 1 of both ops on Hopper (sm_90) from 64 rows: a persistent, warp-specialised GEMM
whose epilogue is the op's per-tile reduction, overlapped with the next tile's tensor-core work.

The portable Triton kernels (``verify_resample``, ``tiled_argmax``) run the matmul and the
epilogue (a hash, two logs and a compare per logit for VerifyResample) one after the other in
the same warps, so at GEMM-shaped row counts the tensor cores idle while the epilogue runs
(docs/BENCHMARKS.md: verify 1.5-2× the cuBLAS matmul at 128-512 rows). Here each CTA (one per
SM) walks output tiles ``(vocabulary tile, row block)`` — row blocks innermost, so the CTAs
working at one time share LM-head tiles in L2 and DRAM streams the head about once — with three
partitions connected by mbarriers:

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

The arithmetic per logit is the portable kernels' (``kernels/noise.py``; IEEE division by the
temperature, ``libdevice`` logs), so the tokens are bit-equal to them. TMA zero-fills rows past
``R`` and LM-head rows past ``V``; ids at or past ``vocab_size`` are masked to ``-inf``.
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

from flashspec_export.kernels.noise import STREAM_GUMBEL, gumbel_from_bits, row_keys, token_bits


@gluon.jit
def _argmax_combine(value_a, index_a, value_b, index_b):
    """(max, its id) with ties to the lowest id — ``tl.max(..., return_indices=True)``'s rule."""
    take_a = (value_a > value_b) | ((value_a == value_b) & (index_a < index_b))
    return gl.where(take_a, value_a, value_b), gl.where(take_a, index_a, index_b)


@gluon.jit
def _load_partition(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    acc_buf,
    acc_ready,
    acc_empty,
    params,
    VERIFY: gl.constexpr,
    RETURN_LOGPROBS: gl.constexpr,
):
    """TMA producer: for every K chunk of every tile of this CTA, one ring slot."""
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
            tma.async_copy_global_to_shared(
                a_desc, [row_block * BLOCK_N, kk * BLOCK_K], ready.index(slot), a_bufs.index(slot)
            )
            tma.async_copy_global_to_shared(
                b_desc, [v_tile * BLOCK_V, kk * BLOCK_K], ready.index(slot), b_bufs.index(slot)
            )
            it += 1


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
    BLOCK_N: gl.constexpr,
    BLOCK_V: gl.constexpr,
):
    """wgmma consumer: one fp32 accumulator tile per output tile, handed over in shared memory."""
    STAGES: gl.constexpr = a_bufs.type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    layout: gl.constexpr = gl.NVMMADistributedLayout(
        version=[3, 0], warps_per_cta=[BLOCK_N // 16, 1], instr_shape=[16, BLOCK_V, 16]
    )
    k_iters = gl.cdiv(a_desc.shape[1], BLOCK_K)
    it = 0
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        count = tile // gl.num_programs(0)  # this CTA's tiles before this one
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
            gl.thread_barrier()
            mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES), pred=kk > 0)
            it += 1
        acc = warpgroup_mma_wait(num_outstanding=0, deps=(acc,))
        gl.thread_barrier()
        mbarrier.arrive(empty.index((it + STAGES - 1) % STAGES))
        mbarrier.wait(acc_empty, (count & 1) ^ 1)
        acc_buf.store(acc)
        gl.thread_barrier()
        mbarrier.arrive(acc_ready)


@gluon.jit
def _epilogue_partition(
    a_desc,
    b_desc,
    a_bufs,
    b_bufs,
    ready,
    empty,
    acc_buf,
    acc_ready,
    acc_empty,
    params,
    VERIFY: gl.constexpr,
    RETURN_LOGPROBS: gl.constexpr,
):
    """Per tile: the op's reduction of the accumulator into per-(row, tile) summaries."""
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
    NUM_CHUNKS: gl.constexpr = acc_buf.type.shape[0]
    CHUNK: gl.constexpr = acc_buf.type.shape[1]
    BLOCK_V: gl.constexpr = acc_buf.type.shape[2]
    BLOCK_N: gl.constexpr = NUM_CHUNKS * CHUNK
    keys_ptr = params[13] + gl.program_id(0) * (2 * BLOCK_N)  # this CTA's [2, BLOCK_N] uint32
    EPI_WARPS: gl.constexpr = gl.num_warps()
    layout: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [EPI_WARPS, 1], [1, 0])
    row_layout: gl.constexpr = gl.SliceLayout(1, layout)
    col_layout: gl.constexpr = gl.SliceLayout(0, layout)
    block_layout: gl.constexpr = gl.BlockedLayout([1], [32], [EPI_WARPS], [0])
    num_splits = gl.cdiv(vocab_size, BLOCK_V)
    for tile in range(gl.program_id(0), num_tiles, gl.num_programs(0)):
        count = tile // gl.num_programs(0)  # this CTA's tiles before this one
        v_tile = tile // row_blocks
        row_block = tile - v_tile * row_blocks
        if VERIFY:
            # The noise keys of the block's rows, once per tile, shared through the CTA's scratch.
            rows = row_block * BLOCK_N + gl.arange(0, BLOCK_N, layout=block_layout)
            row_ok = rows < num_rows
            seq = rows // (gamma + 1)
            seed = gl.load(seed_ptr + seq, mask=row_ok, other=0)
            position = gl.load(positions_ptr + seq, mask=row_ok, other=0)
            position += rows - seq * (gamma + 1)
            key_a, key_b = row_keys(seed, position, STREAM_GUMBEL)
            gl.thread_barrier()  # the previous tile's reads of this CTA's keys are done
            gl.store(keys_ptr + gl.arange(0, BLOCK_N, layout=block_layout), key_a)
            gl.store(keys_ptr + BLOCK_N + gl.arange(0, BLOCK_N, layout=block_layout), key_b)
            gl.thread_barrier()
        mbarrier.wait(acc_ready, count & 1)
        cols = v_tile * BLOCK_V + gl.arange(0, BLOCK_V, layout=col_layout)
        col_ok = cols < vocab_size
        for chunk in range(NUM_CHUNKS):
            rows = row_block * BLOCK_N + chunk * CHUNK + gl.arange(0, CHUNK, layout=row_layout)
            row_ok = rows < num_rows
            acc = acc_buf.index(chunk).load(layout)  # [CHUNK, BLOCK_V] fp32
            if VERIFY:
                seq = rows // (gamma + 1)
                temperature = gl.load(temperature_ptr + seq, mask=row_ok, other=1.0)
                greedy = temperature == 0.0
                scale = gl.where(greedy, 1.0, temperature)
                logits = gl.div_rn(acc, gl.expand_dims(scale, 1))
                logits = gl.where(gl.expand_dims(col_ok, 0), logits, float("-inf"))
                any_sampled = gl.max(gl.where(row_ok & (temperature != 0.0), 1, 0), 0) > 0
                if any_sampled:
                    in_block = chunk * CHUNK + gl.arange(0, CHUNK, layout=row_layout)
                    key_a = gl.load(keys_ptr + in_block)
                    key_b = gl.load(keys_ptr + BLOCK_N + in_block)
                    bits = token_bits(
                        gl.expand_dims(key_a, 1), gl.expand_dims(key_b, 1), gl.expand_dims(cols, 0)
                    )
                    score = gl.where(
                        gl.expand_dims(greedy, 1), logits, logits + gumbel_from_bits(bits, True)
                    )
                else:
                    score = logits
            else:
                logits = gl.where(gl.expand_dims(col_ok, 0), acc, float("-inf"))
                score = logits
            ids = gl.expand_dims(cols, 0) + gl.zeros([CHUNK, BLOCK_V], gl.int32, layout)
            best, best_id = gl.reduce((score, ids), 1, _argmax_combine)
            ws_off = rows * num_splits + v_tile
            gl.store(best_score_ptr + ws_off, best, mask=row_ok)
            gl.store(best_index_ptr + ws_off, best_id, mask=row_ok)
            if RETURN_LOGPROBS:
                hit = ids == gl.expand_dims(best_id, 1)
                best_logit = gl.sum(gl.where(hit, logits, 0.0), 1)
                m = gl.max(logits, 1)
                m_ref = gl.where(m == float("-inf"), 0.0, m)
                s = gl.sum(gl.exp(logits - gl.expand_dims(m_ref, 1)), 1)
                gl.store(best_logit_ptr + ws_off, best_logit, mask=row_ok)
                gl.store(max_ptr + ws_off, m, mask=row_ok)
                gl.store(sum_exp_ptr + ws_off, s, mask=row_ok)
        gl.thread_barrier()  # every read of acc_buf is done
        mbarrier.arrive(acc_empty)


@gluon.jit
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
    keys_ptr,  # [grid, 2, BLOCK_N] uint32 scratch: the noise keys of a CTA's current row block
    num_rows,
    gamma,
    vocab_size,
    VERIFY: gl.constexpr,
    RETURN_LOGPROBS: gl.constexpr,
    STAGES: gl.constexpr,
    CHUNK: gl.constexpr,
    EPI_WARPS: gl.constexpr,
    EPI_REGS: gl.constexpr,
):
    BLOCK_N: gl.constexpr = a_desc.block_type.shape[0]
    BLOCK_K: gl.constexpr = a_desc.block_type.shape[1]
    BLOCK_V: gl.constexpr = b_desc.block_type.shape[0]
    row_blocks = gl.cdiv(num_rows, BLOCK_N)
    num_tiles = gl.cdiv(vocab_size, BLOCK_V) * row_blocks

    a_bufs = gl.allocate_shared_memory(a_desc.dtype, [STAGES, BLOCK_N, BLOCK_K], a_desc.layout)
    b_bufs = gl.allocate_shared_memory(b_desc.dtype, [STAGES, BLOCK_V, BLOCK_K], b_desc.layout)
    acc_layout: gl.constexpr = gl.SwizzledSharedLayout(
        vec=4, per_phase=1, max_phase=8, order=[1, 0]
    )
    acc_buf = gl.allocate_shared_memory(gl.float32, [BLOCK_N, BLOCK_V], acc_layout)
    # The epilogue's view: chunks of CHUNK rows (a multiple of the swizzle's 8-row period, so
    # both views address every element alike).
    acc_chunks = acc_buf._reinterpret(gl.float32, [BLOCK_N // CHUNK, CHUNK, BLOCK_V], acc_layout)
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    acc_ready = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    acc_empty = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    mbarrier.init(acc_ready, count=1)
    mbarrier.init(acc_empty, count=1)

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
    )
    worker_args = (
        a_desc,
        b_desc,
        a_bufs,
        b_bufs,
        ready,
        empty,
        acc_chunks,
        acc_ready,
        acc_empty,
        params,
        VERIFY,
        RETURN_LOGPROBS,
    )
    gl.warp_specialize(
        [
            (
                _mma_partition,
                (
                    a_desc,
                    a_bufs,
                    b_bufs,
                    ready,
                    empty,
                    acc_buf,
                    acc_ready,
                    acc_empty,
                    num_tiles,
                    BLOCK_N,
                    BLOCK_V,
                ),
            ),
            (_epilogue_partition, worker_args),
            (_load_partition, worker_args),
        ],
        [EPI_WARPS, 1],
        [EPI_REGS, 24],
    )


class HopperConfig(NamedTuple):
    """Launch configuration of ``hopper_tiles_kernel``.

    block_n : rows per output tile (64 or 128: ``block_n / 16`` MMA warps)
    block_v : vocabulary ids per output tile (the wgmma N)
    block_k : hidden-dimension chunk of one TMA copy / wgmma group
    stages : shared-memory ring slots
    chunk : accumulator rows the epilogue reduces at a time (a multiple of 8, the swizzle period)
    epi_warps, epi_regs : the epilogue partition's warps and registers per thread
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


_SCRATCH: dict[tuple, torch.Tensor] = {}


def _keys_scratch(device: torch.device, numel: int) -> torch.Tensor:
    """The keys scratch (uint32 as int32), allocated once per (device, size): CUDA-graph safe."""
    key = (device, numel)
    if key not in _SCRATCH:
        _SCRATCH[key] = torch.empty(numel, dtype=torch.int32, device=device)
    return _SCRATCH[key]


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
    config: HopperConfig,
) -> None:
    """Stage 1 over ``hidden2d [R, H]``: fills the per-(row, tile) summaries, one split per
    ``config.block_v`` ids (``S = cdiv(vocab_size, block_v)``).

    ``summaries``: ``(best_score [R, S] float32, best_index [R, S] int32)`` and, with
    ``return_logprobs``, ``best_logit, max, sum_exp`` (each ``[R, S]`` float32), contiguous.
    VerifyResample (``verify=True``) also takes its ``temperature, seed, positions [N]`` and
    ``gamma`` (rows are ``n · (γ + 1) + i``); TiledArgmax's best score is the max logit.
    """
    rows, _ = hidden2d.shape
    dtype = gl.bfloat16 if hidden2d.dtype == torch.bfloat16 else gl.float16
    smem = gl.NVMMASharedLayout.get_default_for([config.block_n, config.block_k], dtype)
    a_desc = TensorDescriptor.from_tensor(hidden2d, [config.block_n, config.block_k], smem)
    smem = gl.NVMMASharedLayout.get_default_for([config.block_v, config.block_k], dtype)
    b_desc = TensorDescriptor.from_tensor(lm_head, [config.block_v, config.block_k], smem)
    best_score, best_index = summaries[:2]
    extra = summaries[2:] if return_logprobs else (best_score,) * 3  # never written
    scalars = (temperature, seed, positions) if verify else (best_score, best_index, best_index)
    num_tiles = triton.cdiv(vocab_size, config.block_v) * triton.cdiv(rows, config.block_n)
    device = hidden2d.device
    index = device.index if device.index is not None else torch.cuda.current_device()
    grid = (min(num_tiles, sm_count(index)),)
    keys = _keys_scratch(device, grid[0] * 2 * config.block_n)
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
        VERIFY=verify,
        RETURN_LOGPROBS=return_logprobs,
        STAGES=config.stages,
        CHUNK=config.chunk,
        EPI_WARPS=config.epi_warps,
        EPI_REGS=config.epi_regs,
        num_warps=config.block_n // 16,
    )
