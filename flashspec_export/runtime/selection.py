"""Online choice of the speculation configuration: a multi-armed bandit over arms (drafter, γ).

Each step the loop asks ``choose()`` for an arm, runs the step with it, and reports ``update(arm,
reward)`` with the reward = tokens kept per second of step time (drafting + verification), so
the choice weighs acceptance against the drafter's and the verify's cost. Both policies discount
old observations (``discount`` < 1: each update multiplies the past statistics by it), so they
follow a reward that drifts as the text changes (code, then prose).

- ``Ucb1``: discounted UCB1 (Garivier & Moulines, 2011); rewards are scaled by the largest reward
  seen so that the exploration bonus is on the scale UCB1 assumes ([0, 1]).
- ``Thompson``: Gaussian Thompson sampling; each arm's mean has the posterior
  N(mean, variance / count) with the variance pooled over arms (a flat prior: every arm is tried
  once first).

Untried arms are chosen first, in order. Seeded: the same rewards give the same choices.

Choices may run ahead of their rewards (the device loop chooses the arm of every step of a round
before the round runs, and rewards them after it): a chosen arm is pending until its update, an
untried arm that is pending is not chosen again while another is untried, and UCB1's bonus
counts pending choices as pulls (so a round spreads its exploration instead of repeating the
arm of the highest bound).
"""

from __future__ import annotations

import math
import random
import time
from typing import NamedTuple

import torch

from flashspec_export.config import ConfigError


class Arm(NamedTuple):
    drafter: str
    gamma: int


class _Statistics:
    """Discounted count, reward sum and squared-reward sum per arm."""

    def __init__(self, arms, discount: float):
        if not arms:
            raise ValueError("arms: expected at least one arm")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount: expected 0 < discount <= 1, got {discount}")
        self.arms = list(arms)
        self.discount = discount
        self.count = [0.0] * len(self.arms)
        self.total = [0.0] * len(self.arms)
        self.squares = [0.0] * len(self.arms)
        self.tried = [False] * len(self.arms)
        self.pending = [0] * len(self.arms)  # chosen, not yet rewarded

    def _chose(self, arm: int) -> int:
        self.pending[arm] += 1
        return arm

    def update(self, arm: int, reward: float) -> None:
        if not math.isfinite(reward):
            raise ValueError(f"reward: expected a finite value, got {reward}")
        self.pending[arm] = max(self.pending[arm] - 1, 0)
        for i in range(len(self.arms)):
            self.count[i] *= self.discount
            self.total[i] *= self.discount
            self.squares[i] *= self.discount
        self.count[arm] += 1.0
        self.total[arm] += reward
        self.squares[arm] += reward * reward
        self.tried[arm] = True

    def untried(self) -> int | None:
        """The first arm never rewarded nor pending; else, while every tried arm is only
        pending, the untried one least pending."""
        waiting = [i for i, done in enumerate(self.tried) if not done]
        fresh = next((i for i in waiting if not self.pending[i]), None)
        if fresh is not None or not waiting or any(self.tried):
            return fresh
        return min(waiting, key=self.pending.__getitem__)

    def mean(self, arm: int) -> float:
        return self.total[arm] / self.count[arm]

    @property
    def best(self) -> int:
        """The arm of the highest mean reward so far."""
        tried = [i for i in range(len(self.arms)) if self.tried[i]]
        return max(tried, key=self.mean) if tried else 0


class Ucb1(_Statistics):
    """Discounted UCB1 over ``arms``: mean + scale · sqrt(c · ln(n) / n_i)."""

    def __init__(self, arms, discount: float = 1.0, exploration: float = 2.0):
        super().__init__(arms, discount)
        self.exploration = exploration
        self.largest = 0.0

    def update(self, arm: int, reward: float) -> None:
        super().update(arm, reward)
        self.largest = max(self.largest, abs(reward))

    def choose(self) -> int:
        first = self.untried()
        if first is not None:
            return self._chose(first)
        n = sum(self.count) + sum(self.pending)
        scale = self.largest or 1.0
        tried = [i for i in range(len(self.arms)) if self.tried[i]]

        def bound(i):
            pulls = self.count[i] + self.pending[i]
            bonus = math.sqrt(self.exploration * math.log(max(n, 1.0)) / pulls)
            return self.mean(i) / scale + bonus

        return self._chose(max(tried, key=bound))


