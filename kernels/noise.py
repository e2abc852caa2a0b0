"""Triton device functions for the FlashSpec noise (``flashspec_export.reference.noise``).

The integer hash is bit-exact with the reference: every value lives in ``[0, P)``,
``P = 2**31 - 1``, in int64, and every ``% P`` of the reference is computed with the Mersenne
identity ``2**31 ≡ 1 (mod P)``: ``z % P == fold(z) % P`` with ``fold(z) = (z & P) + (z >> 31)``,
followed by one conditional subtraction. The bounds that make one fold and one subtraction
enough are stated next to each use. Integer division by 2**k becomes a shift and ``% 2**k`` a
mask (all values are non-negative).

Floats: ``uniform`` is exact. ``exponential`` / ``gumbel`` use ``log`` / ``log1p`` of the same
fp32 arguments as the reference. With ``LIBDEVICE`` (compiled for CUDA) they are libdevice's
``__nv_logf`` / ``__nv_log1pf``, the functions torch's CUDA kernels call, so they agree with the
reference on the GPU to the bit. The Triton interpreter has no libdevice; there ``log`` is NumPy's
and ``log1p(y)`` is ``log(1 + y) * y / ((1 + y) - 1)`` (``y`` when ``1 + y == 1``), the form
the ONNX bodies use, within an ulp or two of ``log1p``.

Cost per vocabulary element (``token_bits`` + ``gumbel_from_bits``): 7 multiply-mods in 32-bit
instructions (``umulhi`` for the high word), two rotations and two logs, all in registers; no
memory traffic. Row keys are derived once per row (the seed split in int64, then 32-bit). (The
Hopper verify epilogue gets the first round's values for runs of consecutive ids from five
add-mods per id: ``kernels/hopper_tiles.py: _run_bits``.)
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from flashspec_export.reference import noise as spec

P: tl.constexpr = tl.constexpr(spec.P)
K_INIT: tl.constexpr = tl.constexpr(spec.K_INIT)
K_A: tl.constexpr = tl.constexpr(spec.K_A)
K_B: tl.constexpr = tl.constexpr(spec.K_B)
K_MIX: tl.constexpr = tl.constexpr(spec.K_MIX)
STREAM_GUMBEL: tl.constexpr = tl.constexpr(spec.STREAM_GUMBEL)
STREAM_PICK: tl.constexpr = tl.constexpr(spec.STREAM_PICK)
_TWO_POW_30: tl.constexpr = tl.constexpr(2**30)
_TWO_POW_M24: tl.constexpr = tl.constexpr(2.0**-24)
_TWO_POW_M31: tl.constexpr = tl.constexpr(2.0**-31)


@triton.jit
def _sub_p(r):
    """``r % P`` for ``r`` in ``[0, 2P)`` (int64 or uint32)."""
    return tl.where(r >= P, r - P, r)


@triton.jit
def add_mod(x, y):
    """``(x + y) % P`` for ``x, y`` in ``[0, P]`` with ``x + y < 2P`` (int64 or uint32)."""
    return _sub_p(x + y)


@triton.jit
def mul_mod(x, y):
    """``(x * y) % P`` for uint32 ``x, y`` in ``[0, P)``, in 32-bit instructions only.

    The product ``z = x * y <= (P - 1)**2 < 2**62`` is held as ``hi · 2**32 + lo`` (``lo`` the
    wrapped product, ``hi = umulhi(x, y) < 2**30``). Fold: ``z & P = lo & P`` and
    ``z >> 31 = (hi << 1) | (lo >> 31) <= 2**31 - 4``, so the sum is below ``2P`` (fits uint32)
    and one subtraction finishes the reduction.
    """
    lo = x * y
    hi = tl.umulhi(x, y)
    return _sub_p((lo & P) + ((hi << 1) | (lo >> 31)))


@triton.jit
def rot16(x):
    """(x % 2**16) * 2**15 + x // 2**16 — the 31-bit word rotated by 16."""
    return ((x & 0xFFFF) << 15) + (x >> 16)


@triton.jit
def pow5(x):
    """``x**5 % P`` on uint32 ``x`` in ``[0, P)``: three multiply-mods."""
    x2 = mul_mod(x, x)
    x4 = mul_mod(x2, x2)
    return mul_mod(x4, x)


@triton.jit
def rnd(x):
    """The hash round ``rot16(x**5 % P)`` on uint32 ``x`` in ``[0, P)``."""
    return rot16(pow5(x))


