"""N-gram (prompt-lookup) drafter: no graph, no weights; recorded in the manifest only."""

from __future__ import annotations

import torch


class NgramDrafter:
    """Propose γ tokens by finding the latest earlier occurrence of the sequence's last ``n``
    tokens (n = max_ngram .. 1) and copying what followed it; repeat the last token otherwise."""

    def __init__(self, max_ngram: int = 3):
        self.max_ngram = max_ngram

    def start(self, prompt, hidden, lengths) -> None:
        """Nothing to prefill: the drafter reads the token lists."""

    def update(self, step_positions, emitted, num_emitted, hidden, kept) -> None:
        """Nothing to update."""

    def propose_one(self, sequence: list[int], gamma: int) -> list[int]:
        if gamma == 0:
            return []
        for n in range(min(self.max_ngram, len(sequence) - 1), 0, -1):
            tail = sequence[-n:]
            for start in range(len(sequence) - n - 1, -1, -1):
                if sequence[start : start + n] == tail:
                    follow = sequence[start + n : start + n + gamma]
                    return follow + [follow[-1]] * (gamma - len(follow))
        return [sequence[-1]] * gamma

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        """[N, γ] int64 drafts for N token lists."""
        drafts = [self.propose_one(s, gamma) for s in sequences]
        return torch.tensor(drafts, dtype=torch.int64).reshape(len(sequences), gamma)
