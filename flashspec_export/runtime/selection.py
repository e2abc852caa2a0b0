"""Online choice of the speculation configuration: a bandit over arms (drafter, γ).

Each step the loop asks ``choose()`` for an arm, runs the step with it, and reports
``update(arm, accepted, seconds)``: the drafts each unfinished sequence had accepted and the
step's time (drafting + verification). The reward of an arm is the tokens per second it gives,
estimated with the structure every arm shares rather than from its own steps alone:

    tokens per second (d, γ) = (1 + Σ_{i < γ} a_d(i)) / t(d, γ)

``a_d(i)`` is the probability that drafter d's drafts 0 .. i are all accepted — learnt from every
step of every arm of d that drafted position i (a γ = 5 step teaches the γ = 2 arm too; a -1
placeholder is a draft not accepted) — and ``t(d, γ)`` the arm's mean step time, which varies
little from step to step. So a step teaches every arm of its drafter, and the choice does not
wait for each arm's noisy per-step reward (1 .. γ + 1 tokens) to average out: on the stdlib-tiny
pair a scalar-reward bandit over ten arms stayed at 83-95% of the best arm over 512 tokens
(``docs/bench/select_h200_scalar.log``).

- ``Ucb1``: the acceptance probabilities at their UCB1 upper bounds
  (``a + sqrt(exploration · ln n / n_i)``, capped at 1), the times at their means.
- ``Thompson``: the acceptance probabilities drawn from their Beta posteriors (uniform prior),
  seeded.

In both the probabilities are made non-increasing in i (a run cannot be accepted through i + 1
more often than through i). Both discount old observations (``discount`` < 1: each update
multiplies the past statistics by it), so they follow acceptance that drifts as the text changes
(code, then prose).

Untried arms are chosen first, in order (their time is unknown). Choices may run ahead of their
rewards (the device loop chooses the arm of every step of a round before the round runs and
updates after it): a chosen arm is pending until its update, an untried arm that is pending is
not chosen again while another is untried, and UCB1's bonus counts pending choices as samples.
Seeded: the same outcomes give the same choices.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Sequence
from typing import NamedTuple

import torch

from flashspec_export.config import ConfigError
from flashspec_export.models.ngram import NgramDrafter


class Arm(NamedTuple):
    drafter: str
    gamma: int


class _Policy:
    """Discounted per-drafter acceptance counts and per-arm step times; ``choose`` asks the
    subclass for each drafter's acceptance probabilities (``_rates``)."""

    def __init__(self, arms, discount: float):
        if not arms:
            raise ValueError("arms: expected at least one arm")
        if not 0.0 < discount <= 1.0:
            raise ValueError(f"discount: expected 0 < discount <= 1, got {discount}")
        self.arms = list(arms)
        self.discount = discount
        longest: dict[str, int] = {}
        for arm in self.arms:
            longest[arm.drafter] = max(longest.get(arm.drafter, 0), arm.gamma)
        # per drafter and draft position i: sequence-steps that drafted i (their arm's γ > i),
        # and those that accepted drafts 0 .. i
        self.drafted = {d: [0.0] * g for d, g in longest.items()}
        self.accepted = {d: [0.0] * g for d, g in longest.items()}
        self.seconds = [0.0] * len(self.arms)  # per arm: step seconds, steps
        self.steps = [0.0] * len(self.arms)
        self.tried = [False] * len(self.arms)
        self.pending = [0] * len(self.arms)  # chosen, not yet rewarded

    def update(self, arm: int, accepted: Sequence[int], seconds: float) -> None:
        """One step of ``arm``: ``accepted`` drafts per unfinished sequence (0 .. γ), in
        ``seconds``."""
        if not (math.isfinite(seconds) and seconds > 0):
            raise ValueError(f"seconds: expected a finite time > 0, got {seconds}")
        drafter, gamma = self.arms[arm]
        if any(not 0 <= a <= gamma for a in accepted):
            raise ValueError(
                f"accepted: expected drafts in 0 .. {gamma} per sequence, got {accepted}"
            )
        for table in (*self.drafted.values(), *self.accepted.values(), self.seconds, self.steps):
            table[:] = [x * self.discount for x in table]
        for i in range(gamma):
            self.drafted[drafter][i] += len(accepted)
            self.accepted[drafter][i] += sum(a > i for a in accepted)
        self.seconds[arm] += seconds
        self.steps[arm] += 1.0
        self.tried[arm] = True
        self.pending[arm] = max(self.pending[arm] - 1, 0)

    def observe(self, drafter: str, accepted: int, drafted: int) -> None:
        """``drafter``'s acceptance on a step it did not run (``NgramHindsight``): of its
        ``drafted`` positions scored, drafts 0 .. ``accepted`` - 1 would have been accepted."""
        if not 0 <= accepted <= drafted:
            raise ValueError(f"accepted: expected 0 .. drafted {drafted}, got {accepted}")
        table = self.drafted[drafter]
        for i in range(min(drafted, len(table))):
            table[i] += 1.0
            self.accepted[drafter][i] += float(accepted > i)

    def _chose(self, arm: int) -> int:
        self.pending[arm] += 1
        return arm

    def untried(self) -> int | None:
        """The first arm never rewarded nor pending; else, while every tried arm is only
        pending, the untried one least pending."""
        waiting = [i for i, done in enumerate(self.tried) if not done]
        fresh = next((i for i in waiting if not self.pending[i]), None)
        if fresh is not None or not waiting or any(self.tried):
            return fresh
        return min(waiting, key=self.pending.__getitem__)

    def _rates(self, drafter: str) -> list[float]:
        raise NotImplementedError

    def estimate(self, arm: int, rates: dict[str, list[float]]) -> float:
        """Tokens per second of a sequence under ``arm`` with acceptance ``rates``."""
        drafter, gamma = self.arms[arm]
        through, tokens = 1.0, 1.0
        for rate in rates[drafter][:gamma]:
            through = min(through, rate)  # non-increasing in the position
            tokens += through
        return tokens * self.steps[arm] / self.seconds[arm]

    def choose(self) -> int:
        first = self.untried()
        if first is not None:
            return self._chose(first)
        rates = {d: self._rates(d) for d in self.drafted}
        tried = [i for i in range(len(self.arms)) if self.tried[i]]
        return self._chose(max(tried, key=lambda i: self.estimate(i, rates)))

    @property
    def best(self) -> int:
        """The arm of the highest estimated tokens per second at the mean acceptance."""
        tried = [i for i in range(len(self.arms)) if self.tried[i]]
        if not tried:
            return 0
        rates = {
            d: [a / max(n, 1e-12) for a, n in zip(self.accepted[d], self.drafted[d], strict=True)]
            for d in self.drafted
        }
        return max(tried, key=lambda i: self.estimate(i, rates))


