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
memory traffic. Row keys are derived once per row in int64. (The Hopper verify epilogue gets the
first round's values for runs of consecutive ids from five add-mods per id:
``kernels/hopper_tiles.py: _run_bits``.)
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
_TWO_POW_27: tl.constexpr = tl.constexpr(2**27)
_LN2: tl.constexpr = tl.constexpr(0.6931471805599453)
# |gumbel_approx_from_bits(x) - gumbel_from_bits(x)| <= GUMBEL_APPROX_ERROR for every x in [0, P):
# measured over all 2**31 - 1 values on an H100 (max 2.06e-5; tests/parity/test_gumbel_approx.py
# repeats the exhaustive check on a GPU and samples it under the interpreter), with 4x slack.
GUMBEL_APPROX_ERROR: tl.constexpr = tl.constexpr(8e-5)


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
def _mul_mod_i64(x, y):
    """``(x * y) % P`` for int64 ``x, y`` in ``[0, P)`` (per-row key derivation only)."""
    z = x * y
    return _sub_p((z & P) + (z >> 31))


@triton.jit
def sub_mod(x, y):
    """``(x - y) % P`` for ``x, y`` in ``[0, P)`` (int64 or uint32): ``x + (P - y) < 2P``."""
    return _sub_p(x + (P - y))


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
def _rnd_i64(x):
    x2 = _mul_mod_i64(x, x)
    x4 = _mul_mod_i64(x2, x2)
    return rot16(_mul_mod_i64(x4, x))


@triton.jit
def row_keys(seed, position, stream):
    """Row keys ``(a, b)`` of ``reference.noise.row_keys``, once per row (int64 arithmetic).

    ``seed`` int64 in ``[0, 2**63)``, ``position`` int64 in ``[0, P)``, ``stream`` a small int;
    any broadcastable shapes. Returns uint32 ``a`` in ``[1, P - 1]`` and ``b`` in ``[0, P)``.
    """
    seed = seed.to(tl.int64)
    position = position.to(tl.int64)
    s0 = seed & P  # seed % 2**31, in [0, P]: K_INIT + s0 < 2P
    hi = seed >> 31  # below 2**32: one fold leaves at most P + 1
    s1 = _sub_p((hi & P) + (hi >> 31))
    h = _rnd_i64(add_mod(s0, K_INIT))
    h = _rnd_i64(add_mod(h, s1))
    h = _rnd_i64(add_mod(h, position))
    h = _rnd_i64(add_mod(h, stream))
    y = _rnd_i64(add_mod(h, K_A))
    a = 1 + tl.where(y == P - 1, 0, y)  # 1 + y % (P - 1) for y in [0, P)
    b = _rnd_i64(add_mod(h, K_B))
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
def _log2_approx(x, LIBDEVICE: tl.constexpr):
    """fp32 ``log2`` of a normal ``x``: the special-function unit's ``lg2.approx`` when compiled
    (one MUFU instruction, absolute error ~2**-22 on the mantissa; ``.ftz``: without the
    rescaling of subnormal inputs, which ``gumbel_approx_from_bits`` never passes), NumPy's under
    the interpreter."""
    if LIBDEVICE:
        return tl.inline_asm_elementwise(
            "lg2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32, is_pure=True, pack=1
        )
    else:
        return tl.log2(x)


@triton.jit
def gumbel_approx_from_bits(x, LIBDEVICE: tl.constexpr):
    """An approximation of ``gumbel_from_bits(x)`` within ``GUMBEL_APPROX_ERROR``, for ranking.

    ``E = -log(1 - W)`` with ``1 - W = (P - x) * 2**-31``: for ``W < 2**-4`` (``x + 1 < 2**27``) the
    series ``W + W²/2 + ... + W⁷/7`` (truncation below ``W**7 / 8 < 2**-31`` relative), else
    ``ln 2 · (31 - lg2(fp32(P - x)))`` (absolute error ~2**-22, relative at most ~2**-18 as
    ``E >= 2**-4``); then ``g = -ln 2 · lg2(E)``. Both ``lg2`` inputs are normal floats
    (``P - x >= 1``, ``E >= 2**-31``). Two MUFU instructions and ~12 others, against
    the exact form's libdevice ``log1pf`` and two ``logf`` (both branches of its select run).
    Never used for an emitted value: the Hopper verify epilogue ranks with it and recomputes the
    winner exactly (``kernels/hopper_tiles.py: _sampled_chunk_best``).
    """
    k = x + 1
    w = k.to(tl.float32) * _TWO_POW_M31  # exact: k < 2**31 (x < P)
    series = w * (
        1.0 + w * (0.5 + w * (1.0 / 3 + w * (0.25 + w * (0.2 + w * (1.0 / 6 + w * (1.0 / 7))))))
    )
    complement = (-(x - P)).to(tl.float32)  # fp32(P - x), as the exact form's large branch
    logform = _LN2 * (31.0 - _log2_approx(complement, LIBDEVICE))
    e = tl.where(k < _TWO_POW_27, series, logform)
    return -_LN2 * _log2_approx(e, LIBDEVICE)


@triton.jit
def _gumbel_error_kernel(
    max_error_ptr,  # [programs] float32 out
    start,
    num_values,
    LIBDEVICE: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Per program: max |gumbel_approx_from_bits(x) - gumbel_from_bits(x)| over its ``BLOCK``
    hash values ``x = start + ...`` (``x < num_values``)."""
    offs = start + tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    ok = offs < num_values
    x = tl.where(ok, offs, 0).to(tl.uint32)
    # Named before tl.abs: the Triton 3.9 interpreter cannot take a jit call's result inline.
    approx = gumbel_approx_from_bits(x, LIBDEVICE)
    error = tl.abs(approx - gumbel_from_bits(x, LIBDEVICE))
    tl.store(max_error_ptr + tl.program_id(0), tl.max(tl.where(ok, error, 0.0), 0))


def gumbel_approx_error(start: int, stop: int, device) -> float:
    """Max |approximate - exact| Gumbel over the hash values ``x`` in ``[start, stop)``."""
    block = 1024
    chunk = 2**28
    worst = 0.0
    for lo in range(start, stop, chunk):
        hi = min(stop, lo + chunk)
        programs = triton.cdiv(hi - lo, block)
        out = torch.empty(programs, dtype=torch.float32, device=device)
        _gumbel_error_kernel[(programs,)](out, lo, hi, LIBDEVICE=use_libdevice(out), BLOCK=block)
        worst = max(worst, out.max().item())
    return worst


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
