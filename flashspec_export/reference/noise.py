"""Counter-based noise keyed by (seed, position, global token id, stream).

This module is the specification every backend (Triton, CUDA, ONNX function bodies) reproduces.
The integer part is bit-exact everywhere; only the final ``log`` calls may differ by an ulp
between math libraries.

The integer hash
----------------
All state lives in ``[0, P)`` with ``P = 2**31 - 1`` (a Mersenne prime). Every product is of two
values below ``2**31``, so it stays below ``2**62`` and fits int64. Only add, multiply,
floor-division and modulo of non-negative int64 values are used, because TensorRT's ONNX parser
refuses bitwise and unsigned-integer ops. (Kernels may compute ``z % P`` of a product with the
Mersenne shift-and-add trick: it is the same integer.)

    mulmod(a, b) = (a * b) % P
    pow5(x)      = x**5 % P                          # x2 = mulmod(x, x); x4 = mulmod(x2, x2);
                                                     # pow5 = mulmod(x4, x)
    rot16(x)     = (x % 2**16) * 2**15 + x // 2**16  # rotate the 31-bit word by 16 bits
    rnd(x)       = rot16(pow5(x))

``pow5`` is a bijection of [0, P) because gcd(5, P - 1) = 1, and it is nonlinear; ``rot16`` is a
bijection of [0, 2**31) that fixes 2**31 - 1, hence of [0, P), and it mixes high bits into low
bits (what multiplication alone never does). ``rnd`` is therefore a nonlinear bijection.

A row key is derived once per (seed, position, stream)::

    s0 = seed % 2**31            s1 = (seed // 2**31) % P          # seed in [0, 2**63)
    h  = rnd((K_INIT + s0) % P)
    h  = rnd((h + s1) % P)
    h  = rnd((h + position) % P)                                    # position in [0, P)
    h  = rnd((h + stream) % P)                                      # stream in {0, 1, 2}
    a  = 1 + rnd((h + K_A) % P) % (P - 1)                           # multiplier in [1, P - 1]
    b  = rnd((h + K_B) % P)                                         # offset in [0, P)

and the value for token ``t`` (``0 <= t < P``) is::

    x = (a * t + b) % P
    x = rnd(x)
    x = rnd((x + K_MIX) % P)                                        # x in [0, P)

Keying the token through a row-specific multiplier means two rows never see shifted copies of
each other's noise; the two rounds decorrelate neighbouring token ids.

From integers to floats (fp32)
------------------------------
- ``uniform``: ``u = (2 * (x // 256) + 1) * 2**-24``. The odd integer is below 2**24, so the
  value is exact in fp32; u lies in [2**-24, 1 - 2**-24], never 0 or 1.
- ``exponential`` (``E = -log(1 - W)`` with ``W = (x + 1) * 2**-31``), fine near 0 so that the
  Gumbel upper tail survives::

      k = x + 1
      E = -log1p(-(fp32(k) * 2**-31))      if k <  2**30
      E = -log(fp32(P - x) * 2**-31)       otherwise

  ``fp32(.)`` is the round-to-nearest-even conversion of an int64. E lies in
  [4.7e-10, 21.5]; it is never 0 or infinite.
- ``gumbel``: ``g = -log(E)``, in [-3.07, 21.5] (the upper cap is 31·log 2).

Backends without ``log1p`` (ONNX) may use ``log1p(y) = log(1 + y) * y / ((1 + y) - 1)`` (and
``y`` itself when ``1 + y == 1``); that differs from ``log1p`` by an ulp or two at most.

Streams
-------
``VerifyResample``'s one sample per position is two-level (``reference/verify_resample.py``):
``STREAM_GUMBEL`` keys the Gumbel noise of each block of ``SAMPLE_BLOCK`` ids (token id = block
index) and ``STREAM_PICK`` the uniform that picks the id inside the chosen block (token id = block
index). The sampled-draft reference keys its residual / bonus Gumbel noise by vocabulary id on
``STREAM_GUMBEL`` and its acceptance uniform on ``STREAM_ACCEPT`` (Leviathan's rule, token id 0);
``STREAM_DRAFT`` keys any draft-side sampling.
"""

