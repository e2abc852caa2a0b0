"""The drafter-selection bandits (``runtime.selection``) on synthetic drafters of known
acceptance and step time: they settle on the best arm, follow the best arm when the text
changes, spread choices made ahead of their outcomes, and learn each arm from its drafter's
other arms. Seeded outcomes make every run deterministic; each claim is checked over 20
independent streams and must hold in at least 19 (a policy that picked one of the ten arms at
random would end on the best arm in a stream with probability about 1/10, in 19 of 20 with
probability < 1e-17)."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from flashspec_export.runtime.selection import POLICIES, Arm, NgramHindsight, arms_for

ARMS = arms_for("mtp", 5)  # mtp:1 .. mtp:5, ngram:1 .. ngram:5
# per drafter: the probability that draft i is accepted given drafts 0 .. i - 1 were
ACCEPT = {"mtp": [0.85, 0.8, 0.75, 0.3, 0.3], "ngram": [0.5, 0.6, 0.6, 0.6, 0.6]}
DROPPED = {"mtp": [0.3] * 5, "ngram": ACCEPT["ngram"]}  # prose after code: the head misses
STREAMS = 20
SEQUENCES = 2


def step_ms(arm: Arm) -> float:
    """An MTP draft costs a head call a position, an n-gram lookup almost nothing; the target
    step grows a little with γ."""
    per_draft = 0.12 if arm.drafter == "mtp" else 0.005
    return 1.0 + (0.02 + per_draft) * arm.gamma


def expected(arm: Arm, accept=ACCEPT) -> float:
    """Tokens per ms of a sequence: (1 + Σ_i P(drafts 0 .. i accepted)) / step time."""
    through, tokens = 1.0, 1.0
    for rate in accept[arm.drafter][: arm.gamma]:
        through *= rate
        tokens += through
    return tokens / step_ms(arm)


def outcome(arm: Arm, rng: random.Random, accept=ACCEPT) -> tuple[list[int], float]:
    """One step: accepted drafts per sequence, and its seconds (2% timing noise)."""
    accepted = []
    for _ in range(SEQUENCES):
        run = 0
        while run < arm.gamma and rng.random() < accept[arm.drafter][run]:
            run += 1
        accepted.append(run)
    return accepted, step_ms(arm) * 1e-3 * rng.gauss(1.0, 0.02)


BEST = max(range(len(ARMS)), key=lambda i: expected(ARMS[i]))
BEST_DROPPED = max(range(len(ARMS)), key=lambda i: expected(ARMS[i], DROPPED))


def _play(policy, steps: int, seed: int, change_at: int | None = None) -> list[int]:
    rng = random.Random(seed)
    chosen = []
    for t in range(steps):
        arm = policy.choose()
        accept = DROPPED if change_at is not None and t >= change_at else ACCEPT
        policy.update(arm, *outcome(ARMS[arm], rng, accept))
        chosen.append(arm)
    return chosen


def _make(name: str, seed: int, discount: float = 1.0):
    if name == "thompson":
        return POLICIES[name](ARMS, discount=discount, seed=seed)
    return POLICIES[name](ARMS, discount=discount)


def test_the_synthetic_arms_have_a_clear_best():
    """The best arm by 4% or more, and a different one after the change (else the tests below
    could not tell a policy from its neighbours)."""
    values = sorted(expected(a) for a in ARMS)
    assert values[-1] > 1.04 * values[-2]
    assert ARMS[BEST] == Arm("mtp", 3) and ARMS[BEST_DROPPED] == Arm("ngram", 5)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_settles_on_the_best_arm(name):
    """Within 300 steps (ten arms; the best is 4.6% ahead of the next)."""
    settled = 0
    for seed in range(STREAMS):
        policy = _make(name, seed)
        chosen = _play(policy, 300, seed)
        late = Counter(chosen[-100:]).most_common(1)[0][0]
        settled += late == BEST and policy.best == BEST
    assert settled >= STREAMS - 1, settled


# the share of the 100 steps after the change a policy must give the new best arm: Thompson
# sampling keeps exploring more than UCB1 with its small bonus
FOLLOW_SHARE = {"ucb1": 0.85, "thompson": 0.35}


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_discounted_policies_follow_a_change_of_text(name):
    """The MTP head's acceptance drops at step 300 (code, then prose) and an n-gram arm becomes
    the best: with discount 0.98 the policy gives it ``FOLLOW_SHARE`` of the next 100 steps.
    Undiscounted, the old counts outweigh the new ones for longer (6 and 4 streams of 20 reach
    the share): what this test would catch if the discount were lost."""

    def follows(discount: float) -> int:
        streams = 0
        for seed in range(STREAMS):
            chosen = _play(_make(name, seed, discount), 400, seed, change_at=300)
            streams += chosen[300:].count(BEST_DROPPED) >= 100 * FOLLOW_SHARE[name]
        return streams

    assert follows(0.98) >= STREAMS - 1
    assert follows(1.0) <= STREAMS - 10


def test_every_arm_is_tried_first_in_order():
    policy = POLICIES["ucb1"](ARMS)
    assert _play(policy, len(ARMS), 0) == list(range(len(ARMS)))


def test_a_step_teaches_every_arm_of_its_drafter():
    """Steps of mtp:5 alone give the acceptance of positions 0 .. 4, so mtp:2's estimate is
    known without a step of its own beyond the first."""
    policy = POLICIES["thompson"](ARMS, seed=0)
    rng = random.Random(0)
    for i in range(len(ARMS)):
        policy.update(i, *outcome(ARMS[i], rng))
    five, two = ARMS.index(Arm("mtp", 5)), ARMS.index(Arm("mtp", 2))
    for _ in range(2000):
        policy.update(five, *outcome(ARMS[five], rng))
    mean = {d: [a / n for a, n in zip(policy.accepted[d], policy.drafted[d], strict=True)]
            for d in policy.drafted}  # fmt: skip
    assert policy.estimate(two, mean) * 1e-3 == pytest.approx(expected(ARMS[two]), rel=0.03)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_choices_ahead_of_their_outcomes(name):
    """The device loop chooses a round's arms before it runs: pending choices explore each
    untried arm once, then every arm again before any outcome (not arm 0 twenty times); told
    late, a round at a time, the policy still settles on the best arm."""
    policy = _make(name, 0)
    assert [policy.choose() for _ in range(20)] == list(range(10)) * 2
    rng = random.Random(0)
    for arm in list(range(10)) * 2:
        policy.update(arm, *outcome(ARMS[arm], rng))
    assert policy.pending == [0] * len(ARMS)
    settled = 0
    for seed in range(STREAMS):
        policy, rng, late = _make(name, seed), random.Random(seed), Counter()
        for round_ in range(30):  # rounds of 16 choices, told after each round
            chosen = [policy.choose() for _ in range(16)]
            for arm in chosen:
                policy.update(arm, *outcome(ARMS[arm], rng))
            if round_ >= 20:
                late.update(chosen)
        settled += late.most_common(1)[0][0] == BEST
    assert settled >= STREAMS - 1, settled


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


def test_bad_outcomes_are_refused():
    policy = POLICIES["thompson"](ARMS)
    with pytest.raises(ValueError, match="seconds: expected a finite time > 0, got nan"):
        policy.update(0, [0], float("nan"))
    with pytest.raises(ValueError, match=r"accepted: expected drafts in 0 .. 1 per sequence"):
        policy.update(0, [2], 1e-3)


def test_ngram_drafts_scored_in_hindsight():
    """Golden: the lookup's drafts before a step, scored once the text has γ more tokens (a
    placeholder matches nothing; a finished sequence scores what it has), and the policy
    learns them as n-gram acceptance without a step of its own."""
    hindsight = NgramHindsight(3)
    sequence = [5, 6, 7, 5, 6]
    hindsight.before(0, sequence)  # "5 6" was followed by 7 5 6: drafts [7, 5, 6]
    sequence += [7, 5]
    assert hindsight.scored(0, sequence, finished=False) == []  # 2 of 3 tokens known
    sequence += [9]
    assert hindsight.scored(0, sequence, finished=False) == [(2, 3)]  # 7 5 accepted, not 6
    hindsight.before(1, [1, 2, 3])  # no match: [-1, -1, -1]
    assert hindsight.scored(1, [1, 2, 3, 4], finished=True) == [(0, 1)]
    policy = POLICIES["ucb1"](ARMS)
    policy.observe("ngram", 2, 3)
    assert policy.drafted["ngram"] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert policy.accepted["ngram"] == [1.0, 1.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match=r"accepted: expected 0 \.\. drafted 1, got 2"):
        policy.observe("ngram", 2, 1)
