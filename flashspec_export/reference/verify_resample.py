"""Reference ``VerifyResample``: verify γ greedy drafts and emit the next tokens in one pass.

Terms (per sequence n and draft position i = 0..γ, row i at absolute position ``p + i``):

- row i of ``hidden`` is the target state after the prefix and the drafts ``d[:i]``;
- ``l_i = hidden_i · lm_headᵀ / T`` (fp32 accumulation; ``T = 0`` means greedy and uses the
  raw dot products; so does any ``T < GREEDY_BELOW``), ``g_i,v = gumbel(seed, p + i, v,
  STREAM_GUMBEL)``;
- ``y_i = argmax_v (l_i,v + g_i,v)``, lowest id on ties; greedy: ``y_i = argmax_v l_i,v``;
- the draft ``x = d_i`` (i < γ) is accepted iff ``y_i == x``; at the first rejection ``y_i`` is
  emitted; when every draft is accepted, row γ emits the bonus ``y_γ``. So the step emits
  ``y_0 .. y_k`` with ``k`` the number of leading accepted drafts;
- ``LSE_i = log Σ_v exp(l_i,v)`` is formed only for log-probabilities (``l_i(y_i) - LSE_i``);
- non-finite logits (``nonfinite``): a NaN logit counts as ``-inf``; a row with a ``+inf`` logit
  or without any logit above ``-inf`` has a NaN log-probability.

Why it is exact (the coupled rule, see docs/DESIGN.md): Gumbel-max makes ``y_i ~ p_i =
softmax(l_i)``, so ``P(accept) = P(y_i = x) = p_i(x)`` — the ``min(1, p/q)`` of a greedy draft
(``q = one-hot(x)``) — and given ``y_i != x``, ``y_i`` is distributed as ``p_i`` with ``x``
removed and renormalised, the residual ``max(0, p - q)``. Rows use independent noise (keyed by
position), so the chain follows the target's autoregressive law.

What it guarantees beyond the law: the token at absolute position ``p + i`` is always
``argmax(l + g)`` of that position's own noise, so the text equals FlashSpec's non-speculative
sampling (γ = 0) with the same seed, token for token, whatever the drafter and γ — up to
floating-point differences between batched and single-row logits.

The computation mirrors the kernels: stage 1 walks vocabulary tiles and keeps per-tile summaries
(the best noisy candidate; with log-probabilities also the max and sum-exp), stage 2 reduces the
summaries and walks the positions left to right. Nothing vocabulary-sized outlives a tile — except
under top-k / top-p, whose threshold the reference takes from the sorted row
(``reference/truncation.py``: the mask, top-k and top-p a serving request asks for).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashspec_export.reference import noise, truncation

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
    """Stage-1 output, one entry per (sequence, row, vocabulary tile): [N, γ + 1, tiles].

    ``max_logit`` and ``sum_exp`` exist only when log-probabilities are requested (else None).
    """

    best_score: torch.Tensor  # float32, max_v (l_v + g_v) over the tile (greedy: max_v l_v)
    best_index: torch.Tensor  # int64, global token id of best_score (lowest on ties)
    best_logit: torch.Tensor  # float32, l at best_index (for log-probabilities)
    max_logit: torch.Tensor | None = None  # float32, max_v l_v over the tile
    sum_exp: torch.Tensor | None = None  # float32, Σ_v exp(l_v - max_logit) over the tile


def no_nan(logits: torch.Tensor) -> torch.Tensor:
    """``logits`` with every NaN as ``-inf``: the one rule for non-finite logits, in every op and
    backend (docs/DESIGN.md, "Non-finite logits"). A NaN (a NaN weight or hidden state, ``inf ·
    0``) gives its token probability zero: it is never sampled, never the argmax and adds nothing
    to the LSE. ``±inf`` keep IEEE order: a ``+inf`` logit wins (lowest id among several), and a
    row of ``-inf`` only (NaN included) emits its lowest id."""
    return torch.where(torch.isnan(logits), float("-inf"), logits)


# Temperatures below this are greedy, in every backend (as serving stacks treat them): dividing
# by a tiny T would overflow the logits to ±inf (T = 1e-38 made token 0 win, NaN log-probabilities).
# Compared in fp32 (the temperatures' type), so every backend draws the same line.
GREEDY_BELOW = 1e-5


def is_greedy(temperature: torch.Tensor) -> torch.Tensor:
    """Rows whose target is greedy: ``T < GREEDY_BELOW`` (0 included)."""
    return temperature < GREEDY_BELOW


def logit_scale(temperature: torch.Tensor) -> torch.Tensor:
    """Divisor of the dot products: ``T``, or 1 for greedy rows (``T < GREEDY_BELOW``)."""
    return torch.where(is_greedy(temperature), torch.ones_like(temperature), temperature)


def tile_summaries(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    block_v: int,
    return_logprobs: bool,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    allowed_tokens: torch.Tensor | None = None,
) -> TileSummaries:
    """Stage 1: per-tile summaries. Shapes as in ``verify_resample``; the drafts are not read."""
    rows = hidden.shape[1]
    hidden32 = hidden.float()  # [N, R, H]
    device = hidden.device
    row_pos = positions[:, None] + torch.arange(rows, device=device)  # [N, R]
    a, b = noise.row_keys(seed[:, None], row_pos, noise.STREAM_GUMBEL)  # [N, R] each
    scale = logit_scale(temperature)[:, None, None]  # [N, 1, 1]
    greedy = is_greedy(temperature)[:, None, None]  # [N, 1, 1]

    def masked_logits(token):  # [N, R, B]: the logits of ids `token`, -inf where not allowed
        logits = no_nan(hidden32 @ lm_head[token].float().T) / scale
        if allowed_tokens is None:
            return logits
        return torch.where(truncation.allowed_ids(allowed_tokens, token), logits, float("-inf"))

    limit = None  # the last kept (logit, id) of each row under top-k / top-p (truncation.py)
    row = None  # the whole row's logits, which the tiles then slice when truncating
    if top_k is not None or top_p is not None:
        # One product for the threshold and the tiles: on CUDA a tile's product may round
        # differently from the row's (another GEMM kernel), and a token compared against a
        # threshold of other rounding could drop out of its own kept set.
        row = masked_logits(torch.arange(vocab_size, device=device))
        limit = truncation.threshold(row, top_k, top_p)

    fields = {name: [] for name in TileSummaries._fields}
    for start in range(0, vocab_size, block_v):
        stop = min(start + block_v, vocab_size)
        token = torch.arange(start, stop, device=device)  # [B]
        logits = masked_logits(token) if row is None else row[..., start:stop]  # [N, R, B]
        if limit is not None:
            logits = torch.where(truncation.kept(logits, token, limit), logits, float("-inf"))
        g = noise.gumbel_from_bits(noise.token_bits(a[..., None], b[..., None], token))
        score = torch.where(greedy, logits, logits + g)  # [N, R, B]
        best_score, best_arg = score.max(dim=-1)  # first occurrence on ties
        fields["best_score"].append(best_score)
        fields["best_index"].append(best_arg + start)
        fields["best_logit"].append(logits.gather(-1, best_arg[..., None]).squeeze(-1))
        if return_logprobs:
            tile_max = logits.amax(dim=-1)
            fields["max_logit"].append(tile_max)
            # a tile of -inf logits sums to 0 (exp(-inf - -inf) would be NaN)
            shift = torch.where(tile_max == float("-inf"), 0.0, tile_max)
            fields["sum_exp"].append(torch.exp(logits - shift[..., None]).sum(dim=-1))
    return TileSummaries(**{k: torch.stack(v, dim=-1) for k, v in fields.items() if v})


def finalize(
    summaries: TileSummaries, draft_tokens: torch.Tensor, return_logprobs: bool
) -> VerifyResult:
    """Stage 2: reduce the tiles, accept drafts left to right (``x == y``), emit ``y_0 .. y_k``."""
    gamma = draft_tokens.shape[1]
    best_tile = summaries.best_score.argmax(dim=-1, keepdim=True)  # lowest tile on ties
    y = summaries.best_index.gather(-1, best_tile).squeeze(-1)  # [N, R]
    num_accepted = count_accepted(draft_tokens == y[:, :gamma])  # [N]
    emitted = torch.arange(gamma + 1, device=y.device)[None, :] <= num_accepted[:, None]
    tokens = torch.where(emitted, y, -1)  # accepted drafts equal y: y_0 .. y_k, then -1
    logprobs = None
    if return_logprobs:
        m = summaries.max_logit.amax(dim=-1)  # [N, R]
        s = (summaries.sum_exp * torch.exp(summaries.max_logit - m[..., None])).sum(dim=-1)
        best_logit = summaries.best_logit.gather(-1, best_tile).squeeze(-1)  # [N, R]
        logprobs = torch.where(emitted, best_logit - (m + torch.log(s)), 0.0)
    return VerifyResult(tokens, num_accepted + 1, logprobs)


def count_accepted(accept: torch.Tensor) -> torch.Tensor:
    """Number of leading accepted drafts: ``accept [N, γ] bool`` -> ``[N] int64`` in 0..γ."""
    return accept.long().cumprod(dim=1).sum(dim=1)


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
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    allowed_tokens: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify γ greedy drafts per sequence and emit the next tokens (tiled reference).

    Parameters
    ----------
    hidden : [N, γ + 1, H] float32 / bfloat16 / float16
    lm_head : [V, H], same dtype as ``hidden``
    draft_tokens : [N, γ] int64, ids in [0, vocab_size); -1 from some position on: the sequence
        proposed fewer drafts (it stops at its first -1 and emits that row's sample)
    temperature : [N] float32, >= 0 (below GREEDY_BELOW: greedy target)
    seed : [N] int64, >= 0
    positions : [N] int64, absolute position of row 0 (keys the noise)
    vocab_size : logical vocabulary; LM-head rows >= vocab_size are padding
    return_logprobs : also return the target log-probabilities of the emitted tokens
    block_v : vocabulary tile size (tokens do not depend on it)
    top_k : [N] int64 (0: off), or None; top_p : [N] float32 in (0, 1] (1: off), or None;
    allowed_tokens : [N, γ + 1, ceil(vocab_size / 32)] int32 bit masks, or None — the
        truncation of ``reference/truncation.py``; the log-probabilities are then those of the
        truncated, renormalised distribution the tokens are drawn from

    Returns
    -------
    VerifyResult(tokens [N, γ + 1] int64, num_emitted [N] int64, logprobs [N, γ + 1] or None)
    """
    summaries = tile_summaries(
        hidden,
        lm_head,
        temperature,
        seed,
        positions,
        vocab_size,
        block_v,
        return_logprobs,
        top_k,
        top_p,
        allowed_tokens,
    )
    return finalize(summaries, draft_tokens, return_logprobs)
