"""The speculative loop: propose → one target step over γ + 1 tokens → accept → advance.

A target is anything with ``prefill(tokens, positions, k, v) -> (hidden, k, v)`` and
``step(tokens, positions, k, v, temperature, seed) -> (emitted, num_emitted, logprobs, hidden,
k, v)`` on CPU tensors: ``TorchTarget`` (PyTorch modules) or ``OnnxTarget`` (onnxruntime).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from flashspec_export.models.target import SpeculativeTarget


class TorchTarget:
    """The PyTorch modules: decoder with static cache + VerifyResample."""

    def __init__(self, target: SpeculativeTarget):
        self.target = target

    def cache(self, batch: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
        shape = self.target.step.cache_shape(batch, max_len)
        return torch.zeros(shape), torch.zeros(shape)

    @torch.no_grad()
    def prefill(self, tokens, positions, k, v):
        return self.target.step(tokens, positions, k, v)

    @torch.no_grad()
    def step(self, tokens, positions, k, v, temperature, seed):
        return self.target(tokens, positions, k, v, temperature, seed)


class OnnxTarget:
    """Two onnxruntime sessions: the prefill graph and the speculative step graph."""

    def __init__(self, prefill_session, step_session, cache_shape):
        self.sessions = {"prefill": prefill_session, "step": step_session}
        self.cache_shape = cache_shape  # (batch, max_len) -> shape

    def cache(self, batch: int, max_len: int):
        shape = self.cache_shape(batch, max_len)
        return torch.zeros(shape), torch.zeros(shape)

    def _run(self, which, *args):
        session = self.sessions[which]
        names = [i.name for i in session.get_inputs()]
        feed = {name: np.ascontiguousarray(a.numpy()) for name, a in zip(names, args, strict=True)}
        return tuple(torch.from_numpy(o) for o in session.run(None, feed))

    def prefill(self, tokens, positions, k, v):
        return self._run("prefill", tokens, positions, k, v)

    def step(self, tokens, positions, k, v, temperature, seed):
        return self._run("step", tokens, positions, k, v, temperature, seed)


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # per sequence: the generated tokens (max_new_tokens each)
    steps: int  # target steps taken
    mean_emitted: float  # tokens per target step, averaged over sequences and steps


def generate(
    target,
    drafter,
    prompt: torch.Tensor,
    max_new_tokens: int,
    gamma: int,
    temperature: torch.Tensor,
    seed: torch.Tensor,
) -> GenerationResult:
    """Generate ``max_new_tokens`` per sequence after ``prompt [N, T0]`` (T0 >= 2).

    The prompt minus its last token is prefilled; every step then feeds the last accepted token
    and γ drafts at ``positions`` = the cache length, and advances it by ``num_emitted``.
    """
    n, prompt_len = prompt.shape
    k, v = target.cache(n, prompt_len + max_new_tokens + gamma + 1)
    _, k, v = target.prefill(prompt[:, :-1], torch.zeros(n, dtype=torch.int64), k, v)
    sequences = [row.tolist() for row in prompt]
    positions = torch.full((n,), prompt_len - 1, dtype=torch.int64)
    steps, emitted_total = 0, 0
    while min(len(s) for s in sequences) < prompt_len + max_new_tokens:
        last = torch.tensor([s[-1] for s in sequences])[:, None]
        tokens = torch.cat([last, drafter.propose(sequences, gamma)], dim=1)  # [N, γ + 1]
        emitted, num_emitted, _, _, k, v = target.step(tokens, positions, k, v, temperature, seed)
        for row, count in enumerate(num_emitted.tolist()):
            sequences[row].extend(emitted[row, :count].tolist())
        positions = positions + num_emitted
        steps += 1
        emitted_total += int(num_emitted.sum())
    generated = [s[prompt_len : prompt_len + max_new_tokens] for s in sequences]
    return GenerationResult(generated, steps, emitted_total / (steps * n))
