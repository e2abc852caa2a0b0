"""Reference ``VerifyResample``: verify γ greedy drafts and emit the next tokens in one pass.

Terms (per sequence n and draft position i = 0..γ):

- row i of ``hidden`` is the target state after the prefix and the drafts ``d[:i]``;
- ``l_i = hidden_i · lm_headᵀ / T`` (fp32 accumulation; ``T = 0`` means greedy and uses the
  raw dot products), ``LSE_i = log Σ_v exp(l_i,v)``;
- the draft ``x = d_i`` (i < γ) is accepted iff ``u_i <= exp(l_i(x) - LSE_i)``, where
  ``u_i = uniform(seed, position + i, 0, STREAM_ACCEPT)``; greedy: iff ``x == argmax l_i``;
- the recovered token after a rejection is ``argmax_{v != x} (l_i,v + g_i,v)`` with
  ``g_i,v = gumbel(seed, position + i, v, STREAM_GUMBEL)``; the bonus token (row γ, reached when
  every draft is accepted) is ``argmax_v (l_γ,v + g_γ,v)``; greedy: the plain argmax.

Since a greedy draft has ``q(x) = 1``, accepting with probability ``p(x)`` and otherwise sampling
``p`` with ``x`` removed emits exactly ``p`` (see DESIGN.md).

The computation mirrors the kernels: stage 1 walks vocabulary tiles and keeps per-tile summaries
(max and sum-exp, the drafted token's logit, the best noisy candidate), stage 2 reduces the
summaries and walks the positions left to right. Nothing vocabulary-sized outlives a tile.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashspec_export.reference import noise

DEFAULT_BLOCK_V = 4096


class VerifyResult(NamedTuple):
    """Outputs of ``VerifyResample``.

    tokens : [N, γ + 1] int64 — accepted drafts, then the recovered or bonus token, then -1
    num_emitted : [N] int64 in 1..γ + 1
    logprobs : [N, γ + 1] float32 target log-probabilities of the emitted tokens (0 past
        ``num_emitted``), or None when not requested. Greedy rows (T = 0) report the
        log-softmax of the raw logits.
    """

    tokens: torch.Tensor
    num_emitted: torch.Tensor
    logprobs: torch.Tensor | None = None


class TileSummaries(NamedTuple):
    """Stage-1 output, one entry per (sequence, row, vocabulary tile): [N, γ + 1, tiles]."""

    max_logit: torch.Tensor  # float32, max_v l_v over the tile
    sum_exp: torch.Tensor  # float32, Σ_v exp(l_v - max_logit) over the tile
    draft_logit: torch.Tensor  # float32, l(x) if the drafted token x is in the tile, else -inf
    best_score: torch.Tensor  # float32, max_{v != x} (l_v + g_v) (greedy: max_v l_v)
    best_index: torch.Tensor  # int64, global token id of best_score (lowest on ties)
    best_logit: torch.Tensor  # float32, l at best_index (for log-probabilities)


def logit_scale(temperature: torch.Tensor) -> torch.Tensor:
    """Divisor of the dot products: ``T``, or 1 for greedy rows (``T == 0``)."""
    return torch.where(temperature == 0, torch.ones_like(temperature), temperature)


def acceptance_uniform(seed: torch.Tensor, positions: torch.Tensor, gamma: int) -> torch.Tensor:
    """``u_i = uniform(seed, position + i, 0, STREAM_ACCEPT)`` for i < γ: [N] x2 -> [N, γ]."""
    row_pos = positions[:, None] + torch.arange(gamma, device=positions.device)
    return noise.uniform(seed[:, None], row_pos, 0, noise.STREAM_ACCEPT)


def tile_summaries(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    block_v: int,
) -> TileSummaries:
    """Stage 1: per-tile summaries. Shapes as in ``verify_resample``."""
    n, rows, _ = hidden.shape
    hidden32 = hidden.float()  # [N, R, H]
    device = hidden.device
    row_pos = positions[:, None] + torch.arange(rows, device=device)  # [N, R]
    a, b = noise.row_keys(seed[:, None], row_pos, noise.STREAM_GUMBEL)  # [N, R] each
    scale = logit_scale(temperature)[:, None, None]  # [N, 1, 1]
    greedy = (temperature == 0)[:, None, None]  # [N, 1, 1]
    no_draft = torch.full((n, 1), -1, dtype=torch.int64, device=device)
    excluded = torch.cat([draft_tokens, no_draft], dim=1)[..., None]  # [N, R, 1]; row γ: none

    fields = {name: [] for name in TileSummaries._fields}
    for start in range(0, vocab_size, block_v):
        stop = min(start + block_v, vocab_size)
        token = torch.arange(start, stop, device=device)  # [B]
        logits = (hidden32 @ lm_head[start:stop].float().T) / scale  # [N, R, B]
        tile_max = logits.amax(dim=-1)
        fields["max_logit"].append(tile_max)
        fields["sum_exp"].append(torch.exp(logits - tile_max[..., None]).sum(dim=-1))

        is_draft = token == excluded  # [N, R, B]
        draft_logit = torch.where(is_draft, logits, float("-inf")).amax(dim=-1)
        fields["draft_logit"].append(draft_logit)

        g = noise.gumbel_from_bits(noise.token_bits(a[..., None], b[..., None], token))
        score = torch.where(greedy, logits, logits + g)
        score = score.masked_fill(is_draft & ~greedy, float("-inf"))
        best_score, best_arg = score.max(dim=-1)  # first occurrence on ties
        fields["best_score"].append(best_score)
        fields["best_index"].append(best_arg + start)
        fields["best_logit"].append(logits.gather(-1, best_arg[..., None]).squeeze(-1))
    return TileSummaries(**{k: torch.stack(v, dim=-1) for k, v in fields.items()})


def finalize(
    summaries: TileSummaries,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    return_logprobs: bool,
) -> VerifyResult:
    """Stage 2: reduce the tiles, accept drafts left to right, emit tokens."""
    gamma = draft_tokens.shape[1]

    m = summaries.max_logit.amax(dim=-1)  # [N, R]
    s = (summaries.sum_exp * torch.exp(summaries.max_logit - m[..., None])).sum(dim=-1)
    lse = m + torch.log(s)  # [N, R]
    draft_logit = summaries.draft_logit.amax(dim=-1)[:, :gamma]  # [N, γ]
    best_tile = summaries.best_score.argmax(dim=-1, keepdim=True)  # lowest tile on ties
    best_index = summaries.best_index.gather(-1, best_tile).squeeze(-1)  # [N, R]
    best_logit = summaries.best_logit.gather(-1, best_tile).squeeze(-1)  # [N, R]

    draft_logprob = draft_logit - lse[:, :gamma]  # [N, γ]
    u = acceptance_uniform(seed, positions, gamma)  # [N, γ]
    greedy = (temperature == 0)[:, None]
    accept = torch.where(
        greedy, draft_tokens == best_index[:, :gamma], u <= torch.exp(draft_logprob)
    )

    num_accepted = count_accepted(accept)
    tokens = select_emitted(num_accepted, draft_tokens, best_index, fill=-1)
    logprobs = None
    if return_logprobs:
        logprobs = select_emitted(num_accepted, draft_logprob, best_logit - lse, fill=0.0)
    return VerifyResult(tokens, num_accepted + 1, logprobs)


def count_accepted(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading accepted drafts: ``accept [N, γ] bool`` -> ``[N] int64`` in 0..γ."""
    return accept.long().cumprod(dim=1).sum(dim=1)