from __future__ import annotations

import torch

P = 2**31 - 1
K_INIT = 1_234_567_891
K_A = 362_436_069
K_B = 521_288_629
K_MIX = 88_675_123

STREAM_ACCEPT = 0
STREAM_GUMBEL = 1
STREAM_DRAFT = 2
STREAM_PICK = 3

MAX_SEED = 2**63 - 1
MAX_POSITION = P - 1  # positions (plus gamma) must stay below P
MAX_TOKEN = P - 1

_TWO_POW_M24 = 2.0**-24
_TWO_POW_M31 = 2.0**-31


def _mulmod(a, b):
    return (a * b) % P


def _pow5(x):
    x2 = _mulmod(x, x)
    x4 = _mulmod(x2, x2)
    return _mulmod(x4, x)


def _rot16(x):
    return (x % 65536) * 32768 + x // 65536


def _rnd(x):
    return _rot16(_pow5(x))


def row_keys(seed: torch.Tensor, position: torch.Tensor, stream: int):
    """Per-row hash keys ``(a, b)``.

    Parameters
    ----------
    seed : int64 tensor, values in [0, 2**63)
    position : int64 tensor broadcastable with ``seed``, values in [0, P)
    stream : one of ``STREAM_ACCEPT``, ``STREAM_GUMBEL``, ``STREAM_DRAFT``

    Returns
    -------
    a, b : int64 tensors of the broadcast shape; ``a`` in [1, P - 1], ``b`` in [0, P).
    """
    s0 = seed % 2**31
    s1 = (seed // 2**31) % P
    h = _rnd((K_INIT + s0) % P)
    h = _rnd((h + s1) % P)
    h = _rnd((h + position) % P)
    h = _rnd((h + stream) % P)
    a = 1 + _rnd((h + K_A) % P) % (P - 1)
    b = _rnd((h + K_B) % P)
    return a, b


def token_bits(a: torch.Tensor, b: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """The hash integer in [0, P) for token ids ``token`` under row keys ``(a, b)`` (broadcast)."""
    x = (a * token + b) % P
    x = _rnd(x)
    return _rnd((x + K_MIX) % P)


def bits(seed, position, token, stream: int) -> torch.Tensor:
    """The hash integer for (seed, position, token, stream), all int64 tensors (broadcast)."""
    a, b = row_keys(seed, position, stream)
    return token_bits(a, b, token)


def uniform_from_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 uniform in (0, 1): ``(2 * (x // 256) + 1) * 2**-24``, exact."""
    return (2 * (x // 256) + 1).to(torch.float32) * _TWO_POW_M24


def exponential_from_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 Exp(1) variate ``-log(1 - W)``, ``W = (x + 1) / 2**31``, accurate near 0."""
    k = x + 1
    w = k.to(torch.float32) * _TWO_POW_M31
    complement = (P - x).to(torch.float32) * _TWO_POW_M31
    return torch.where(k < 2**30, -torch.log1p(-w), -torch.log(complement))


def gumbel_from_bits(x: torch.Tensor) -> torch.Tensor:
    """fp32 standard Gumbel variate ``-log(E)``, in [-3.07, 21.5]."""
    return -torch.log(exponential_from_bits(x))


def uniform(seed, position, token, stream: int) -> torch.Tensor:
    """fp32 uniform in (0, 1) for (seed, position, token, stream) (int64 tensors, broadcast)."""
    return uniform_from_bits(bits(seed, position, token, stream))


def gumbel(seed, position, token, stream: int) -> torch.Tensor:
    """fp32 Gumbel noise for (seed, position, token, stream) (int64 tensors, broadcast)."""
    return gumbel_from_bits(bits(seed, position, token, stream))
