"""The materialised ("standard") path, the way common serving stacks verify drafts.

logits [N, γ + 1, V] -> softmax probabilities -> the two-level sample per row (an exponential
race over the blocks' probabilities, ``argmax_b P_b / E_b``, the same event as the reference's
Gumbel-max over block scores; then the inverse CDF of the chosen block's probabilities; rows
that top-k / top-p truncate: an exponential race over their kept ids' probabilities) -> accept
the drafts that equal it -> emitted tokens. Every intermediate is vocabulary-sized and written
to memory. It is written independently of the tiled reference (probabilities, not logits) and
is the oracle the tiled paths are checked against; its counter-based noise costs dozens of
elementwise kernels, so it is no speed baseline (``scripts/bench_kernels.py`` times the samplers
users would run).
"""

from __future__ import annotations

import torch

from flashspec_export.reference import noise
from flashspec_export.reference.sampled_verify import exponential_race
from flashspec_export.reference.verify_resample import (
    SAMPLE_BLOCK,
    VerifyResult,
    count_accepted,
    is_greedy,
    logit_scale,
    no_nan,
    truncated_rows,
)


def verify_resample(
    hidden,
    lm_head,
    draft_tokens,
    temperature,
    seed,
    positions,
    vocab_size,
    *,
    return_logprobs=False,
    top_k=None,
    top_p=None,
    allowed_tokens=None,
    race=exponential_race,
) -> VerifyResult:
    """Materialised ``VerifyResample``; arguments as ``reference.verify_resample``. ``race``: the
    exponential race of the truncated rows (``reference.sampled_verify.exponential_race``'s
    signature; the Triton backend's recompute passes ``kernels.noise.exponential_race``, one
    launch with the same bits on a GPU)."""
    gamma = draft_tokens.shape[1]
    greedy = is_greedy(temperature)  # [N]
    logits = no_nan(hidden.float() @ lm_head[:vocab_size].float().T)  # [N, γ + 1, V]
    logits = logits / logit_scale(temperature)[:, None, None]
    logits = _truncated(logits, top_k, top_p, allowed_tokens)
    probs = torch.softmax(logits, dim=-1)  # [N, γ + 1, V]
    row_pos = positions[:, None] + torch.arange(gamma + 1, device=positions.device)
    per_id = truncated_rows(top_k, top_p, temperature)  # top-k / top-p sequences
    if bool(per_id.all()):  # no two-level sample to take
        sampled = race(probs, seed, row_pos, noise.STREAM_GUMBEL)  # keyed by id
    else:
        sampled = _two_level_sample(probs, seed, row_pos)  # [N, γ + 1]
        if bool(per_id.any()):
            by_id = race(probs, seed, row_pos, noise.STREAM_GUMBEL)
            sampled = torch.where(per_id[:, None], by_id, sampled)
    # Where softmax is undefined (a +inf logit, or none above -inf) the sample is the argmax:
    # the lowest +inf id, or the lowest id of a row of -inf (no_nan's rule).
    undefined = (logits == float("inf")).any(dim=-1) | (logits == float("-inf")).all(dim=-1)
    y = torch.where(greedy[:, None] | undefined, logits.argmax(dim=-1), sampled)  # [N, γ + 1]

    num_accepted = count_accepted(draft_tokens == y[:, :gamma])
    col = torch.arange(gamma + 1, device=y.device)[None, :]
    tokens = torch.where(col <= num_accepted[:, None], y, -1)
    logprobs = None
    if return_logprobs:
        log_probs = torch.log_softmax(logits, dim=-1)
        emitted = log_probs.gather(-1, tokens.clamp_min(0)[..., None]).squeeze(-1)
        logprobs = torch.where(tokens >= 0, emitted, 0.0)
    return VerifyResult(tokens, num_accepted + 1, logprobs)


def _two_level_sample(probs, seed, row_pos):
    """``y ~ probs [N, R, V]``: the block of ``SAMPLE_BLOCK`` ids by an exponential race over the
    blocks' masses (``STREAM_GUMBEL``, token id = block), the id inside it by the inverse CDF of
    its probabilities at ``uniform(seed, position, block, STREAM_PICK)``."""
    vocab = probs.shape[-1]
    padded = torch.nn.functional.pad(probs, (0, -vocab % SAMPLE_BLOCK))
    blocks = padded.unflatten(-1, (-1, SAMPLE_BLOCK))  # [N, R, nb, 64]
    block = exponential_race(blocks.sum(dim=-1), seed, row_pos, noise.STREAM_GUMBEL)  # [N, R]
    chosen = blocks.gather(2, block[..., None, None].expand(-1, -1, 1, SAMPLE_BLOCK))[:, :, 0]
    u = noise.uniform(seed[:, None], row_pos, block, noise.STREAM_PICK)  # [N, R]
    cdf = chosen.cumsum(dim=-1)
    pick = (cdf <= (u * cdf[..., -1])[..., None]).sum(dim=-1).clamp(max=SAMPLE_BLOCK - 1)
    return block * SAMPLE_BLOCK + pick


def _truncated(logits, top_k, top_p, allowed_tokens):
    """``logits [N, R, V]`` with -inf outside what the request keeps: the allowed tokens (bit
    ``v % 32`` of word ``v // 32``), then the top-k, then the top-p nucleus of the renormalised
    rest, in the row sorted once (descending, ties by lower id) and scattered back."""
    vocab = logits.shape[-1]
    if allowed_tokens is not None:
        ids = torch.arange(vocab, device=logits.device)
        bits = (allowed_tokens[..., ids // 32] >> (ids % 32).to(torch.int32)) & 1
        logits = logits.masked_fill(bits == 0, float("-inf"))
    if top_k is None and top_p is None:
        return logits
    ordered, order = logits.sort(dim=-1, descending=True, stable=True)
    keep = torch.ones_like(ordered, dtype=torch.bool)
    if top_k is not None:
        rank = torch.arange(vocab, device=logits.device)
        keep &= (top_k[:, None, None] == 0) | (rank < top_k[:, None, None])
    if top_p is not None:
        probs = ordered.masked_fill(~keep, float("-inf")).softmax(dim=-1)
        mass_before = probs.cumsum(dim=-1) - probs
        keep &= (top_p[:, None, None] >= 1.0) | (mass_before < top_p[:, None, None])
        keep[..., 0] = True
    dropped = torch.zeros_like(keep).scatter_(-1, order, ~keep)
    return logits.masked_fill(dropped, float("-inf"))


def tiled_argmax(hidden, lm_head, vocab_size) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised greedy drafting: full logits [N, V], then argmax."""
    logits = no_nan(hidden.float() @ lm_head[:vocab_size].float().T)  # [N, V]
    max_logit, token = logits.max(dim=-1)
    return token, max_logit