def select_emitted(
    num_accepted: torch.Tensor,
    draft_values: torch.Tensor,
    candidate_values: torch.Tensor,
    fill: float,
) -> torch.Tensor:
    """Lay out what a step emits: drafts while accepted, then the candidate of the first
    rejected row (or the bonus row γ), then ``fill``.

    Shapes: num_accepted [N], draft_values [N, γ], candidate_values [N, γ + 1] -> [N, γ + 1].
    """
    gamma = draft_values.shape[1]
    col = torch.arange(gamma + 1, device=draft_values.device)[None, :]  # [1, γ + 1]
    k = num_accepted[:, None]  # [N, 1]
    padded = torch.cat([draft_values, candidate_values[:, gamma:]], dim=1)  # [N, γ + 1]
    out = torch.where(col < k, padded, torch.full_like(padded, fill))
    return torch.where(col == k, candidate_values, out)


def verify_resample(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    *,
    return_logprobs: bool = False,
    block_v: int = DEFAULT_BLOCK_V,
) -> VerifyResult:
    """Verify γ greedy drafts per sequence and emit the next tokens (tiled reference).

    Parameters
    ----------
    hidden : [N, γ + 1, H] float32 / bfloat16 / float16
    lm_head : [V, H], same dtype as ``hidden``
    draft_tokens : [N, γ] int64, ids in [0, vocab_size)
    temperature : [N] float32, >= 0 (0: greedy target)
    seed : [N] int64, >= 0
    positions : [N] int64, absolute position of row 0 (keys the noise)
    vocab_size : logical vocabulary; LM-head rows >= vocab_size are padding
    return_logprobs : also return the target log-probabilities of the emitted tokens
    block_v : vocabulary tile size (tokens do not depend on it)

    Returns
    -------
    VerifyResult(tokens [N, γ + 1] int64, num_emitted [N] int64, logprobs [N, γ + 1] or None)
    """
    summaries = tile_summaries(
        hidden, lm_head, draft_tokens, temperature, seed, positions, vocab_size, block_v
    )
    return finalize(summaries, draft_tokens, temperature, seed, positions, return_logprobs)
