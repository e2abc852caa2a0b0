"""The truncation a serving request asks of the target distribution: an allowed-token mask (a
grammar), top-k and top-p — the specification every backend's ``VerifyResample`` follows.

Per row (sequence n, draft position i), on the logits ``l = dot / T`` (T = 1 for greedy rows)
with NaN as -inf (``verify_resample.no_nan``):

1. ``allowed_tokens [N, γ + 1, ceil(V / 32)]`` int32, applied first: bit j of word w allows token
   32·w + j; every other token's logit becomes -inf;
2. ``top_k [N]`` (0: off): the k largest logits of the row, ties broken by the lower id;
3. ``top_p [N]`` in (0, 1] (1: off), on the distribution renormalised over what is left: tokens
   in descending probability (ties by lower id), each kept while the mass strictly before it is
   below p (the top token is always kept).

What is kept is a prefix of one order — descending logit, then ascending id — so it is described
by the last kept entry, a threshold pair ``(logit, id)``: a token is kept iff its logit is above
the threshold logit, or equal to it with an id no higher. The sample is then the Gumbel-max over
the kept tokens, ``y = argmax_kept (l_v + g_v)``, and the law of the emitted tokens is the
truncated, renormalised target's. The reference takes the threshold from the sorted row (fp32,
the mass summed in descending order); the kernels take it from a bounded candidate set.
"""

from __future__ import annotations

import torch

WORD_BITS = 32


def words_for(vocab_size: int) -> int:
    """int32 words of an allowed-token mask row: ceil(V / 32)."""
    return -(-vocab_size // WORD_BITS)


def allowed_ids(allowed_tokens: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
    """[N, R, len(ids)] bool: bit ``id % 32`` of word ``id // 32`` of each row's mask."""
    words = allowed_tokens[..., ids // WORD_BITS]  # [N, R, B] int32
    return ((words >> (ids % WORD_BITS).to(words.dtype)) & 1).bool()


def pack_allowed(allowed: torch.Tensor) -> torch.Tensor:
    """``allowed [..., V]`` bool as the op's mask, ``[..., ceil(V / 32)]`` int32: bit j of word w
    is ``allowed[32·w + j]`` (the bits past V are clear); ``allowed_ids`` reads it back."""
    vocab = allowed.shape[-1]
    padded = torch.zeros(*allowed.shape[:-1], words_for(vocab) * WORD_BITS, dtype=torch.int64)
    padded[..., :vocab] = allowed.to(torch.int64)
    bits = padded.unflatten(-1, (-1, WORD_BITS)) << torch.arange(WORD_BITS)  # [..., W, 32]
    words = bits.sum(dim=-1)  # [..., W] in [0, 2^32): the int32 of the same bits
    return torch.where(words >= 2**31, words - 2**32, words).to(torch.int32)


def threshold(
    logits: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The last kept (logit, id) of each row of ``logits [N, R, V]`` (masked already, fp32):
    ``[N, R]`` float32 and int64. ``top_k [N]`` int64 (0: off) and ``top_p [N]`` float32
    (1: off), either None for off."""
    vocab = logits.shape[-1]
    values, ids = torch.sort(logits, dim=-1, descending=True, stable=True)  # ties: lower id first
    rank = torch.arange(vocab, device=logits.device)
    keep = values > float("-inf")  # the masked-out tokens are never kept
    if top_k is not None:
        k = torch.where(top_k > 0, top_k, vocab)[:, None, None]
        keep &= rank < k
    if top_p is not None:
        probs = torch.softmax(torch.where(keep, values, float("-inf")), dim=-1)
        before = torch.cumsum(probs, dim=-1) - probs  # the mass strictly before each token
        p = top_p[:, None, None]
        keep &= (p >= 1.0) | (before < p)
    last = (keep.sum(dim=-1) - 1).clamp(min=0)[..., None]  # the top token is always kept
    return values.gather(-1, last).squeeze(-1), ids.gather(-1, last).squeeze(-1)


def kept(
    logits: torch.Tensor, ids: torch.Tensor, limit: tuple[torch.Tensor, torch.Tensor]
) -> torch.Tensor:
    """[N, R, B] bool: the tokens ``ids [B]`` with ``logits [N, R, B]`` at or before the
    threshold pair ``limit`` ([N, R] each) in (descending logit, ascending id) order."""
    logit, last = (t[..., None] for t in limit)
    return (logits > logit) | ((logits == logit) & (ids <= last))
