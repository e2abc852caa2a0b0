"""Does speculation change the text? The loop's tokens against the γ = 0 loop's, same seeds.

With the coupled rule (``reference/verify_resample.py``) the token at every absolute position is
that position's own Gumbel-max sample, so the text is the same for every drafter and γ — exactly
in fp32, up to batched-versus-single-row rounding of the logits in lower precision, which is
what ``compare_with_plain`` measures.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from flashspec_export.runtime.loop import GenerationResult

# run(gamma, temperature, seeds [N]) -> the loop's result for one batch
Runner = Callable[[int, float, torch.Tensor], GenerationResult]


@dataclass(frozen=True)
class Case:
    """One sequence of one run: (γ, T, seed) and how its text compares with γ = 0."""

    gamma: int
    temperature: float
    seed: int
    equal: bool
    first_difference: int | None  # index of the first differing token, None when equal
    tokens_per_step: float  # of the run's batch (1.0 means no draft was accepted)


def compare_with_plain(
    run: Runner, gammas: Sequence[int], temperatures: Sequence[float], seeds: torch.Tensor
) -> list[Case]:
    """Every (γ, T) run of the batch ``seeds`` [N] against the γ = 0 run at the same T."""
    cases = []
    for temperature in temperatures:
        plain = run(0, temperature, seeds)
        for gamma in gammas:
            result = run(gamma, temperature, seeds)
            for seed, got, want in zip(seeds.tolist(), result.tokens, plain.tokens, strict=True):
                pairs = enumerate(zip(got, want, strict=True))
                diff = next((i for i, (a, b) in pairs if a != b), None)
                cases.append(
                    Case(gamma, temperature, seed, diff is None, diff, result.mean_emitted)
                )
    return cases
