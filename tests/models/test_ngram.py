"""The n-gram drafter's incremental index against the direct backward scan (its specification),
its -1 placeholders where the lookup finds fewer than γ tokens, its cost per proposal
independent of the sequence's length, and the device loop's tensor lookup (``ngram.lookup``)
proposing the same drafts."""

from __future__ import annotations

import random

import pytest
import torch

from flashspec_export.models.ngram import NgramDrafter, lookup


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


def _lookup(rows: list[list[int]], gamma: int, max_ngram: int, width: int, fill: int):
    """``lookup`` over ``rows`` right-padded to ``width`` with ``fill`` (a token the lookup must
    not read: it may equal the rows' own)."""
    tokens = torch.full((len(rows), width), fill, dtype=torch.int64)
    for i, row in enumerate(rows):
        tokens[i, : len(row)] = torch.tensor(row)
    return lookup(tokens, torch.tensor([len(row) for row in rows]), gamma, max_ngram).tolist()


def test_the_device_lookup_proposes_the_golden_drafts():
    """The golden cases above through the device loop's tensor lookup (max_ngram 2): no match
    (all -1), a full copy, a match near the end (partial: -1 after what followed), the 1-gram
    when the 2-gram never occurred, and rows of one batch that differ, padded past their ends
    with a token that would match if the lookup read it."""
    assert _lookup([[4, 5]], 3, 2, 8, fill=5) == [[-1, -1, -1]]
    assert _lookup([[1, 2, 3, 9, 1, 2]], 3, 2, 6, fill=0) == [[3, 9, 1]]
    assert _lookup([[7, 8, 7, 8]], 4, 2, 9, fill=7) == [[7, 8, -1, -1]]
    assert _lookup([[1, 3, 1]], 3, 2, 5, fill=1) == [[3, 1, -1]]
    batch = _lookup([[1, 2, 3, 1, 2], [6, 6], [0, 1]], 3, 2, 7, fill=6)
    assert batch == [[3, 1, 2], [6, -1, -1], [-1, -1, -1]]


@pytest.mark.parametrize("alphabet", [2, 6, 512])  # repetitive .. mostly no match
def test_the_device_lookup_proposes_what_the_drafter_does(alphabet):
    """``lookup`` (the device loop's n-gram drafts as tensor ops) against ``NgramDrafter.propose``
    on the same token lists: batches of 1–5 rows of lengths 1–40 (random tokens from an
    alphabet of 2, 6 or 512, or a random phrase repeated with a changed token), padded past
    their ends with a random token, γ 0–7, max_ngram 1–4: the same drafts, -1s included. The
    cases cover full, partial (the match near the end) and no matches."""
    generator = random.Random(alphabet)
    seen = {"full": 0, "partial": 0, "none": 0}
    for _case in range(200):
        rows = []
        for _row in range(generator.randint(1, 5)):
            length = generator.randint(1, 40)
            if generator.random() < 0.3:  # a phrase repeated, one token changed
                phrase = [generator.randrange(alphabet) for _ in range(generator.randint(1, 6))]
                row = (phrase * length)[:length]
                row[generator.randrange(length)] = generator.randrange(alphabet)
            else:
                row = [generator.randrange(alphabet) for _ in range(length)]
            rows.append(row)
        gamma, max_ngram = generator.randint(0, 7), generator.randint(1, 4)
        width = max(map(len, rows)) + generator.randint(0, 3)
        want = NgramDrafter(max_ngram).propose(rows, gamma).tolist()
        assert _lookup(rows, gamma, max_ngram, width, generator.randrange(alphabet)) == want
        for drafts in want if gamma else []:
            real = sum(d >= 0 for d in drafts)
            seen["full" if real == gamma else "partial" if real else "none"] += 1
    assert min(seen.values()) > 0, seen
