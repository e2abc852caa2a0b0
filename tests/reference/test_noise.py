"""The noise function: bit-exact contract, ranges, uniformity and independence."""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch
from scipy import stats

from flashspec_export.reference import noise
from tests.stats import ALPHA
from tests.tolerances import GUMBEL_ATOL, GUMBEL_RTOL

VECTORS = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "noise_vectors.json").read_text()
)


def _spec_bits(seed: int, position: int, token: int, stream: int) -> int:
    """Independent transcription of the hash from noise.py's docstring, in Python integers.

    Python integers never overflow, so agreement with the int64 implementation also shows that
    no intermediate of the int64 version left the int64 range.
    """
    p = 2**31 - 1

    def rnd(x: int) -> int:
        x = pow(x, 5, p)
        return (x % 2**16) * 2**15 + x // 2**16

    h = rnd((1_234_567_891 + seed % 2**31) % p)
    for value in ((seed // 2**31) % p, position, stream):
        h = rnd((h + value) % p)
    a = 1 + rnd((h + 362_436_069) % p) % (p - 1)
    b = rnd((h + 521_288_629) % p)
    x = rnd((a * token + b) % p)
    return rnd((x + 88_675_123) % p)


def _bits(seed, position, token, stream):
    as_tensor = lambda v: torch.as_tensor(v, dtype=torch.int64)  # noqa: E731
    return noise.bits(as_tensor(seed), as_tensor(position), as_tensor(token), stream)


def test_vectors_reproduced_exactly():
    """The frozen vectors every backend is checked against: bits and uniform exactly."""
    for v in VECTORS["vectors"]:
        x = _bits(v["seed"], v["position"], v["token"], v["stream"])
        assert int(x) == v["bits"], v
        assert float(noise.uniform_from_bits(x)) == v["uniform"], v
        assert float(noise.gumbel_from_bits(x)) == pytest.approx(
            v["gumbel"], rel=GUMBEL_RTOL, abs=GUMBEL_ATOL
        )


def test_matches_independent_transcription_of_the_spec():
    rng = np.random.default_rng(0)
    seeds = [int(s) for s in rng.integers(0, 2**63 - 1, 200, dtype=np.int64)] + [0, 2**63 - 1]
    for i, seed in enumerate(seeds):
        position = int(rng.integers(0, noise.MAX_POSITION + 1))
        token = int(rng.integers(0, noise.MAX_TOKEN + 1)) if i % 2 else i
        stream = i % 3
        assert int(_bits(seed, position, token, stream)) == _spec_bits(
            seed, position, token, stream
        )


def test_ranges_and_tail():
    """u never 0 or 1; E never 0 or inf; the Gumbel upper cap is past 20 (31·log 2)."""
    extremes = torch.tensor([0, 1, 2**30 - 2, 2**30 - 1, 2**30, noise.P - 2, noise.P - 1])
    u = noise.uniform_from_bits(extremes)
    assert bool(((u > 0) & (u < 1)).all())
    assert float(u.min()) == 2.0**-24 and float(u.max()) == 1 - 2.0**-24
    e = noise.exponential_from_bits(extremes)
    assert bool(torch.isfinite(e).all() & (e > 0).all())
    g = noise.gumbel_from_bits(extremes)
    assert float(g.max()) > 21.0  # x = 0: E = -log1p(-2**-31) ≈ 2**-31
    assert float(g.min()) == pytest.approx(-np.log(31 * np.log(2)), rel=1e-6)
    # The two branches of E meet continuously at W = 1/2.
    assert float(e[3]) == pytest.approx(np.log(2), rel=1e-6)
    assert float(e[4]) == pytest.approx(np.log(2), rel=1e-6)


def _block(seed=7, position=3, stream=noise.STREAM_GUMBEL, n=2**20):
    token = torch.arange(n, dtype=torch.int64)
    return noise.uniform(torch.tensor(seed), torch.tensor(position), token, stream).double().numpy()


def test_uniformity():
    """2**20 uniforms in 1024 equal bins (chi-square, level ALPHA); a 1% bias in one bin of
    1024 expected counts of 1024 is far below detection, but any structural defect (a stuck bit,
    a short cycle) gives chi-square values in the thousands."""
    u = _block()
    counts, _ = np.histogram(u, bins=1024, range=(0, 1))
    assert stats.chisquare(counts).pvalue > ALPHA
    assert stats.kstest(u, "uniform").pvalue > ALPHA


def test_gumbel_distribution():
    """KS test of 2**18 Gumbel values against the standard Gumbel law (level ALPHA)."""
    token = torch.arange(2**18)
    g = noise.gumbel(torch.tensor(11), torch.tensor(0), token, noise.STREAM_GUMBEL).double()
    assert stats.kstest(g.numpy(), "gumbel_r").pvalue > ALPHA


def _assert_independent(a: np.ndarray, b: np.ndarray):
    """Pairs (a_k, b_k) uniform on the unit square: 32x32-bin chi-square (level ALPHA) and
    Pearson correlation (|r| would be ~0.03 for a 3% linear dependence; the test's threshold at
    level ALPHA with 2**20 pairs is about 0.0032)."""
    hist, _, _ = np.histogram2d(a, b, bins=32, range=[[0, 1], [0, 1]])
    assert stats.chisquare(hist.ravel()).pvalue > ALPHA
    assert stats.pearsonr(a, b).pvalue > ALPHA


@pytest.mark.parametrize(
    "other",
    [
        pytest.param(dict(seed=7, position=3, stream=noise.STREAM_GUMBEL, shift=1), id="token+1"),
        pytest.param(
            dict(seed=7, position=4, stream=noise.STREAM_GUMBEL, shift=0), id="position+1"
        ),
        pytest.param(dict(seed=8, position=3, stream=noise.STREAM_GUMBEL, shift=0), id="seed+1"),
        pytest.param(dict(seed=7, position=3, stream=noise.STREAM_ACCEPT, shift=0), id="stream"),
        pytest.param(dict(seed=7 + 2**31, position=3, stream=1, shift=0), id="seed-high-word"),
    ],
)
def test_independence_of_neighbours(other):
    """Noise of neighbouring token ids, positions, seeds and streams is independent."""
    n = 2**20
    base = _block(n=n + 1)
    shifted = _block(
        seed=other["seed"], position=other["position"], stream=other["stream"], n=n + 1
    )
    _assert_independent(base[:n], shifted[other["shift"] : other["shift"] + n])


def test_linear_mixing_would_be_caught():
    """The independence check has power: a plain multiply-add hash of the token id (the linear
    mixing docs/DESIGN.md warns about) fails it."""
    token = np.arange(2**20 + 1, dtype=np.int64)
    u = ((token * 1_103_515_245 + 12_345) % noise.P // 256 * 2 + 1) * 2.0**-24
    with pytest.raises(AssertionError):
        _assert_independent(u[:-1], u[1:])


def test_batch_broadcasting_matches_scalars():
    """Keys broadcast: a [2, 1] x [3] evaluation equals the element-by-element one."""
    seed = torch.tensor([[3], [2**40]])
    token = torch.tensor([0, 5, 131071])
    block = noise.bits(seed, torch.tensor(9), token, noise.STREAM_DRAFT)
    for i in range(2):
        for j in range(3):
            assert int(block[i, j]) == _spec_bits(int(seed[i, 0]), 9, int(token[j]), 2)
