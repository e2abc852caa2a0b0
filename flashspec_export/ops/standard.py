"""The materialised ("standard") path, the way common serving stacks verify drafts.

logits [N, γ + 1, V] -> softmax probabilities -> gather p(x) -> accept -> residual
(p with the draft removed) -> exponential-race sample -> emitted tokens. Every intermediate is
vocabulary-sized and written to memory. It is the benchmark baseline and, being written
independently of the tiled reference, the oracle the tiled paths are checked against.
"""

from __future__ import annotations

import torch

from flashspec_export.reference import noise
from flashspec_export.reference.sampled_verify import exponential_race
from flashspec_export.reference.verify_resample import (
    VerifyResult,
    acceptance_uniform,
    count_accepted,
    logit_scale,
    select_emitted,
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
) -> VerifyResult:
    """Materialised ``VerifyResample``; arguments as ``reference.verify_resample``."""
    gamma = draft_tokens.shape[1]
    greedy = temperature == 0  # [N]
    logits = hidden.float() @ lm_head[:vocab_size].float().T  # [N, γ + 1, V]
    logits = logits / logit_scale(temperature)[:, None, None]
    probs = torch.softmax(logits, dim=-1)  # [N, γ + 1, V]
    argmax = logits.argmax(dim=-1)  # [N, γ + 1]

    p_x = probs[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [N, γ]
    u = acceptance_uniform(seed, positions, gamma)
    accept = torch.where(greedy[:, None], draft_tokens == argmax[:, :gamma], u <= p_x)

    # max(0, p - q) for a one-hot q: p with the drafted token removed.
    residual = probs[:, :gamma].scatter(-1, draft_tokens[..., None], 0.0)  # [N, γ, V]
    weights = torch.cat([residual, probs[:, gamma:]], dim=1)  # [N, γ + 1, V]
    row_pos = positions[:, None] + torch.arange(gamma + 1, device=positions.device)
    sampled = exponential_race(weights, seed, row_pos, noise.STREAM_GUMBEL)
    candidates = torch.where(greedy[:, None], argmax, sampled)  # [N, γ + 1]

    num_accepted = count_accepted(accept)
    tokens = select_emitted(num_accepted, draft_tokens, candidates, fill=-1)
    logprobs = None
    if return_logprobs:
        log_probs = torch.log_softmax(logits, dim=-1)
        emitted = log_probs.gather(-1, tokens.clamp_min(0)[..., None]).squeeze(-1)
        logprobs = torch.where(tokens >= 0, emitted, 0.0)
    return VerifyResult(tokens, num_accepted + 1, logprobs)


def tiled_argmax(hidden, lm_head, vocab_size) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised greedy drafting: full logits [N, V], then argmax."""
    logits = hidden.float() @ lm_head[:vocab_size].float().T  # [N, V]
    max_logit, token = logits.max(dim=-1)
    return token, max_logit
