"""Standalone and feature-level drafters besides MTP (``mtp.py``) and n-gram (``ngram.py``).

- ``ModelDrafter``: a small causal LM with the target's vocabulary, its own cache and LM head;
  one call drafts one greedy token per sequence through ``flashspec.tiled_argmax``.
- ``EagleDrafter``: EAGLE-style feature drafter, ``fc([embed(token); feature])`` then one decoder
  layer of the target's architecture and the target's LM head (MTP without the input norms).
"""

from __future__ import annotations

import torch
from torch import nn

from flashspec_export.config import ConfigError
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.models.target import TargetStep, select_rows
from flashspec_export.ops import torch_ops  # noqa: F401  (registers torch.ops.flashspec)


class ModelDrafter(nn.Module):
    """A small LM proposing greedy drafts.

    Forward: tokens [N, T] int64 at ``positions`` [N] (of ``tokens[:, 0]``), ``last_row`` [N]
    int64 in [0, T), its own cache [L, N, KV, S, D] → draft [N] int64 (the token after row
    ``last_row``), max_logit [N] float32, k_cache, v_cache.
    """

    def __init__(self, draft_lm: nn.Module, target_vocab_size: int):
        super().__init__()
        if draft_lm.config.vocab_size != target_vocab_size:
            raise ConfigError(
                f"draft: the draft model's vocabulary ({draft_lm.config.vocab_size}) differs from "
                f"the target's ({target_vocab_size}); the drafter does not match the target"
            )
        self.step = TargetStep(draft_lm)
        self.lm_head = draft_lm.lm_head.weight
        self.vocab_size = target_vocab_size

    def cache_shape(self, batch: int, max_len: int) -> tuple[int, ...]:
        return self.step.cache_shape(batch, max_len)

    def forward(self, tokens, positions, last_row, k_cache, v_cache):
        hidden, k_cache, v_cache = self.step(tokens, positions, k_cache, v_cache)
        draft, max_logit = torch.ops.flashspec.tiled_argmax(
            select_rows(hidden, last_row)[:, 0], self.lm_head, self.vocab_size
        )
        return draft, max_logit, k_cache, v_cache


class EagleDrafter(MtpDrafter):
    """EAGLE-style drafter: the MTP step without the input norms (``fc`` on the raw concat)."""

    def __init__(self, causal_lm: nn.Module, seed: int = 0):
        super().__init__(causal_lm, seed)
        self.enorm = nn.Identity()
        self.hnorm = nn.Identity()
