"""A small end-to-end demonstration of the ops on a random LM head.

A greedy drafter (``tiled_argmax`` on the target's own rows, perturbed) proposes γ tokens per
sequence; ``verify_resample`` verifies them and emits the next tokens. Every backend asked for
runs on the same inputs and seeds, and the report says whether they emitted the same tokens.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

from flashspec_export import ops
from flashspec_export.config import HeadShape


@dataclass(frozen=True)
class DemoConfig:
    head: str = "tiny"
    batch: int = 8
    gamma: int = 4
    temperature: float = 0.7
    seed: int = 0
    dtype: str = "float32"
    backends: tuple[str, ...] = ("reference", "standard")


@dataclass(frozen=True)
class DemoReport:
    shape: HeadShape
    tokens: dict[str, torch.Tensor]  # backend -> [batch, γ + 1] int64
    num_emitted: dict[str, torch.Tensor]  # backend -> [batch] int64
    seconds: dict[str, float]

    @property
    def backends_agree(self) -> bool:
        first = next(iter(self.tokens.values()))
        return all(torch.equal(first, t) for t in self.tokens.values())


def run(config: DemoConfig) -> DemoReport:
    """Run one speculative verification step with every backend in ``config.backends``."""
    shape = HeadShape.from_name(config.head)
    dtype = getattr(torch, config.dtype)
    g = torch.Generator().manual_seed(config.seed)
    rows = config.gamma + 1
    scale = 8.0 / shape.hidden_size**0.5  # logits with a spread typical of trained heads
    lm_head = (torch.randn(shape.padded_vocab, shape.hidden_size, generator=g) * scale).to(dtype)
    hidden = torch.randn(config.batch, rows, shape.hidden_size, generator=g).to(dtype)
    # The drafter: greedy on a noisy copy of the target's states, so some drafts are rejected.
    noisy = hidden.float() + 0.5 * torch.randn(hidden.shape, generator=g)
    drafts, _ = ops.tiled_argmax(
        noisy[:, : config.gamma].reshape(-1, shape.hidden_size).to(dtype), lm_head, shape.vocab_size
    )
    drafts = drafts.reshape(config.batch, config.gamma)
    seeds = torch.arange(config.batch) + config.seed
    tokens, emitted, seconds = {}, {}, {}
    for backend in config.backends:
        start = time.perf_counter()
        tokens[backend], emitted[backend] = ops.verify_resample(
            hidden, lm_head, drafts, config.temperature, seeds, 0, shape.vocab_size, backend=backend
        )
        seconds[backend] = time.perf_counter() - start
    return DemoReport(shape, tokens, emitted, seconds)
