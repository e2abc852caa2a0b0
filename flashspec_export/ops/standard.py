"""The materialised ("standard") path, the way common serving stacks verify drafts.

logits [N, γ + 1, V] -> softmax probabilities -> exponential-race sample per row (``argmax_v
p_v / E_v``, the same event as Gumbel-max on the logits) -> accept the drafts that equal it ->
emitted tokens. Every intermediate is vocabulary-sized and written to memory. It is written
independently of the tiled reference (probabilities, not noisy logits) and is the oracle the
tiled paths are checked against; its counter-based noise costs dozens of elementwise kernels, so
it is no speed baseline (``scripts/bench_kernels.py`` times the samplers users would run).
"""

from __future__ import annotations

import torch

from flashspec_export.reference import noise
from flashspec_export.reference.sampled_verify import exponential_race
from flashspec_export.reference.verify_resample import (
    VerifyResult,
    count_accepted,
    is_greedy,
    logit_scale,
    no_nan,
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
    greedy = is_greedy(temperature)  # [N]
    logits = no_nan(hidden.float() @ lm_head[:vocab_size].float().T)  # [N, γ + 1, V]
    logits = logits / logit_scale(temperature)[:, None, None]
    probs = torch.softmax(logits, dim=-1)  # [N, γ + 1, V]
    row_pos = positions[:, None] + torch.arange(gamma + 1, device=positions.device)
    sampled = exponential_race(probs, seed, row_pos, noise.STREAM_GUMBEL)  # [N, γ + 1]
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


def tiled_argmax(hidden, lm_head, vocab_size) -> tuple[torch.Tensor, torch.Tensor]:
    """Materialised greedy drafting: full logits [N, V], then argmax."""
    logits = no_nan(hidden.float() @ lm_head[:vocab_size].float().T)  # [N, V]
    max_logit, token = logits.max(dim=-1)
    return token, max_logit