@triton.jit
def row_keys(seed, position, stream):
    """Row keys ``(a, b)`` of ``reference.noise.row_keys``, once per row.

    ``seed`` int64 in ``[0, 2**63)``, ``position`` int64 in ``[0, P)``, ``stream`` a small int;
    any broadcastable shapes. Returns uint32 ``a`` in ``[1, P - 1]`` and ``b`` in ``[0, P)``.
    The seed's halves are split in int64, then every value is in ``[0, P]`` and the rounds run
    in 32-bit instructions (``rnd``), as ``token_bits``: about half the instructions of int64
    products, which matters where a program derives one row's keys (stage 2 of top-k / top-p).
    """
    seed = seed.to(tl.int64)
    s0 = (seed & P).to(tl.uint32)  # seed % 2**31, in [0, P]: K_INIT + s0 < 2P
    hi = seed >> 31  # below 2**32: one fold leaves at most P + 1, one subtraction at most P
    s1 = _sub_p((hi & P) + (hi >> 31)).to(tl.uint32)
    h = rnd(add_mod(s0, K_INIT))
    h = rnd(add_mod(h, s1))
    h = rnd(add_mod(h, position.to(tl.int64).to(tl.uint32)))
    h = rnd(add_mod(h, stream))
    y = rnd(add_mod(h, K_A))
    a = 1 + tl.where(y == P - 1, 0, y)  # 1 + y % (P - 1) for y in [0, P)
    b = rnd(add_mod(h, K_B))
    return a.to(tl.uint32), b.to(tl.uint32)


@triton.jit
def token_bits(a, b, token):
    """The hash integer (uint32, in ``[0, P)``) of token ids ``token`` (``[0, P)``) under the
    uint32 row keys ``(a, b)``: 7 multiply-mods of 32-bit instructions per element."""
    x = add_mod(mul_mod(a, token.to(tl.uint32)), b)  # (a * token + b) % P
    x = rnd(x)
    return rnd(add_mod(x, K_MIX))


@triton.jit
def math_exp(x, LIBDEVICE: tl.constexpr):
    """fp32 ``exp``: libdevice's ``__nv_expf`` (as torch on CUDA) when compiled, else NumPy's."""
    if LIBDEVICE:
        return libdevice.exp(x)
    else:
        return tl.exp(x)


@triton.jit
def math_log(x, LIBDEVICE: tl.constexpr):
    """fp32 ``log``: libdevice's ``__nv_logf`` (as torch on CUDA) when compiled, else NumPy's."""
    if LIBDEVICE:
        return libdevice.log(x)
    else:
        return tl.log(x)


@triton.jit
def _log1p(y, LIBDEVICE: tl.constexpr):
    if LIBDEVICE:
        return libdevice.log1p(y)
    else:
        # log(1 + y) * y / ((1 + y) - 1): the rounding error of 1 + y cancels to first order.
        z = 1.0 + y
        d = z - 1.0
        exact = tl.log(z) * y / tl.where(d == 0.0, 1.0, d)
        return tl.where(d == 0.0, y, exact)


@triton.jit
def uniform_from_bits(x):
    """fp32 ``(2 * (x // 256) + 1) * 2**-24``: exact, in ``(0, 1)``."""
    return ((x >> 8) * 2 + 1).to(tl.float32) * _TWO_POW_M24


@triton.jit
def exponential_from_bits(x, LIBDEVICE: tl.constexpr):
    """fp32 Exp(1) variate ``-log(1 - W)``, ``W = (x + 1) * 2**-31``, accurate near 0."""
    k = x + 1
    small = k < _TWO_POW_30
    # Both branches are evaluated; each gets a harmless argument where it is not selected.
    w = tl.where(small, k, 0).to(tl.float32) * _TWO_POW_M31
    complement = tl.where(small, 1.0, (-(x - P)).to(tl.float32) * _TWO_POW_M31)
    return tl.where(small, -_log1p(-w, LIBDEVICE), -math_log(complement, LIBDEVICE))


@triton.jit
def gumbel_from_bits(x, LIBDEVICE: tl.constexpr):
    """fp32 standard Gumbel variate ``-log(E)``, in ``[-3.07, 21.5]``."""
    return -math_log(exponential_from_bits(x, LIBDEVICE), LIBDEVICE)


