"""The statistical tests' categories, spread over several blocks of the two-level sample.

The laws are stated over ``CATEGORIES`` = 8 outcomes, so that 20 000 steps test them with power.
``VerifyResample`` samples a block of ``SAMPLE_BLOCK`` = 64 ids, then an id inside it; with 8 ids
the first level would never be exercised. So category ``c`` is vocabulary id ``IDS[c]`` of a
``VOCAB``-id head — two categories share a block with each other, two sit at a block's first and
last id, the rest alone — and every other id's logit is ``OFF``, whose ``exp`` is 0 in fp32 at
the tests' temperatures (probability exactly 0: never sampled, nothing added to a block's mass).

A hidden row is the 8 category logits and a 1; the head's category rows are the identity with a 0,
its other rows zeros with ``OFF``.
"""

from __future__ import annotations

import numpy as np
import torch

CATEGORIES = 8
VOCAB = 256
IDS = (0, 1, 63, 64, 100, 130, 191, 255)
OFF = -1.0e4


def lm_head(device="cpu") -> torch.Tensor:
    """[VOCAB, CATEGORIES + 1] float32."""
    head = torch.zeros(VOCAB, CATEGORIES + 1)
    head[:, CATEGORIES] = OFF
    head[list(IDS)] = torch.cat([torch.eye(CATEGORIES), torch.zeros(CATEGORIES, 1)], dim=1)
    return head.to(device)


def hidden(rows: list[np.ndarray], n: int) -> torch.Tensor:
    """[n, len(rows), CATEGORIES + 1] float32: each row's category logits and a 1."""
    x = torch.tensor(np.stack(rows), dtype=torch.float32)
    x = torch.cat([x, torch.ones(x.shape[0], 1)], dim=1)
    return x[None].expand(n, -1, -1)


def ids(categories) -> torch.Tensor:
    """Vocabulary ids of ``categories`` (an int tensor or a list)."""
    return torch.tensor(IDS)[torch.as_tensor(categories)]


def categories(tokens: torch.Tensor) -> torch.Tensor:
    """The categories of emitted ``tokens`` (-1 stays -1); an id outside ``IDS`` is an error."""
    table = torch.full((VOCAB + 1,), -2, dtype=torch.int64)
    table[list(IDS)] = torch.arange(CATEGORIES)
    table[VOCAB] = -1
    out = table[torch.where(tokens < 0, VOCAB, tokens)]
    assert bool((out >= -1).all()), "a token of probability 0 was emitted"
    return out


def mask_words(allowed: list[int]) -> list[int]:
    """The allowed-token bit words (``VOCAB / 32`` int32 values) allowing ``allowed`` categories."""
    words = [0] * (VOCAB // 32)
    for c in allowed:
        words[IDS[c] // 32] |= 1 << (IDS[c] % 32)
    return [w - (1 << 32) if w >= 1 << 31 else w for w in words]
