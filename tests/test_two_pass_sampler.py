"""The two-pass baseline of the kernel benchmark (``scripts/two_pass_sampler.py``) samples the
target's law: a baseline that sampled wrong would be cheaper than the thing it stands for.

Chi-square at ALPHA (tests/stats.py) over 300 rows of the same logits (each row its own Philox
noise) at T = 0.5; against a sampler at T = 1 instead (the temperature ignored) the test has
power > 0.99 (checked below). Under the Triton interpreter without a GPU (a program per row).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("triton")

from scripts.two_pass_sampler import gumbel_max, two_pass_verify
from tests.stats import ALPHA, chi_square_pvalue, power

LOGITS = torch.tensor([0.0, 1.0, 2.0, -1.0, 0.5, 2.5])
ROWS, T = 300, 0.5
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_samples_follow_the_softmax():
    vocab = 5  # the sixth id is padding and must never be drawn
    logits = LOGITS.to(torch.bfloat16).repeat(ROWS, 1).to(DEVICE)
    y = gumbel_max(logits, torch.full((ROWS,), T, device=DEVICE), vocab, seed=7).cpu()
    assert int(y.min()) >= 0 and int(y.max()) < vocab
    probs = torch.softmax(LOGITS[:vocab].to(torch.bfloat16).double() / T, 0).numpy()
    assert chi_square_pvalue(y.numpy(), probs) > ALPHA
    wrong = torch.softmax(LOGITS[:vocab].double(), 0).numpy()
    assert power(probs, wrong, ROWS) > 0.99


def test_drafts_equal_to_the_sample_are_accepted():
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(4, 3, 16, generator=g).to(DEVICE)
    lm_head = (torch.randn(40, 16, generator=g) * 3).to(DEVICE)
    temps = torch.full((4,), 1e-3, device=DEVICE)  # near greedy: the sample is the argmax
    greedy = (hidden @ lm_head[:37].T).argmax(dim=-1)  # [4, 3]
    drafts = greedy[:, :2].clone()
    drafts[1, 0] = (drafts[1, 0] + 1) % 37  # sequence 1 rejects its first draft
    tokens, emitted = two_pass_verify(hidden, lm_head, drafts, temps, 37)
    assert emitted.tolist() == [3, 1, 3, 3]
    assert torch.equal(tokens[0], greedy[0]) and int(tokens[1, 0]) == int(greedy[1, 0])
    assert np.all(tokens[1, 1:].cpu().numpy() == -1)
