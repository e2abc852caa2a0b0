"""The runtime on the real pair — the trained stdlib-tiny preset — where drafts are accepted:
sampled speculation keeps the text with multi-token acceptance happening for every trained
drafter, prompts of different lengths share a batch, text streams and stops, and online
selection settles on the arm a fixed sweep finds best."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.models.build import ExportConfig, build_modules, resolve_trained
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import selection, sessions, text
from flashspec_export.runtime.invariance import compare_with_plain
from flashspec_export.runtime.loop import generate

PRESET = "stdlib-tiny"
SOURCES = (  # code the preset never saw, of three lengths
    "import os\nimport sys\n\n\ndef main(argv):\n    ",
    "class Stack:\n    def __init__(self):\n        self.items = []\n\n    def push(self, item):\n",
    "for i in range(10):\n",
)
MAX_LEN = 240


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(resolve_trained(ExportConfig(target=PRESET)).target)


@pytest.fixture(scope="module")
def prompts(tokenizer):
    return text.encode_prompts(tokenizer, list(SOURCES))


def _runtime(draft, batch, gamma=3):
    config = ExportConfig(
        target=PRESET, draft=draft, gamma=gamma, batch=batch, max_len=MAX_LEN, dtype="float32"
    )
    return sessions.from_modules(build_modules(config), draft, batch, MAX_LEN)


@pytest.mark.parametrize("draft", ["mtp", "eagle", "model"])
def test_trained_drafts_are_accepted_and_keep_the_text(draft, prompts):
    """fp32, T in {0.6, 1.0}, γ in {1, 3}: every sequence's tokens equal non-speculative
    sampling's (γ = 0, same seeds), and the trained drafters' samples are accepted — more than
    1.15 tokens per step at each T (random heads give ~1.0: only the rejection path)."""

    def run(gamma, temperature, seeds):
        temps = torch.full((len(prompts),), temperature)
        return generate(*_runtime(draft, len(prompts)), prompts, 24, gamma, temps, seeds)

    seeds = torch.tensor([11, 12, 13])
    cases = compare_with_plain(run, (1, 3), (0.6, 1.0), seeds)
    assert [c for c in cases if not c.equal] == []
    for temperature in (0.6, 1.0):
        rates = [c.tokens_per_step for c in cases if c.temperature == temperature]
        assert min(rates) > 1.15, (temperature, rates)


class _RecordingNgram(NgramDrafter):
    """The n-gram drafter, keeping every proposal [N, γ]."""

    def __init__(self):
        super().__init__()
        self.proposals = []

    def propose(self, sequences, gamma):
        self.proposals.append(super().propose(sequences, gamma))
        return self.proposals[-1]


def test_ngram_placeholders_keep_the_text_and_count_no_draft(prompts):
    """The n-gram drafter on held-out code proposes -1 placeholders where its lookup finds
    nothing or fewer than γ tokens (issue 35), and copies that are accepted elsewhere. Greedy and
    sampled, γ 5: every sequence's tokens equal γ = 0's. One sequence alone (every proposal is
    then an unfinished step's): the metrics count its real drafts, not γ per step."""
    target, _ = _runtime("ngram", len(prompts), gamma=5)
    drafters = []

    def run(gamma, temperature, seeds):
        drafters.append(_RecordingNgram())
        temps = torch.full((len(prompts),), temperature)
        return generate(target, drafters[-1], prompts, 24, gamma, temps, seeds)

    cases = compare_with_plain(run, (5,), (0.0, 1.0), torch.tensor([11, 12, 13]))
    assert [c for c in cases if not c.equal] == []
    assert all(c.tokens_per_step > 1.0 for c in cases)  # copies accepted at each T
    drafts = torch.cat([d for r in drafters for d in r.proposals if d.shape[1]])
    real = (drafts >= 0).sum(dim=1)
    assert bool((real == 0).any()) and bool(((real > 0) & (real < drafts.shape[1])).any())

    alone = _RecordingNgram()
    target, _ = _runtime("ngram", 1, gamma=5)
    result = generate(target, alone, prompts[:1], 24, 5, torch.zeros(1), torch.tensor([11]))
    drafted = sum(((d >= 0).sum(dim=0) for d in alone.proposals), torch.zeros(5, dtype=torch.int64))
    assert result.metrics.drafted_at == drafted.tolist()
    assert drafted[-1] < result.steps  # placeholders left positions empty: not γ per step
    assert result.metrics.accepted_at[0] > 0


def test_prompts_of_different_lengths_share_a_batch(prompts):
    """A ragged batch gives each sequence the tokens it gets alone (same seed)."""
    assert len({len(p) for p in prompts}) == 3
    temps, seeds = torch.full((3,), 0.8), torch.tensor([3, 4, 5])
    together = generate(*_runtime("mtp", 3), prompts, 20, 3, temps, seeds)
    for row, prompt in enumerate(prompts):
        alone = generate(*_runtime("mtp", 1), [prompt], 20, 3, temps[:1], seeds[row : row + 1])
        assert together.tokens[row] == alone.tokens[0], row
    assert together.mean_emitted > 1.3


def test_the_stream_decodes_and_stops(tokenizer, prompts):
    """Greedy: streamed pieces add up to the decoded tokens; a stop string ends a sequence
    before the token budget, without the stop string; EOS is never part of the text."""
    pieces = [[] for _ in prompts]
    stream = text.TextStream(tokenizer, 3, stop=("\n\n",), echo=lambda r, s: pieces[r].append(s))
    zeros = torch.zeros(3)
    result = generate(*_runtime("mtp", 3), prompts, 80, 3, zeros, zeros.long(), stream=stream)
    stream.finish()
    for row, tokens in enumerate(result.tokens):
        decoded = tokenizer.decode(tokens)
        assert "".join(pieces[row]) == stream.texts[row]
        assert "\n\n" not in stream.texts[row] and tokenizer.eos_token not in stream.texts[row]
        assert decoded.startswith(stream.texts[row])
        if "\n\n" in decoded:
            assert len(tokens) < 80  # stopped early
    assert any(len(t) < 80 for t in result.tokens)


# A fixed cost model (seconds per step), so that the outcome does not depend on this machine's
# timings; a GPU's: the target step costs 1 whatever γ (memory-bound), each MTP draft 0.02,
# n-gram lookup 0.01 in all.
def _cost(arm, measured):
    return 1.0 + (0.02 * arm.gamma if arm.drafter == "mtp" else 0.01)


# Arms far enough apart for ~100 steps to tell them (γ 2 and 3 lie within 5% of γ 4 here).
ARMS = [selection.Arm(drafter, g) for drafter in ("mtp", "ngram") for g in (1, 4)]


def test_selection_settles_on_the_best_arm_of_a_sweep(prompts):
    """Every arm run alone (greedy) gives its reward, tokens per modelled second; each policy,
    choosing per step on the same prompts, plays the sweep's best arm most in the second half
    of its steps. The text is the same whatever it chooses. (The policies share one sweep and
    one plain run: each generation is seconds on a CPU.)"""
    zeros = torch.zeros(3)
    sweep, new = {}, 200  # the same text for the sweep and the bandits
    for arm in ARMS:
        target, mtp = _runtime("mtp", 3, gamma=4)
        drafter = mtp if arm.drafter == "mtp" else NgramDrafter()
        result = generate(target, drafter, prompts, new, arm.gamma, zeros, zeros.long())
        sweep[arm] = result.mean_emitted / _cost(arm, None)
    best = max(sweep, key=sweep.get)
    runner_up = max(v for a, v in sweep.items() if a != best)
    assert sweep[best] > 1.1 * runner_up, sweep  # a clear best: the test can tell
    plain = generate(*_runtime("mtp", 3, gamma=4), prompts, new, 0, zeros, zeros.long())

    assert len(selection.POLICIES) > 1
    for policy in sorted(selection.POLICIES):
        target, mtp = _runtime("mtp", 3, gamma=4)
        chooser = selection.SelectingDrafter(
            {"mtp": mtp, "ngram": NgramDrafter()}, selection.make_policy(policy, ARMS), _cost
        )
        plays = []
        choose = chooser.policy.choose
        chooser.policy.choose = lambda choose=choose, plays=plays: (
            plays.append(choose()) or plays[-1]
        )
        result = generate(target, chooser, prompts, new, 4, zeros, zeros.long())
        late = plays[len(plays) // 2 :]
        most = max(set(late), key=late.count)
        assert ARMS[most] == best, (policy, ARMS[most], best, sweep, chooser.chosen)
        assert result.tokens == plain.tokens, policy
