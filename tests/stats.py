"""Goodness-of-fit helpers for the statistical exactness tests.

Every statistical test uses the significance level ``ALPHA``: with a fresh random seed a correct
sampler would fail it with probability ``ALPHA``. The seeds are fixed, so the suite is
deterministic. Power is stated against a named wrong sampler and checked with ``power``.
"""

from __future__ import annotations

import numpy as np
from scipy import stats

ALPHA = 1e-3
MIN_EXPECTED = 5.0  # categories with fewer expected counts are pooled (chi-square validity)


def _pool(expected_counts: np.ndarray) -> np.ndarray:
    """Bucket id per category: frequent ones keep their own, rare ones share the last bucket."""
    frequent = expected_counts >= MIN_EXPECTED
    bucket = np.full(expected_counts.shape, frequent.sum(), dtype=np.int64)
    bucket[frequent] = np.arange(frequent.sum())
    return bucket


def chi_square_pvalue(categories: np.ndarray, probs: np.ndarray) -> float:
    """p-value of Pearson's chi-square test that ``categories`` were drawn from ``probs``.

    An outcome of probability 0 gives p-value 0 at once (it is impossible under the null).
    """
    probs = np.asarray(probs, dtype=np.float64)
    assert abs(probs.sum() - 1.0) < 1e-9, probs.sum()
    observed = np.bincount(categories, minlength=probs.size).astype(np.float64)
    if observed[probs == 0].sum() > 0:
        return 0.0
    n = observed.sum()
    bucket = _pool(n * probs)
    obs = np.bincount(bucket, weights=observed)
    exp = np.bincount(bucket, weights=n * probs)
    keep = exp > 0
    if keep.sum() < 2:
        return 1.0
    return float(stats.chisquare(obs[keep], exp[keep]).pvalue)


def power(null: np.ndarray, alternative: np.ndarray, n: int, alpha: float = ALPHA) -> float:
    """Power of ``chi_square_pvalue`` at level ``alpha`` with ``n`` samples, when the data
    actually follow ``alternative`` (noncentral chi-square approximation, same pooling)."""
    null = np.asarray(null, dtype=np.float64)
    alternative = np.asarray(alternative, dtype=np.float64)
    if alternative[null == 0].sum() * n >= 3:  # an impossible outcome shows up: certain rejection
        return 1.0
    bucket = _pool(n * null)
    p0 = np.bincount(bucket, weights=null)
    p1 = np.bincount(bucket, weights=alternative)
    keep = p0 > 0
    dof = keep.sum() - 1
    noncentrality = n * float((((p1 - p0) ** 2)[keep] / p0[keep]).sum())
    critical = stats.chi2.ppf(1 - alpha, dof)
    return float(stats.ncx2.sf(critical, dof, noncentrality))
