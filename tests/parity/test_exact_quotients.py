"""The Hopper epilogue's division by the temperature (``kernels/hopper_tiles._quotients``), its
arithmetic replayed exactly on the CPU: ``y = RN(1/T)``, ``q = RN(x·y)`` and two corrections
``q = RN(q + RN(x - T·q)·y)`` (each fused multiply-add rounded once, in exact rationals) equal the
IEEE quotient ``RN(x / T)`` — the reference's ``l / T`` — over the range ``_chunk_flags`` admits
(dots zero or of magnitude 2^-64 .. 2^64, T 2^-40 .. 2^40), at its edges and with significands
crowded at the ulp boundaries. Without the corrections a quarter of the quotients are off, so the
cases have the power to see a step left out. ``tests/parity/test_hopper_tiles_gpu.py`` runs the
kernel itself against torch's division on 2^27 values."""

from __future__ import annotations

import random
from fractions import Fraction

import numpy as np
import pytest

hopper_tiles = pytest.importorskip("flashspec_export.kernels.hopper_tiles")

DOT_MAX = hopper_tiles.QUOTIENT_DOT_MAX.value
T_MAX = hopper_tiles.QUOTIENT_T_MAX.value


def _rn(value: Fraction) -> float:
    """The float32 nearest ``value`` (ties to even), in the normal range."""
    if value == 0:
        return 0.0
    magnitude = abs(value)
    exponent = magnitude.numerator.bit_length() - magnitude.denominator.bit_length()
    if Fraction(2) ** exponent > magnitude:
        exponent -= 1
    assert Fraction(2) ** exponent <= magnitude < Fraction(2) ** (exponent + 1)
    assert -126 <= exponent <= 127, "outside the normal floats"
    scaled = magnitude / Fraction(2) ** (exponent - 23)  # in [2^23, 2^24)
    whole, rest = divmod(scaled.numerator, scaled.denominator)
    half = Fraction(rest, scaled.denominator) - Fraction(1, 2)
    whole += half > 0 or (half == 0 and whole % 2 == 1)
    return float(np.float32((1 if value > 0 else -1) * whole * 2.0 ** (exponent - 23)))


def _fma(a: float, b: float, c: float) -> float:
    return _rn(Fraction(a) * Fraction(b) + Fraction(c))


def _quotient(x: float, t: float, corrections: int = 2) -> float:
    """``_quotients``' steps, each rounded as the GPU rounds it."""
    y = _rn(1 / Fraction(t))
    q = _rn(Fraction(x) * Fraction(y))
    for _ in range(corrections):
        q = _fma(_fma(-t, q, x), y, q)
    return q


def _float(rng: random.Random, low: int, high: int, edge: float) -> float:
    """A float32 of random sign, exponent in [low, high] and significand (with probability
    ``edge`` within 64 ulps of 1 or of 2)."""
    significand = 1 + rng.random()
    if rng.random() < edge:
        nudge = rng.randrange(64) * 2.0**-23
        significand = 1 + nudge if rng.random() < 0.5 else 2 - 2.0**-23 - nudge
    sign = rng.choice((-1.0, 1.0))
    return float(np.float32(sign * significand * 2.0 ** rng.randint(low, high)))


def _cases(count: int, seed: int) -> list[tuple[float, float]]:
    rng = random.Random(seed)
    top_x, top_t = int(np.log2(DOT_MAX)), int(np.log2(T_MAX))
    cases = [
        (x, t)
        for x in (DOT_MAX, -DOT_MAX, 1 / DOT_MAX, -1 / DOT_MAX, 0.0, 1.0, -3.0)
        for t in (T_MAX, 1 / T_MAX, 1.0, 0.7, 1e-5, 3.0)
    ]
    for _ in range(count):
        x = _float(rng, -top_x, top_x - 1, 0.5)
        t = abs(_float(rng, -top_t, top_t - 1, 0.3)) if rng.random() < 0.7 else rng.uniform(1e-5, 4)
        cases.append((x, float(np.float32(t))))
    return cases


def test_the_corrected_quotients_are_the_ieee_quotients():
    cases = _cases(3000, seed=0)
    wrong = [(x, t) for x, t in cases if _quotient(x, t) != float(np.float32(x) / np.float32(t))]
    assert not wrong, wrong[:4]
    # the cases see a left-out step: without corrections many quotients are an ulp off
    uncorrected = sum(_quotient(x, t, 0) != float(np.float32(x) / np.float32(t)) for x, t in cases)
    assert uncorrected > len(cases) // 10, uncorrected
