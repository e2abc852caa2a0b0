"""Reference ``VerifyResample``: verify γ greedy drafts and emit the next tokens in one pass.

Terms (per sequence n and draft position i = 0..γ, row i at absolute position ``p + i``):

- row i of ``hidden`` is the target state after the prefix and the drafts ``d[:i]``;
- ``l_i = hidden_i · lm_headᵀ / T`` (fp32 accumulation; ``T = 0`` means greedy and uses the
  raw dot products; so does any ``T < GREEDY_BELOW``);
- ``y_i`` is the position's one sample (``block_samples``), keyed by (seed, p + i); greedy:
  ``y_i = argmax_v l_i,v``, lowest id on ties;
- the draft ``x = d_i`` (i < γ) is accepted iff ``y_i == x``; at the first rejection ``y_i`` is
  emitted; when every draft is accepted, row γ emits the bonus ``y_γ``. So the step emits
  ``y_0 .. y_k`` with ``k`` the number of leading accepted drafts;
- ``LSE_i = log Σ_v exp(l_i,v)`` is formed only for log-probabilities (``l_i(y_i) - LSE_i``);
- non-finite logits (``nonfinite``): a NaN logit counts as ``-inf``; a row with a ``+inf`` logit
  or without any logit above ``-inf`` has a NaN log-probability.

The sample is two-level. The vocabulary is cut into blocks of ``SAMPLE_BLOCK`` ids (block ``b``:
ids ``64 b .. 64 b + 63``, past ``V`` as ``-inf``). A block's score is
``s_b = M_b + log S_b + g_b`` (``M_b`` its max logit, ``S_b = Σ exp(l_v - M_b)``, ``g_b =
gumbel(seed, p + i, b, STREAM_GUMBEL)``); the row's block is ``b* = argmax_b s_b`` (lowest on
ties) and its id the inverse CDF of ``b*``'s running sums at ``u = uniform(seed, p + i, b*,
STREAM_PICK)``. ``max_{v ∈ b} (l_v + G_v)`` of independent Gumbels is Gumbel(log Σ_b exp(l_v))
and independent of which v attains it, so the block is chosen with probability ``Σ_b p_v`` and
the id inside it with ``p_v / Σ_b p_v``: ``y_i ~ p_i = softmax(l_i)``. Per logit that is an
exp, a running sum and a compare; the hash and the logs are paid once per block. Rows that top-k
or top-p truncate (``truncated_rows``) instead take the Gumbel-max over their kept ids, ``y_i =
argmax_kept (l_v + g_v)`` with ``g_v = gumbel(seed, p + i, v, STREAM_GUMBEL)``: the kernels
gather those ids (at most ~1024) in a second stage, where noise per id is cheap and block sums
over ids in no order are not.

Why it is exact (the coupled rule, see docs/DESIGN.md): ``y_i ~ p_i``, so ``P(accept) =
P(y_i = x) = p_i(x)`` — the ``min(1, p/q)`` of a greedy draft (``q = one-hot(x)``) — and given
``y_i != x``, ``y_i`` is distributed as ``p_i`` with ``x`` removed and renormalised, the residual
``max(0, p - q)``. Rows use independent noise (keyed by position), so the chain follows the
target's autoregressive law.

What it guarantees beyond the law: the token at absolute position ``p + i`` is always that
position's own sample, so the text equals FlashSpec's non-speculative sampling (γ = 0) with the
same seed, token for token, whatever the drafter and γ — up to floating-point differences
between batched and single-row logits.

The computation mirrors the kernels: stage 1 walks vocabulary tiles (each a whole number of
blocks) and keeps per-tile summaries (the best block's score and its sampled id; with
log-probabilities also the max and sum-exp), stage 2 reduces the summaries and walks the
positions left to right. Nothing vocabulary-sized outlives a tile — except under top-k / top-p,
whose threshold the reference takes from the sorted row (``reference/truncation.py``: the mask,
top-k and top-p a serving request asks for).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from flashspec_export.reference import noise, truncation

DEFAULT_BLOCK_V = 4096
# The two-level sample's block of ids (every tile of every backend is a whole number of blocks)
# and the run of ids whose running sums are taken one after the other (``block_samples``).
SAMPLE_BLOCK = 64
SAMPLE_RUN = 16


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

    best_score: torch.Tensor  # float32, the best block score s_b over the tile (greedy: max_v l_v)
    best_index: torch.Tensor  # int64, that block's sampled id (greedy: the lowest argmax)
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


def truncated_rows(top_k, top_p, temperature: torch.Tensor) -> torch.Tensor:
    """[N] bool: the sequences top-k (k > 0) or top-p (p < 1) truncates, whose sample is the
    Gumbel-max over their kept ids (``g_v = gumbel(seed, p + i, v, STREAM_GUMBEL)``, keyed by
    vocabulary id); every other row takes the two-level sample (``block_samples``)."""
    on = torch.zeros_like(temperature, dtype=torch.bool)
    if top_k is not None:
        on |= top_k > 0
    if top_p is not None:
        on |= top_p < 1.0
    return on


def running_sums(e: torch.Tensor) -> torch.Tensor:
    """The inverse CDF's running sums of a block's weights ``e [..., SAMPLE_BLOCK]`` (fp32), in the
    one order every backend follows: inside each run of ``SAMPLE_RUN`` ids one after the other,
    then each run's sums plus the sum of the runs before it, those sums again one after the other
    (``C = P_r + c_r(j)``, ``P_0 = 0``, ``P_r = P_{r-1} + c_{r-1}(last)``). Explicit additions:
    torch's ``cumsum`` accumulates fp32 in double on the CPU."""
    runs = e.unflatten(-1, (SAMPLE_BLOCK // SAMPLE_RUN, SAMPLE_RUN)).unbind(-1)
    within = [runs[0]]
    for x in runs[1:]:
        within.append(within[-1] + x)
    c = torch.stack(within, dim=-1)  # [..., runs, SAMPLE_RUN]
    before = [torch.zeros_like(c[..., 0, -1])]
    for r in range(1, c.shape[-2]):
        before.append(before[-1] + c[..., r - 1, -1])
    return (torch.stack(before, dim=-1)[..., None] + c).flatten(-2)


def block_samples(logits: torch.Tensor, first_block: int, keys_g, keys_u):
    """Per block of ``SAMPLE_BLOCK`` ids: the block score ``s_b`` and the id its uniform picks.

    ``logits [..., B]`` (fp32, NaN as ``-inf``, ``B`` a multiple of ``SAMPLE_BLOCK``) are blocks
    ``first_block ..``; ``keys_g``, ``keys_u``: the rows' ``noise.row_keys`` on ``STREAM_GUMBEL``
    and ``STREAM_PICK``, each a pair of ``[...]`` tensors. Returns ``score [..., B / 64]``
    float32 and ``index [..., B / 64]`` int64 (global ids).

    ``M_b = max l``; ``e_v = exp(l_v - M_b)``; ``C`` the running sums of ``e`` (``running_sums``),
    ``S_b = C(63)``; ``s_b = M_b + log S_b + g_b``; the pick is the number of ``j`` with
    ``C(j) <= fl(u · S_b)`` (``u < 1``, so ``fl(u · S_b) < S_b`` and the count is at most 63;
    ``C(j) > C(j - 1)`` there, so the pick has ``e > 0``). A block of ``-inf`` only scores
    ``-inf`` and picks its first id; a block with a ``+inf`` logit scores ``+inf`` and picks its
    first ``+inf`` (so a row's lowest ``+inf`` id wins, as ``no_nan`` says).
    """
    blocks = logits.unflatten(-1, (-1, SAMPLE_BLOCK))  # [..., nb, 64]
    nb = blocks.shape[-2]
    m = blocks.amax(dim=-1)  # [..., nb]
    finite = torch.isfinite(m)
    e = torch.exp(blocks - torch.where(finite, m, 0.0)[..., None])
    e = torch.where(finite[..., None], e, 0.0)
    c = running_sums(e)
    total = c[..., -1]
    block = torch.arange(first_block, first_block + nb, device=logits.device)
    g = noise.gumbel_from_bits(noise.token_bits(keys_g[0][..., None], keys_g[1][..., None], block))
    u = noise.uniform_from_bits(noise.token_bits(keys_u[0][..., None], keys_u[1][..., None], block))
    pick = (c <= (u * total)[..., None]).sum(dim=-1)
    pick = torch.where(total > 0, pick, 0)
    posinf = blocks == float("inf")
    pick = torch.where(m == float("inf"), posinf.int().argmax(dim=-1), pick)
    score = torch.where(m == float("inf"), float("inf"), m + torch.log(total) + g)
    score = torch.where(m == float("-inf"), float("-inf"), score)
    return score, block * SAMPLE_BLOCK + pick


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
    if block_v % SAMPLE_BLOCK:
        raise ValueError(f"block_v: expected a multiple of {SAMPLE_BLOCK}, got {block_v}")
    rows = hidden.shape[1]
    hidden32 = hidden.float()  # [N, R, H]
    device = hidden.device
    row_pos = positions[:, None] + torch.arange(rows, device=device)  # [N, R]
    keys_g = noise.row_keys(seed[:, None], row_pos, noise.STREAM_GUMBEL)  # [N, R] each
    keys_u = noise.row_keys(seed[:, None], row_pos, noise.STREAM_PICK)
    scale = logit_scale(temperature)[:, None, None]  # [N, 1, 1]
    greedy = is_greedy(temperature)[:, None, None]  # [N, 1, 1]

    def masked_logits(token):  # [N, R, B]: the logits of ids `token`, -inf where not allowed
        logits = no_nan(hidden32 @ lm_head[token].float().T) / scale
        if allowed_tokens is None:
            return logits
        return torch.where(truncation.allowed_ids(allowed_tokens, token), logits, float("-inf"))

    limit = None  # the last kept (logit, id) of each row under top-k / top-p (truncation.py)
    per_id = truncated_rows(top_k, top_p, temperature)[:, None]  # [N, 1]: Gumbel-max per id
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
        padded = torch.full((*logits.shape[:-1], -(-(stop - start) // SAMPLE_BLOCK) * SAMPLE_BLOCK),
                            float("-inf"), device=device)  # fmt: skip
        padded[..., : stop - start] = logits
        score, index = block_samples(padded, start // SAMPLE_BLOCK, keys_g, keys_u)
        best_score, best_block = score.max(dim=-1)  # the lowest block on ties
        best_index = index.gather(-1, best_block[..., None]).squeeze(-1)
        if limit is not None:  # truncated rows: argmax over the kept ids of l_v + g_v
            g = noise.gumbel_from_bits(
                noise.token_bits(keys_g[0][..., None], keys_g[1][..., None], token)
            )
            kept_score, kept_arg = (logits + g).max(dim=-1)  # the lowest id on ties
            best_score = torch.where(per_id, kept_score, best_score)
            best_index = torch.where(per_id, kept_arg + start, best_index)
        greedy_score, greedy_arg = logits.max(dim=-1)  # the lowest id on ties
        best_score = torch.where(greedy[..., 0], greedy_score, best_score)
        best_index = torch.where(greedy[..., 0], greedy_arg + start, best_index)
        fields["best_score"].append(best_score)
        fields["best_index"].append(best_index)
        fields["best_logit"].append(padded.gather(-1, (best_index - start)[..., None]).squeeze(-1))
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
    block_v : vocabulary tile size, a multiple of ``SAMPLE_BLOCK`` (tokens do not depend on it)
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
