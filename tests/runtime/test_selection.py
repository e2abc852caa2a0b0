"""The drafter-selection bandits (``runtime.selection``) on synthetic arms of known mean reward:
they settle on the best arm, and the discounted ones follow the best arm when it changes. Seeded
rewards make every run deterministic; each claim is checked over 20 independent reward streams
and must hold in at least 19 (a policy that picked arms at random would pass one stream with
probability 1/4, 19 of 20 with probability < 1e-9)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from flashspec_export.runtime.selection import POLICIES, Arm

ARMS = [Arm("mtp", 1), Arm("mtp", 3), Arm("mtp", 5), Arm("ngram", 3)]
MEANS = [1.0, 1.5, 2.0, 1.8]  # tokens per ms of step time; arm 2 is the best
NOISE = 0.3
STREAMS = 20


def _play(policy, means_at, pulls: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    chosen = []
    for t in range(pulls):
        arm = policy.choose()
        policy.update(arm, rng.gauss(means_at(t)[arm], NOISE))
        chosen.append(arm)
    return chosen


def _make(name: str, seed: int, discount: float = 1.0):
    if name == "thompson":
        return POLICIES[name](ARMS, discount=discount, seed=seed)
    return POLICIES[name](ARMS, discount=discount)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_settles_on_the_best_arm(name):
    settled = 0
    for seed in range(STREAMS):
        policy = _make(name, seed)
        chosen = _play(policy, lambda _: MEANS, 600, seed)
        late = Counter(chosen[-200:]).most_common(1)[0][0]
        settled += late == 2 and policy.best == 2
    assert settled >= STREAMS - 1, settled


def _follows(name: str, discount: float) -> int:
    """Streams (of 20) in which the policy ends on arm 0 after it becomes the best at pull 500
    (arm 0: 1.0 -> 2.4; the old best, arm 2, keeps its 2.0)."""
    changed = [2.4, 1.5, 2.0, 1.8]
    followed = 0
    for seed in range(STREAMS):
        policy = _make(name, seed, discount=discount)
        chosen = _play(policy, lambda t: MEANS if t < 500 else changed, 1000, seed)
        followed += Counter(chosen[-200:]).most_common(1)[0][0] == 0
    return followed


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_discounted_policies_follow_a_change_of_text(name):
    """With discount 0.98 the policy moves to the new best arm within 300 pulls. (Undiscounted
    Thompson sampling does not — 2 of 20 streams —: what this test would catch if the discount
    were lost; UCB1's scaled bonus keeps exploring enough to follow either way.)"""
    assert _follows(name, 0.98) >= STREAMS - 1
    if name == "thompson":
        assert _follows(name, 1.0) <= 5


def test_every_arm_is_tried_first_in_order():
    policy = POLICIES["ucb1"](ARMS)
    assert _play(policy, lambda _: MEANS, len(ARMS), 0) == list(range(len(ARMS)))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (dict(arms=[]), "arms: expected at least one arm"),
        (dict(arms=ARMS, discount=0.0), "discount: expected 0 < discount <= 1, got 0.0"),
        (dict(arms=ARMS, discount=1.5), "discount: expected 0 < discount <= 1, got 1.5"),
    ],
)
def test_bad_settings_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        POLICIES["ucb1"](**kwargs)


def test_a_non_finite_reward_is_refused():
    with pytest.raises(ValueError, match="reward: expected a finite value, got nan"):
        POLICIES["thompson"](ARMS).update(0, float("nan"))


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_choices_ahead_of_their_rewards(name):
    """The device loop chooses a round's arms before it runs: pending choices explore each
    untried arm once, then every arm again before any reward (not arm 0 eight times); UCB1
    counts them as pulls, so a round of eight after the rewards does not repeat one arm either
    while the bounds are close (equal rewards here); rewarded late, in order, the policy then
    settles as if rewarded at once."""
    policy = _make(name, 0)
    assert [policy.choose() for _ in range(8)] == [0, 1, 2, 3, 0, 1, 2, 3]
    for arm in [0, 1, 2, 3, 0, 1, 2, 3]:
        policy.update(arm, 1.0)
    assert policy.pending == [0, 0, 0, 0]
    if name == "ucb1":
        assert len(set(policy.choose() for _ in range(8))) == len(ARMS)
    rng = random.Random(0)
    late = Counter()
    policy = _make(name, 0)
    for round_ in range(150):  # rounds of 4 choices, rewarded after each round
        chosen = [policy.choose() for _ in range(4)]
        for arm in chosen:
            policy.update(arm, rng.gauss(MEANS[arm], NOISE))
        if round_ >= 100:
            late.update(chosen)
    assert late.most_common(1)[0][0] == 2, late