class Thompson(_Statistics):
    """Gaussian Thompson sampling over ``arms`` (pooled variance), seeded."""

    def __init__(self, arms, discount: float = 1.0, seed: int = 0):
        super().__init__(arms, discount)
        self.rng = random.Random(seed)

    def _variance(self) -> float:
        n = sum(self.count)
        if n < 2:
            return 1.0
        pairs = zip(self.total, self.count, strict=True)
        squares = sum(self.squares) - sum(t * t / c for t, c in pairs if c)
        return max(squares / (n - 1), 1e-12)

    def choose(self) -> int:
        first = self.untried()
        if first is not None:
            return self._chose(first)
        variance = self._variance()
        draws = {
            i: self.rng.gauss(self.mean(i), math.sqrt(variance / self.count[i]))
            for i in range(len(self.arms))
            if self.tried[i]
        }
        return self._chose(max(draws, key=draws.__getitem__))


POLICIES = {"ucb1": Ucb1, "thompson": Thompson}


def make_policy(name: str, arms, seed: int = 0, discount: float = 0.98):
    """The policy ``name`` (``POLICIES``) over ``arms``; ConfigError for an unknown name."""
    if name not in POLICIES:
        raise ConfigError(f"select: expected one of {', '.join(POLICIES)}, got {name!r}")
    if name == "thompson":
        return Thompson(arms, discount=discount, seed=seed)
    return Ucb1(arms, discount=discount)


class SelectingDrafter:
    """A drafter for ``loop.generate`` that picks its (drafter, γ) arm every step with
    ``policy`` and rewards it with the tokens kept per second of that step (drafting, target
    step and bookkeeping, from ``propose`` to ``update``). Every drafter sees every step, so the
    graph drafters' caches stay current whichever arm runs.

    ``cost(arm, seconds)``: the step time charged to an arm; default: the measured seconds
    (tests pass a fixed cost model, so that their outcome does not depend on timings).
    """

    def __init__(self, drafters: dict, policy, cost=None, clock=time.perf_counter):
        unknown = sorted({arm.drafter for arm in policy.arms} - set(drafters))
        if unknown:
            raise ConfigError(f"select: arms name drafters {unknown} that are not available")
        self.drafters = drafters
        self.policy = policy
        self.cost = cost or (lambda arm, seconds: seconds)
        self.clock = clock
        self.chosen: dict[Arm, int] = {}
        self._step = None  # (arm index, start time)

    def start(self, prompt, hidden, lengths) -> None:
        for drafter in self.drafters.values():
            drafter.start(prompt, hidden, lengths)

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        index = self.policy.choose()
        arm = self.policy.arms[index]
        if arm.gamma > gamma:
            raise ConfigError(f"select: arm {arm} drafts more than the loop's gamma {gamma}")
        self.chosen[arm] = self.chosen.get(arm, 0) + 1
        self._step = (index, self.clock())
        return self.drafters[arm.drafter].propose(sequences, arm.gamma)

    def update(self, step_positions, emitted, num_emitted, hidden, kept) -> None:
        index, start = self._step
        seconds = self.cost(self.policy.arms[index], self.clock() - start)
        # the reward: tokens kept (a finished sequence's idle row and a cut tail earn nothing)
        self.policy.update(index, float(kept.sum()) / max(seconds, 1e-9))
        for drafter in self.drafters.values():
            drafter.update(step_positions, emitted, num_emitted, hidden, kept)


def arms_for(drafter: str, gamma: int) -> list[Arm]:
    """The arms of an export: its drafter and, besides a graph drafter, n-gram lookup (no
    weights), each at γ = 1 .. ``gamma`` (the target step takes any γ)."""
    names = [drafter] if drafter == "ngram" else [drafter, "ngram"]
    return [Arm(name, g) for name in names for g in range(1, gamma + 1)]
