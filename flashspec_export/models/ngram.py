"""N-gram (prompt-lookup) drafter: no graph, no weights; recorded in the manifest only."""

from __future__ import annotations

import torch


class NgramDrafter:
    """Propose γ tokens by finding the latest earlier occurrence of the sequence's last ``n``
    tokens (n = max_ngram .. 1) and copying what followed it; repeat the last token otherwise.

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
        if gamma == 0:
            return []
        index = self._catch_up(row, sequence)
        for n in range(min(self.max_ngram, len(sequence) - 1), 0, -1):
            start = index.get(tuple(sequence[-n:]))
            if start is not None:
                follow = sequence[start + n : start + n + gamma]
                return follow + [follow[-1]] * (gamma - len(follow))
        return [sequence[-1]] * gamma

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        """[N, γ] int64 drafts for N token lists."""
        drafts = [self.propose_one(s, gamma, row) for row, s in enumerate(sequences)]
        return torch.tensor(drafts, dtype=torch.int64).reshape(len(sequences), gamma)