class Ucb1(_Policy):
    """Acceptance at its UCB1 upper bound: a + sqrt(exploration · ln(n) / n_i), capped at 1."""

    def __init__(self, arms, discount: float = 1.0, exploration: float = 0.1):
        super().__init__(arms, discount)
        self.exploration = exploration

    def _rates(self, drafter: str) -> list[float]:
        pending = sum(
            p for a, p in zip(self.arms, self.pending, strict=True) if a.drafter == drafter
        )
        samples = [n + pending for n in self.drafted[drafter]]
        total = max(sum(d[0] for d in self.drafted.values() if d), 1.0)
        rates = []
        for accepted, n in zip(self.accepted[drafter], samples, strict=True):
            if n <= 0:
                rates.append(1.0)
                continue
            bonus = math.sqrt(self.exploration * math.log(max(total, 1.0)) / n)
            rates.append(min(accepted / n + bonus, 1.0))
        return rates


class Thompson(_Policy):
    """Acceptance drawn from its Beta(1 + accepted, 1 + rejected) posterior, seeded."""

    def __init__(self, arms, discount: float = 1.0, seed: int = 0):
        super().__init__(arms, discount)
        self.rng = random.Random(seed)

    def _rates(self, drafter: str) -> list[float]:
        return [
            self.rng.betavariate(1.0 + accepted, 1.0 + max(n - accepted, 0.0))
            for accepted, n in zip(self.accepted[drafter], self.drafted[drafter], strict=True)
        ]


POLICIES = {"ucb1": Ucb1, "thompson": Thompson}


class NgramHindsight:
    """The n-gram lookup's acceptance on the steps another drafter ran, scored in hindsight.

    Under the coupled rule a draft is accepted iff it equals the target's sample at its
    position, and that sample does not depend on the drafts: the realised text decides how many
    of any proposal would have been accepted. The lookup costs nothing on the host, so before
    each such step the loop asks it what it would have drafted (``before``, on the sequence's
    tokens so far) and, once the text has ``gamma`` more tokens (or the sequence ended), scores
    it (``scored``): the policy learns the n-gram drafter's acceptance on every step, so its arms
    need no exploration and their estimates follow the text (``_Policy.observe``).
    """

    def __init__(self, gamma: int, max_ngram: int = 3):
        self.gamma = gamma
        self.lookup = NgramDrafter(max_ngram)
        self.pending: dict[int, list[tuple[int, list[int]]]] = {}  # row -> (start, drafts)

    def before(self, row: int, sequence: list[int]) -> None:
        """What the lookup would draft after ``sequence`` (a list the loop extends in place)."""
        drafts = self.lookup.propose_one(sequence, self.gamma, row)
        self.pending.setdefault(row, []).append((len(sequence), drafts))

    def scored(self, row: int, sequence: list[int], finished: bool) -> list[tuple[int, int]]:
        """(drafts accepted, positions scored) of the row's proposals whose continuation is now
        known: ``gamma`` tokens, or what the sequence had when it ``finished``."""
        done, waiting = [], []
        for start, drafts in self.pending.get(row, []):
            truth = sequence[start : start + self.gamma]
            if len(truth) < self.gamma and not finished:
                waiting.append((start, drafts))
                continue
            run = 0
            while run < len(truth) and drafts[run] == truth[run]:  # a -1 matches no token
                run += 1
            done.append((run, len(truth)))
        self.pending[row] = waiting
        return done


# Each update multiplies the past statistics by it: ~50 steps of memory, so the estimates follow
# acceptance that changes as the text does (code, then prose)
DISCOUNT = 0.98


def make_policy(name: str, arms, seed: int = 0, discount: float = DISCOUNT):
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
        # the drafts each unfinished sequence had accepted (a finished one's idle row counts
        # for none; a tail cut at the token limit counts what was kept)
        accepted = [int(k) - 1 for k in kept.tolist() if k > 0]
        self.policy.update(index, accepted, max(seconds, 1e-9))
        for drafter in self.drafters.values():
            drafter.update(step_positions, emitted, num_emitted, hidden, kept)


def arms_for(drafter: str, gamma: int) -> list[Arm]:
    """The arms of an export: its drafter and, besides a graph drafter, n-gram lookup (no
    weights), each at γ = 1 .. ``gamma`` (the target step takes any γ)."""
    names = [drafter] if drafter == "ngram" else [drafter, "ngram"]
    return [Arm(name, g) for name in names for g in range(1, gamma + 1)]
