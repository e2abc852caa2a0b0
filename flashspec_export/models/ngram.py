"""N-gram (prompt-lookup) drafter: no graph, no weights; recorded in the manifest only."""

from __future__ import annotations

import torch

PLACEHOLDER = -1  # a draft position the drafter leaves empty (ops.verify_resample's -1)


class NgramDrafter:
    """Propose up to γ tokens by finding the latest earlier occurrence of the sequence's last
    ``n`` tokens (n = max_ngram .. 1) and copying what followed it.

    Where fewer than γ tokens follow the match (it ends near the sequence's end), or nothing
    matches, the rest of the row is ``PLACEHOLDER`` (-1): ``VerifyResample`` reads a -1 draft as
    "this sequence proposed no more" — the row emits its sample and the sequence stops there
    (issue 35). Padding with a guess (the last token, repeated), as before, was verified like a
    real draft and counted as one, yet almost never accepted: on held-out stdlib code the tokens
    per step were the same to 0.001 while the acceptance per draft halved (issue 35's
    measurement: ``git show 51a3298:docs/BENCHMARKS.md``).

    Each sequence keeps an index from every n-gram (n <= max_ngram) to its latest start that a
    token follows, extended by the tokens added since the last proposal: a proposal costs
    O(max_ngram · (new tokens + γ)), not a scan of the whole sequence.
    """

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram
        self._index: list[dict[tuple[int, ...], int]] = []  # per sequence: n-gram -> start
        self._indexed: list[int] = []  # per sequence: tokens the index covers
        self._lists: list[list[int] | None] = []  # per sequence: the list indexed (it grows)

    def start(self, prompt, hidden, lengths) -> None:
        """A new generation: forget the indexes (the drafter reads the token lists)."""
        self._index, self._indexed, self._lists = [], [], []

    def update(self, step_positions, emitted, num_emitted, hidden, kept) -> None:
        """Nothing to update: the next proposal indexes the tokens added since."""

    def _catch_up(self, row: int, sequence: list[int]) -> dict[tuple[int, ...], int]:
        while len(self._index) <= row:
            self._index.append({})
            self._indexed.append(0)
            self._lists.append(None)
        # the loop extends the same lists; another list (or a shorter one) starts afresh
        if sequence is not self._lists[row] or len(sequence) < self._indexed[row]:
            self._index[row], self._indexed[row], self._lists[row] = {}, 0, sequence
        index = self._index[row]
        for end in range(max(self._indexed[row], 1), len(sequence)):
            # the n-grams ending just before `end`: a token (sequence[end]) follows them
            for n in range(1, min(self.max_ngram, end) + 1):
                index[tuple(sequence[end - n : end])] = end - n
        self._indexed[row] = len(sequence)
        return index

    def propose_one(self, sequence: list[int], gamma: int, row: int = 0) -> list[int]:
        """γ drafts after ``sequence``: what followed the longest match, then -1 placeholders."""
        if gamma == 0:
            return []
        index = self._catch_up(row, sequence)
        for n in range(min(self.max_ngram, len(sequence) - 1), 0, -1):
            start = index.get(tuple(sequence[-n:]))
            if start is not None:
                follow = sequence[start + n : start + n + gamma]
                return follow + [PLACEHOLDER] * (gamma - len(follow))
        return [PLACEHOLDER] * gamma

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        """[N, γ] int64 drafts for N token lists; -1 past a sequence's last real draft."""
        drafts = [self.propose_one(s, gamma, row) for row, s in enumerate(sequences)]
        return torch.tensor(drafts, dtype=torch.int64).reshape(len(sequences), gamma)


def lookup(tokens: torch.Tensor, lengths: torch.Tensor, gamma: int, max_ngram: int = 3):
    """``NgramDrafter.propose``'s drafts as tensor ops, for the device loop: static shapes and
    no read of the host, so that the lookup is part of the step's CUDA graph.

    For each n, the sequence's last n tokens are compared with the n tokens at every start; the
    starts a token follows inside the sequence (start + n < length) are the earlier occurrences,
    the largest the latest. The longest n that has one gives the drafts: the up to γ tokens
    after it inside the sequence, then -1 (``PLACEHOLDER``), as on the host. The cost is
    O(N · L · max_ngram) compares a step, nothing beside a target step.

    Parameters
    ----------
    tokens : [N, L] int64 — sequence i is ``tokens[i, :lengths[i]]``; the rest is ignored
    lengths : [N] int64, each in 1 .. L
    gamma : drafts per sequence
    max_ngram : the longest n-gram looked up (``NgramDrafter.max_ngram``)

    Returns
    -------
    [N, γ] int64 drafts, -1 past a sequence's last real draft
    """
    width = tokens.shape[1]
    starts = torch.arange(width, device=tokens.device)  # [L]
    found = torch.zeros_like(lengths, dtype=torch.bool)  # [N]: some n matched
    follow = torch.zeros_like(lengths)  # [N]: where the longest match's continuation starts
    for n in range(1, min(max_ngram, width) + 1):  # a longer match overwrites a shorter
        windows = tokens.unfold(1, n, 1)  # [N, L - n + 1, n]: the n tokens at every start
        last = tokens.gather(1, (lengths[:, None] - n + starts[:n]).clamp(min=0))  # [N, n]
        at = starts[: width - n + 1]  # [L - n + 1]
        earlier = at[None, :] + n < lengths[:, None]  # [N, L - n + 1]: a token follows inside
        match = (windows == last[:, None, :]).all(dim=2) & earlier
        latest = torch.where(match, at, -1).amax(dim=1)  # [N]: -1 where none
        follow = torch.where(latest >= 0, latest + n, follow)
        found = found | (latest >= 0)
    index = follow[:, None] + torch.arange(gamma, device=tokens.device)  # [N, γ]
    real = found[:, None] & (index < lengths[:, None])
    drafts = tokens.gather(1, index.clamp(max=width - 1))
    return torch.where(real, drafts, PLACEHOLDER)
