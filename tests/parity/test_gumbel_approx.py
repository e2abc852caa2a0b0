"""The ranking Gumbel of the Hopper verify epilogue (``kernels.noise.gumbel_approx_from_bits``)
stays within ``GUMBEL_APPROX_ERROR`` of the exact one, the bound its exactness proof rests on
(``kernels/hopper_tiles.py: _sampled_chunk_best``).

On the GPU the check is exhaustive (all 2**31 - 1 hash values, the MUFU ``lg2.approx`` the
kernel uses); under the CPU interpreter (NumPy's ``log2``) it covers the two ends of the range,
the switch between the series and the log form, and the middle.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export.kernels.noise import GUMBEL_APPROX_ERROR, gumbel_approx_error
from flashspec_export.reference.noise import P

# The measured maximum on an H100 was 2.06e-5: the bound keeps 4x slack, and the exhaustive
# check asserts half of it so that a drift in the approximation is caught before the bound.
SERIES_SWITCH = 2**27 - 1  # x + 1 < 2**27: the series, else the log form
RANGES = [(0, 4096), (SERIES_SWITCH - 2048, SERIES_SWITCH + 2048), (2**30 - 2048, 2**30 + 2048)]
RANGES.append((P - 4096, P))


@pytest.mark.parametrize("start, stop", RANGES)
def test_approximation_within_the_bound(start, stop):
    device = "cuda" if torch.cuda.is_available() else "cpu"
    assert gumbel_approx_error(start, stop, device) <= GUMBEL_APPROX_ERROR.value


@pytest.mark.skipif(not torch.cuda.is_available(), reason="exhaustive over 2**31 - 1: needs a GPU")
def test_approximation_within_half_the_bound_everywhere():
    assert gumbel_approx_error(0, P, "cuda") <= GUMBEL_APPROX_ERROR.value / 2
