"""Top-k, top-p, allowed-token masks and ragged drafts (``reference/truncation.py``): the law of
the emitted tokens is the truncated, renormalised target's, the coupled rule holds on the kept
tokens, and the boundaries are where the contract puts them.

Statistics as in test_exactness.py: the 8 categories spread over a 256-id head
(``tests/spread.py``: hidden rows are their logits), 20 000 independent steps (seeds 0..N-1),
Pearson's chi-square at ALPHA = 1e-3; the expected laws
are computed here in numpy, independently of the implementations. Power: each mutant the issue
names (an inclusive top-p cutoff, top-k ties to the higher id, the mask ignored on the bonus
row) has a law the same tests reject with power > 0.99 (``power``: an impossible outcome under
the true law makes the rejection certain); the placeholder mutant is a golden case.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from flashspec_export import ops
from flashspec_export.reference import truncation
from tests import spread
from tests.stats import ALPHA, chi_square_pvalue, power

N_SAMPLES = 20_000
VOCAB = 8
Z0 = np.array([0.0, 0.5, 2.5, 1.0, 0.0, -1.0, 1.0, 0.3])  # row 0 (the draft: token 2)
Z1 = np.array([1.0, -1.0, 0.0, 2.0, 0.5, -0.5, 0.0, 1.0])  # row 1 (the bonus row)
UNIFORM = np.zeros(VOCAB)
# The Triton kernels take 20 000 rows in minutes under the interpreter: on the GPU machine, as
# the CUDA library's.
BACKENDS = [
    "reference",
    "standard",
    pytest.param("triton", marks=pytest.mark.gpu),
    pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.cuda_kernels]),
]
GPU_BACKENDS = ("triton", "cuda")


def truncated(z, temperature, top_k=0, top_p=1.0, allowed=None) -> np.ndarray:
    """The truncated, renormalised softmax(z / T): mask, top-k (ties: lower id), then top-p
    (mass strictly before < p, in descending order, ties: lower id)."""
    z = np.asarray(z, dtype=np.float64) / temperature
    keep = np.ones(z.size, bool) if allowed is None else np.isin(np.arange(z.size), allowed)
    order = sorted(np.flatnonzero(keep), key=lambda v: (-z[v], v))
    if top_k:
        order = order[:top_k]
    w = np.exp(z[order] - z[order].max())
    w /= w.sum()
    before = np.cumsum(w) - w
    order = [v for v, b in zip(order, before, strict=True) if top_p >= 1 or b < top_p]
    p = np.zeros(z.size)
    p[order] = np.exp(z[order] - z[order].max())
    return p / p.sum()


def mask_of(allowed, rows=2) -> torch.Tensor:
    """[N_SAMPLES, rows, 8] int32 masks allowing the categories ``allowed`` on every row."""
    words = torch.tensor(spread.mask_words(allowed), dtype=torch.int32)
    return words.expand(N_SAMPLES, rows, -1).contiguous()


def step(rows, drafts, temperature, backend, **truncate):
    """N_SAMPLES independent steps of the given category logit rows (the spread head; on the GPU
    for Triton); returns the emitted categories and the counts."""
    device = "cuda" if backend in GPU_BACKENDS else "cpu"
    tokens, emitted = ops.verify_resample(
        spread.hidden(rows, N_SAMPLES).to(device),
        spread.lm_head(device),
        spread.ids([drafts]).to(device).expand(N_SAMPLES, -1),
        temperature,
        torch.arange(N_SAMPLES, device=device),
        torch.full((N_SAMPLES,), 7, device=device),
        backend=backend,
        **{k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in truncate.items()},
    )
    return spread.categories(tokens.cpu()), emitted.cpu()


CASES = {  # name: (row-0 logits, temperature, truncation kwargs of the op, of `truncated`)
    "top_k": (Z0, 1.0, dict(top_k=3), dict(top_k=3)),
    "top_p": (Z0, 0.7, dict(top_p=0.8), dict(top_p=0.8)),
    "top_k_and_top_p": (Z0, 1.5, dict(top_k=5, top_p=0.6), dict(top_k=5, top_p=0.6)),
    "mask": (Z0, 1.0, dict(allowed_tokens=mask_of([0, 1, 3, 6])), dict(allowed=[0, 1, 3, 6])),
    "mask_top_k_top_p": (
        Z0,
        1.2,
        dict(allowed_tokens=mask_of([1, 2, 4, 5, 7]), top_k=4, top_p=0.9),
        dict(allowed=[1, 2, 4, 5, 7], top_k=4, top_p=0.9),
    ),
    "top_p_boundary": (UNIFORM, 1.0, dict(top_p=0.5), dict(top_p=0.5)),  # mass 0.5 exactly
    "top_k_ties": (UNIFORM, 1.0, dict(top_k=3), dict(top_k=3)),
}


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_first_token_follows_the_truncated_law(backend, case):
    z0, temperature, op_kwargs, law_kwargs = CASES[case]
    tokens, _ = step([z0, Z1], [2], temperature, backend, **op_kwargs)
    law = truncated(z0, temperature, **law_kwargs)
    assert chi_square_pvalue(tokens[:, 0].numpy(), law) > ALPHA


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_pair_law_with_the_mask_on_the_bonus_row(backend):
    """Draft 2 accepted with the truncated p0(2), then the bonus row drawn from its own
    truncated law (its mask differs from row 0's)."""
    allowed = torch.cat([mask_of((1, 2, 3, 6), rows=1), mask_of((0, 2, 4, 5), rows=1)], dim=1)
    tokens, emitted = step([Z0, Z1], [2], 1.0, backend, allowed_tokens=allowed, top_p=0.95)
    p0 = truncated(Z0, 1.0, top_p=0.95, allowed=[1, 2, 3, 6])
    p1 = truncated(Z1, 1.0, top_p=0.95, allowed=[0, 2, 4, 5])
    accepted = np.zeros(VOCAB)
    accepted[2] = p0[2]
    law = np.concatenate([p0 - accepted, (accepted[:, None] * p1[None, :]).ravel()])
    first, second = tokens[:, 0].numpy(), tokens[:, 1].numpy()
    categories = np.where(emitted.numpy() == 1, first, VOCAB + first * VOCAB + second)
    assert chi_square_pvalue(categories, law) > ALPHA
    # the mutant that ignores the mask on the bonus row draws tokens this law forbids
    ignored = np.concatenate(
        [p0 - accepted, (accepted[:, None] * truncated(Z1, 1.0, top_p=0.95)).ravel()]
    )
    assert power(law, ignored, N_SAMPLES) > 0.99


def test_the_named_mutants_have_no_chance():
    """The boundary mutants' laws differ from the contract's where the cases put them."""
    inclusive = np.array([1, 1, 1, 1, 1, 0, 0, 0]) / 5  # top_p 0.5 of 8 ties: mass 0.5 kept too
    assert power(truncated(UNIFORM, 1.0, top_p=0.5), inclusive, N_SAMPLES) > 0.99
    higher_ids = np.array([0, 0, 0, 0, 0, 1, 1, 1]) / 3  # top_k 3 ties to the higher ids
    assert power(truncated(UNIFORM, 1.0, top_k=3), higher_ids, N_SAMPLES) > 0.99


def test_golden_thresholds():
    """Hand cases of the kept set: ties to the lower id, the mass strictly before < p, the
    top token always kept, top-k before top-p, masked tokens never kept."""
    logits = torch.tensor([[[1.0, 3.0, 3.0, 2.0, 0.0, 3.0]]])

    def kept_ids(top_k=None, top_p=None, allowed=None):
        masked = logits if allowed is None else logits.masked_fill(~allowed, float("-inf"))
        k = None if top_k is None else torch.tensor([top_k])
        p = None if top_p is None else torch.tensor([top_p])
        limit = truncation.threshold(masked, k, p)
        ids = torch.arange(6)
        return torch.nonzero(truncation.kept(masked, ids, limit)[0, 0] & (masked[0, 0] > -1e30))

    assert kept_ids(top_k=2).flatten().tolist() == [1, 2]  # three 3.0s: the lower two ids
    assert kept_ids(top_k=0).flatten().tolist() == [0, 1, 2, 3, 4, 5]  # 0: off
    assert kept_ids(top_p=1e-6).flatten().tolist() == [1]  # the top token, always
    assert kept_ids(top_k=4, top_p=0.99).flatten().tolist() == [1, 2, 3, 5]
    allowed = torch.tensor([True, False, True, True, True, False])
    assert kept_ids(top_k=2, allowed=allowed).flatten().tolist() == [2, 3]


@pytest.mark.parametrize("backend", BACKENDS)
def test_speculation_keeps_each_positions_own_truncated_sample(backend):
    """The coupled rule under truncation: every emitted token is what γ = 0 at its position,
    with the same parameters, emits (so the text does not depend on the drafts)."""
    g = torch.Generator().manual_seed(1)
    n, gamma, vocab = 64, 3, 40
    hidden = torch.randn(n, gamma + 1, 16, generator=g)
    lm_head = torch.randn(vocab, 16, generator=g) * 1.5
    temperature = torch.rand(n, generator=g) + 0.3
    seed, positions = torch.arange(n) + 5, torch.randint(0, 1000, (n,), generator=g)
    allowed = torch.randint(-(2**31), 2**31 - 1, (n, gamma + 1, 2), generator=g, dtype=torch.int32)
    top_k, top_p = torch.randint(0, 12, (n,), generator=g), torch.rand(n, generator=g) * 0.9 + 0.1
    device = "cuda" if backend in GPU_BACKENDS else "cpu"
    hidden, lm_head, temperature, seed, positions, allowed, top_k, top_p = (
        t.to(device) for t in (hidden, lm_head, temperature, seed, positions, allowed, top_k, top_p)
    )
    truncate = dict(top_k=top_k, top_p=top_p)

    def alone(i):  # γ = 0 at position i
        return ops.verify_resample(
            hidden[:, i : i + 1],
            lm_head,
            torch.zeros(n, 0, dtype=torch.int64),
            temperature,
            seed,
            positions + i,
            backend=backend,
            allowed_tokens=allowed[:, i : i + 1],
            **truncate,
        )[0][:, 0]

    y = torch.stack([alone(i) for i in range(gamma + 1)], dim=1)
    drafts = torch.where(
        torch.rand(n, gamma, generator=g).to(device) < 0.7, y[:, :gamma], (y[:, :gamma] + 1) % vocab
    )
    tokens, emitted = ops.verify_resample(
        hidden,
        lm_head,
        drafts,
        temperature,
        seed,
        positions,
        backend=backend,
        allowed_tokens=allowed,
        **truncate,
    )
    for row in range(n):
        k = int(emitted[row])
        assert tokens[row, :k].tolist() == y[row, :k].tolist()
    assert set(emitted.tolist()) >= {1, gamma + 1}