@triton.jit
def _noise_kernel(
    seed_ptr,  # [M] int64
    position_ptr,  # [M] int64
    token_ptr,  # [M] int64
    bits_ptr,  # [M] int64 out
    uniform_ptr,  # [M] float32 out
    gumbel_ptr,  # [M] float32 out
    num_values,
    stream,
    LIBDEVICE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Element-wise noise of (seed, position, token) triples (parity tests, debugging)."""
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < num_values
    seed = tl.load(seed_ptr + offs, mask=ok, other=0)
    position = tl.load(position_ptr + offs, mask=ok, other=0)
    token = tl.load(token_ptr + offs, mask=ok, other=0)
    a, b = row_keys(seed, position, stream)
    x = token_bits(a, b, token)
    tl.store(bits_ptr + offs, x.to(tl.int64), mask=ok)
    tl.store(uniform_ptr + offs, uniform_from_bits(x), mask=ok)
    tl.store(gumbel_ptr + offs, gumbel_from_bits(x, LIBDEVICE), mask=ok)


def use_libdevice(t) -> bool:
    """Whether kernels launched on ``t``'s device are compiled (CUDA), not interpreted."""
    return t.is_cuda and not triton.knobs.runtime.interpret


def evaluate_noise(seed, position, token, stream: int):
    """Bits, uniform and Gumbel noise of int64 ``seed, position, token`` (same 1-D shape [M]).

    Returns
    -------
    bits : [M] int64, uniform : [M] float32, gumbel : [M] float32 — as ``reference.noise.bits``,
        ``uniform_from_bits`` and ``gumbel_from_bits``.
    """
    seed, position, token = (t.to(torch.int64).contiguous() for t in (seed, position, token))
    bits = torch.empty_like(seed)
    uniform = torch.empty(seed.shape, dtype=torch.float32, device=seed.device)
    gumbel = torch.empty_like(uniform)
    block = 1024
    grid = (triton.cdiv(seed.numel(), block),)
    _noise_kernel[grid](
        seed,
        position,
        token,
        bits,
        uniform,
        gumbel,
        seed.numel(),
        stream,
        LIBDEVICE=use_libdevice(seed),
        BLOCK=block,
    )
    return bits, uniform, gumbel


@triton.jit(do_not_specialize=["width", "vocab", "stream"])
def _exponential_race_kernel(
    weights_ptr,  # [M, V] float32, rows of unit stride (M = N · width)
    seed_ptr,  # [N] int64: row m's is m // width's
    position_ptr,  # [M] int64
    score_ptr,  # [M, num_chunks] float32 out: each chunk's best w / E (NaN as +inf)
    index_ptr,  # [M, num_chunks] int64 out: its first id
    width,
    vocab,
    stream,
    LIBDEVICE: tl.constexpr,
    CHUNK: tl.constexpr,  # ids a program races, a multiple of BLOCK
    BLOCK: tl.constexpr,
):
    """Row ``program_id(0)``'s chunk ``program_id(1)``: ``max_v w_v / E_v`` over its ids and the
    first id that takes it (torch.argmax's rule: NaN is the largest)."""
    m = tl.program_id(0)
    chunk = tl.program_id(1)
    a, b = row_keys(tl.load(seed_ptr + m // width), tl.load(position_ptr + m), stream)
    best = tl.full([], float("-inf"), tl.float32)
    best_id = (chunk * CHUNK).to(tl.int64)
    row = weights_ptr + m.to(tl.int64) * vocab
    for start in range(chunk * CHUNK, tl.minimum(chunk * CHUNK + CHUNK, vocab), BLOCK):
        v = start + tl.arange(0, BLOCK)
        ok = v < vocab
        w = tl.load(row + v, mask=ok, other=0.0)
        e = exponential_from_bits(token_bits(a, b, v), LIBDEVICE)
        score = tl.where(ok, tl.math.div_rn(w, e), float("-inf"))
        score = tl.where(score == score, score, float("inf"))
        block_best, block_id = tl.max(score, 0, return_indices=True,
                                      return_indices_tie_break_left=True)  # fmt: skip
        take = block_best > best  # an earlier block keeps a tie
        best_id = tl.where(take, (start + block_id).to(tl.int64), best_id)
        best = tl.where(take, block_best, best)
    at = m.to(tl.int64) * tl.num_programs(1) + chunk
    tl.store(score_ptr + at, best)
    tl.store(index_ptr + at, best_id)


# Ids a program of the race takes: 16 programs a row on a 128k vocabulary (one a row took 360 µs
# for 16 rows on an H200, docs/bench/truncation_whole_call_h200.log).
RACE_CHUNK = 8192


def exponential_race(weights, seed, positions, stream: int):
    """``reference.sampled_verify.exponential_race`` with the noise computed in registers (the
    reference materialises it in int64, dozens of passes over [N, R, V]): each row raced in
    chunks of ``RACE_CHUNK`` ids, then the first id of the best chunk scores. ``weights [N, R,
    V]`` float32, ``seed [N]`` int64, ``positions [N, R]`` int64 -> [N, R] int64. Bit for bit
    the reference's on a GPU (libdevice's logs, IEEE division), within the interpreter's logs on
    the CPU."""
    n, width, vocab = weights.shape
    rows = n * width
    weights = weights.contiguous()
    seed = seed.to(torch.int64).contiguous()
    positions = positions.to(torch.int64).contiguous()
    chunks = triton.cdiv(vocab, RACE_CHUNK)
    scores = torch.empty((rows, chunks), dtype=torch.float32, device=weights.device)
    index = torch.empty((rows, chunks), dtype=torch.int64, device=weights.device)
    if rows:
        _exponential_race_kernel[(rows, chunks)](
            weights, seed, positions, scores, index, width, vocab, stream,
            LIBDEVICE=use_libdevice(weights), CHUNK=RACE_CHUNK, BLOCK=2048,
        )  # fmt: skip
    # the first id among the chunks' best (chunks in id order; NaN came as +inf, which ties)
    best = scores.max(dim=1, keepdim=True).values
    first = index.masked_fill(scores != best, torch.iinfo(torch.int64).max).min(dim=1).values
    return first.view(n, width)
