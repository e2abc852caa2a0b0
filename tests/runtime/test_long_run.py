"""A long output (8192 new tokens): the loop's host-side work per step stays flat from the first
to the last thousand tokens (issue 33: the text stream decoded the whole text at every push,
the n-gram drafter scanned the whole sequence at every proposal, so a step's cost grew with the
output). Work is counted, not timed: the token ids the stream's tokenizer decodes per push and
the sequence elements the drafter reads per proposal (``docs/bench/long_run.py`` times it)."""

from __future__ import annotations

import pathlib

import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.models.build import ExportConfig, resolve_trained
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import text
from flashspec_export.runtime.loop import Target, generate

NEW_TOKENS = 8192
GAMMA = 3
THOUSAND = 1000
NEVER = "\u2603 never generated \u2603"  # a stop string the text does not hold
ROOT = pathlib.Path(__file__).parents[2]


def _script(tokenizer, length: int) -> list[int]:
    """``length`` token ids of real code: this package's own sources."""
    ids = []
    for path in sorted((ROOT / "flashspec_export").rglob("*.py")):
        ids += tokenizer.encode(path.read_text())
        if len(ids) >= length:
            return ids[:length]
    raise AssertionError(f"the package's sources hold fewer than {length} tokens")


def scripted_target(script: list[int], max_len: int) -> Target:
    """A greedy target whose text is ``script`` (prompt, then continuation): a step accepts the
    drafts that match the script and emits the script's next token, as VerifyResample does at
    T = 0 for a model that generates the script. It does O(γ) work, so what the loop, the stream
    and the drafter do is all that grows (the stdlib-tiny target's own steps cost ~75 s over
    8192 tokens on a 2-core CPU, and its text past its 1024 positions is noise)."""

    def prefill(tokens, positions, k, v):
        n, t = tokens.shape
        return torch.zeros(n, t, 1), k, v

    def step(tokens, positions, k, v, temperature, seed):
        n, width = tokens.shape  # [N, γ + 1]: the last accepted token, then the drafts
        emitted = torch.full((n, width), -1, dtype=torch.int64)
        num_emitted = torch.zeros(n, dtype=torch.int64)
        for row, (fed, position) in enumerate(
            zip(tokens.tolist(), positions.tolist(), strict=True)
        ):
            follow = script[position + 1 : position + 1 + width]  # fed[0] is script[position]
            accepted = 0
            while accepted < width - 1 and fed[1 + accepted] == follow[accepted]:
                accepted += 1
            emitted[row, : accepted + 1] = torch.tensor(follow[: accepted + 1])
            num_emitted[row] = accepted + 1
        return emitted, num_emitted, torch.zeros(n, width), torch.zeros(n, width, 1), k, v

    return Target(prefill, step, (1, 1, 1, max_len, 1))


class CountingList(list):
    """A token list that counts the elements read from it (indexing, slicing, iterating)."""

    reads = 0

    def __getitem__(self, key):
        value = super().__getitem__(key)
        CountingList.reads += len(value) if isinstance(key, slice) else 1
        return value

    def __iter__(self):
        CountingList.reads += len(self)
        return super().__iter__()


class WatchedDrafter:
    """The n-gram drafter, reading each sequence through one ``CountingList`` kept in step with
    the loop's list (the same list object at every proposal, as the loop's own); records
    (tokens generated so far, elements read) per proposal."""

    def __init__(self, prompt_length: int):
        self.drafter, self.prompt_length = NgramDrafter(), prompt_length
        self.rows: list[CountingList] = []
        self.proposals: list[tuple[int, int]] = []

    def start(self, prompt, hidden, lengths):
        self.drafter.start(prompt, hidden, lengths)
        self.rows = []

    def propose(self, sequences, gamma):
        if not self.rows:
            self.rows = [CountingList() for _ in sequences]
        for mirror, sequence in zip(self.rows, sequences, strict=True):
            list.extend(mirror, sequence[len(mirror) :])  # not counted: the loop's own work
        before = CountingList.reads
        drafts = self.drafter.propose(self.rows, gamma)
        generated = len(self.rows[0]) - self.prompt_length
        self.proposals.append((generated, CountingList.reads - before))
        return drafts

    def update(self, *args):
        self.drafter.update(*args)


class WatchedStream:
    """The text stream, recording (tokens generated before the push, token ids decoded)."""

    def __init__(self, stream: text.TextStream, decoded: list[int]):
        self.stream, self.decoded = stream, decoded
        self.generated = 0
        self.pushes: list[tuple[int, int]] = []

    def push(self, row, tokens):
        before = sum(self.decoded)
        keep = self.stream.push(row, tokens)
        self.pushes.append((self.generated, sum(self.decoded) - before))
        self.generated += len(tokens)
        return keep


def _first_and_last(records: list[tuple[int, int]]) -> tuple[list[int], list[int]]:
    """The work of the records in the first and in the last thousand generated tokens."""
    first = [work for generated, work in records if generated < THOUSAND]
    last = [work for generated, work in records if generated >= NEW_TOKENS - THOUSAND]
    return first, last


def test_a_steps_host_work_is_flat_over_8192_tokens():
    """8192 tokens of real code at γ 3 through the real loop, the stdlib-tiny tokenizer's
    TextStream (a stop string that never matches) and the n-gram drafter: no push decodes more
    than the tokens it brings and the stream's window of settled ones, no proposal reads more
    than the n-grams of the tokens added since the last one and its drafts, and the most work
    of a step in the last thousand tokens is no more than in the first thousand. Decoding the
    whole text, or scanning the whole sequence, reads thousands of tokens a step by the end."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_trained(ExportConfig()).target)
    prompt_length = 16
    script = _script(tokenizer, prompt_length + NEW_TOKENS + GAMMA + 1)
    assert NEVER not in tokenizer.decode(script)
    decoded = []
    decode = tokenizer.decode

    def counting_decode(ids, **kwargs):
        decoded.append(len(ids))
        return decode(ids, **kwargs)

    tokenizer.decode = counting_decode
    stream = WatchedStream(text.TextStream(tokenizer, 1, (NEVER,), eos=()), decoded)
    drafter = WatchedDrafter(prompt_length)
    target = scripted_target(script, prompt_length + NEW_TOKENS + GAMMA)
    prompt = [script[:prompt_length]]
    seeds = torch.zeros(1, dtype=torch.int64)
    result = generate(target, drafter, prompt, NEW_TOKENS, GAMMA, torch.zeros(1), seeds, stream)

    assert result.tokens == [script[prompt_length : prompt_length + NEW_TOKENS]]
    assert stream.stream.texts[0] == decode(result.tokens[0], skip_special_tokens=False)
    assert result.mean_emitted > 1.2  # drafts are accepted: pushes of several tokens happen
    first, last = _first_and_last(stream.pushes)
    window = text.TextStream.WINDOW
    assert max(last) <= 2 * (window + GAMMA + 1), max(last)  # context, then context + new
    assert max(last) <= max(first), (max(first), max(last))
    first, last = _first_and_last(drafter.proposals[1:])  # the first indexes the prompt
    ngram = drafter.drafter.max_ngram
    assert max(last) <= ngram * (ngram + 1) * (GAMMA + 1) + ngram + GAMMA, max(last)
    assert max(last) <= max(first), (max(first), max(last))
