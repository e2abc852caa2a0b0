"""The FlashSpec noise (``reference/noise.py``) in standard ONNX ops.

Integer part: int64 ``Add``, ``Mul``, ``Div`` (truncating, equal to floor-division on the
non-negative values used here) and ``Mod`` only — TensorRT's ONNX parser refuses bitwise and
unsigned-integer ops — so it is bit-exact with the reference. Floats: ``Cast`` (round to nearest
even), ``Log``, and ``log1p(y) = log(1 + y) · y / ((1 + y) − 1)`` (``y`` when ``1 + y == 1``),
within an ulp or two of ``torch.log1p``.
"""

from __future__ import annotations

import numpy as np

from flashspec_export.onnx.builder import Body
from flashspec_export.reference import noise as spec

I64, F32 = np.int64, np.float32


def _mulmod(b: Body, x: str, y: str) -> str:
    return b.op("Mod", b.op("Mul", x, y), b.const(spec.P, I64))


def _addmod(b: Body, x: str, y: str) -> str:
    return b.op("Mod", b.op("Add", x, y), b.const(spec.P, I64))


def _rnd(b: Body, x: str) -> str:
    """rot16(x**5 % P)."""
    x2 = _mulmod(b, x, x)
    x4 = _mulmod(b, x2, x2)
    x5 = _mulmod(b, x4, x)
    low = b.op("Mod", x5, b.const(2**16, I64))
    high = b.op("Div", x5, b.const(2**16, I64))
    return b.op("Add", b.op("Mul", low, b.const(2**15, I64)), high)


def row_keys(b: Body, seed: str, position: str, stream: int) -> tuple[str, str]:
    """Row keys ``(a, b)`` of int64 ``seed`` and ``position`` (broadcastable)."""
    two31 = b.const(2**31, I64)
    p = b.const(spec.P, I64)
    s0 = b.op("Mod", seed, two31)
    s1 = b.op("Mod", b.op("Div", seed, two31), p)
    h = _rnd(b, _addmod(b, s0, b.const(spec.K_INIT, I64)))
    h = _rnd(b, _addmod(b, h, s1))
    h = _rnd(b, _addmod(b, h, position))
    h = _rnd(b, _addmod(b, h, b.const(stream, I64)))
    y = _rnd(b, _addmod(b, h, b.const(spec.K_A, I64)))
    key_a = b.op("Add", b.const(1, I64), b.op("Mod", y, b.const(spec.P - 1, I64)))
    key_b = _rnd(b, _addmod(b, h, b.const(spec.K_B, I64)))
    return key_a, key_b


def token_bits(b: Body, key_a: str | None, key_b: str, token: str | None) -> str:
    """Hash integer in [0, P) of int64 token ids under the row keys (broadcast).

    ``token=None`` means token id 0, where ``(a * 0 + b) % P == b``: the multiply is left out
    (TensorRT's Myelin compiler fails on an int64 multiply by a constant zero).
    """
    x = key_b if token is None else _addmod(b, _mulmod(b, key_a, token), key_b)
    x = _rnd(b, x)
    return _rnd(b, _addmod(b, x, b.const(spec.K_MIX, I64)))


def uniform_from_bits(b: Body, x: str) -> str:
    """fp32 ``(2 * (x // 256) + 1) * 2**-24``, exact."""
    odd = b.op(
        "Add", b.op("Mul", b.op("Div", x, b.const(256, I64)), b.const(2, I64)), b.const(1, I64)
    )
    return b.op("Mul", b.op("Cast", odd, to=1), b.const(2.0**-24, F32))


def _log1p(b: Body, y: str) -> str:
    one = b.const(1.0, F32)
    z = b.op("Add", one, y)
    d = b.op("Sub", z, one)
    exact_one = b.op("Equal", d, b.const(0.0, F32))
    ratio = b.op("Div", y, b.op("Where", exact_one, one, d))
    return b.op("Where", exact_one, y, b.op("Mul", b.op("Log", z), ratio))


def gumbel_from_bits(b: Body, x: str) -> str:
    """fp32 Gumbel ``-log(E)``, ``E = -log(1 - W)``, ``W = (x + 1) / 2**31`` (see noise.py)."""
    k = b.op("Add", x, b.const(1, I64))
    scale = b.const(2.0**-31, F32)
    w = b.op("Mul", b.op("Cast", k, to=1), scale)
    complement = b.op("Mul", b.op("Cast", b.op("Sub", b.const(spec.P, I64), x), to=1), scale)
    small = b.op("Less", k, b.const(2**30, I64))
    exponential = b.op(
        "Where", small, b.op("Neg", _log1p(b, b.op("Neg", w))), b.op("Neg", b.op("Log", complement))
    )
    return b.op("Neg", b.op("Log", exponential))
