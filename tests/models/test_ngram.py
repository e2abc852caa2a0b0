"""The n-gram drafter's incremental index against the direct backward scan (its specification),
its -1 placeholders where the lookup finds fewer than γ tokens, and its cost per proposal
independent of the sequence's length."""

from __future__ import annotations

import random

from flashspec_export.models.ngram import NgramDrafter


def _scan(sequence: list[int], gamma: int, max_ngram: int = 3) -> list[int]:
    """The latest earlier occurrence of the last n tokens (n = max_ngram .. 1), by scanning."""
    for n in range(min(max_ngram, len(sequence) - 1), 0, -1):
        tail = sequence[-n:]
        for start in range(len(sequence) - n - 1, -1, -1):
            if sequence[start : start + n] == tail:
                follow = sequence[start + n : start + n + gamma]
                return follow + [-1] * (gamma - len(follow))
    return [-1] * gamma


def test_placeholders_fill_what_the_lookup_does_not_find():
    """Golden cases (max_ngram 2): the drafter never pads with a guess."""
    drafter = NgramDrafter(max_ngram=2)
    # no earlier occurrence of the last token (5): nothing proposed, every position a -1
    assert drafter.propose_one([4, 5], 3) == [-1, -1, -1]
    # "1 2" occurred at 0, followed by 3 9 1 2 — γ 3 takes what followed, no placeholder
    assert drafter.propose_one([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]
    # "7 8" occurred at 0, followed by only 7 8 before the sequence ends: the tail is -1
    # (the old padding repeated the last token: [7, 8, 8, 8])
    assert drafter.propose_one([7, 8, 7, 8], 4) == [7, 8, -1, -1]
    # the 2-gram "3 1" never occurred, the 1-gram "1" did (at 0, followed by 3 1): two drafts
    assert drafter.propose_one([1, 3, 1], 3) == [3, 1, -1]
    # rows of one batch differ: one full, one partial, one empty
    batch = drafter.propose([[1, 2, 3, 1, 2], [6, 6], [0, 1]], 3).tolist()
    assert batch == [[3, 1, 2], [6, -1, -1], [-1, -1, -1]]


def test_the_index_proposes_what_the_scan_finds():
    """Sequences growing by 1–4 tokens a step from a small alphabet (so n-grams repeat, with
    ties and overlaps), several rows, γ 1–5, then a new generation: every proposal equals the
    direct scan's."""
    generator = random.Random(0)
    drafter = NgramDrafter()
    for _generation in range(3):
        drafter.start(None, None, None)
        rows = [[generator.randrange(6) for _ in range(generator.randint(2, 5))] for _ in range(3)]
        for _step in range(60):
            gamma = generator.randint(1, 5)
            drafts = drafter.propose(rows, gamma).tolist()
            assert drafts == [_scan(row, gamma) for row in rows]
            for row in rows:
                row.extend(generator.randrange(6) for _ in range(generator.randint(1, 4)))


def test_a_proposal_indexes_only_the_new_tokens():
    """After 20k tokens a proposal touches the tokens added since the last one, not the whole
    sequence (issue 33: the backward scan took 76 ms per proposal at batch 8 and 32k tokens)."""
    generator = random.Random(1)
    drafter = NgramDrafter()
    sequence = [generator.randrange(50) for _ in range(20_000)]
    drafter.propose([sequence], 3)
    indexed = dict(drafter._index[0])
    sequence += [7, 8, 9]
    drafter.propose([sequence], 3)
    changed = {k for k, v in drafter._index[0].items() if indexed.get(k) != v}
    assert 0 < len(changed) <= 3 * drafter.max_ngram  # the n-grams ending at the 3 new tokens
