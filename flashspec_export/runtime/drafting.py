"""Graph drafters in the loop: MTP / EAGLE (feature drafters) and a standalone draft model.

Per target step the drafter first catches up on everything the step accepted — one call over
all γ + 1 rows with the emitted tokens (and, for feature drafters, the target's hidden states),
drafting from row ``last_row = num_emitted - 1`` — then drafts the remaining γ - 1 tokens one
call at a time. Rows past ``last_row`` write stale cache slots beyond the accepted length; the
next call overwrites them before any query can attend to them (as in the target).
"""

from __future__ import annotations

import torch

from flashspec_export.runtime.loop import Graph


class GraphDrafter:
    """A drafter graph with its own static cache.

    features=True (mtp, eagle): ``graph(hidden [N, T, H], tokens [N, T], positions [N],
    last_row [N], k, v) -> (draft [N], max_logit [N], hidden_out [N, 1, H], k, v)``, where
    ``positions`` is the position of ``hidden[:, 0]`` and the tokens sit one position later.
    features=False (model): ``graph(tokens [N, T], positions [N], last_row [N], k, v)
    -> (draft [N], max_logit [N], k, v)``, ``positions`` of ``tokens[:, 0]``.
    """

    def __init__(
        self,
        graph: Graph,
        cache_shape: tuple[int, ...],
        features: bool,
        cache_dtype: torch.dtype = torch.float32,
        cache_device: str = "cpu",
    ):
        self.graph = graph
        self.cache = dict(size=cache_shape, dtype=cache_dtype, device=cache_device)
        self.features = features
        self._pending = None  # (tokens [N, T], position of tokens[:, 0] [N], last_row [N], hidden)

    def start(self, prompt: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor) -> None:
        n = len(prompt)
        self._k, self._v = torch.zeros(**self.cache), torch.zeros(**self.cache)
        zeros = torch.zeros(n, dtype=torch.int64)
        if self.features:  # hidden row i (position i) pairs with prompt token i + 1
            self._pending = (prompt[:, 1:], zeros + 1, lengths - 2, hidden)
        else:
            self._pending = (prompt, zeros, lengths - 1, None)

    def update(self, step_positions, emitted, num_emitted, hidden, kept) -> None:
        if self._pending is not None:  # a step without our drafts (online selection): catch up
            self._call(*self._pending)
        # emitted is -1 past num_emitted: any valid id does there (those rows are never used)
        self._pending = (emitted.clamp(min=0), step_positions + 1, num_emitted - 1, hidden)

    def _call(self, tokens, positions, last_row, hidden):
        if self.features:
            draft, _, hidden, self._k, self._v = self.graph(
                hidden, tokens, positions - 1, last_row, self._k, self._v
            )
        else:
            draft, _, self._k, self._v = self.graph(tokens, positions, last_row, self._k, self._v)
        return draft, hidden

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        tokens, positions, last_row, hidden = self._pending
        drafts = []
        if gamma > 0:
            self._pending = None
            draft, hidden = self._call(tokens, positions, last_row, hidden)
            drafts.append(draft)
            position = positions + last_row + 1  # of the draft just made
            zeros = torch.zeros_like(last_row)
            for _ in range(gamma - 1):
                draft, hidden = self._call(drafts[-1][:, None], position, zeros, hidden)
                drafts.append(draft)
                position = position + 1
        return torch.stack(drafts, dim=1) if drafts else torch.zeros(len(sequences), 0).long()
