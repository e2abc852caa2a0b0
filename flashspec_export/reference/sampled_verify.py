"""Reference speculative sampling for drafters that sample (general ``q``).

Leviathan et al. (2023), Algorithm 1, materialised: for each draft position i with drafted token
``x ~ q_i``, accept with probability ``min(1, p_i(x) / q_i(x))``; on the first rejection emit a
token from the residual ``max(0, p_i - q_i)`` normalised; if all γ drafts are accepted emit a
bonus token from ``p_γ``. Acceptance draws its own uniform (``STREAM_ACCEPT``) and the residual /
bonus sample uses ``STREAM_GUMBEL``. A one-hot ``q`` gives the greedy-draft op's law, not its
tokens: ``VerifyResample`` couples acceptance and recovery through one Gumbel-max sample per
position, which Leviathan's rule for a general ``q`` does not.

Categorical sampling uses the exponential race ``argmax_v w_v / E_v`` (``E_v`` the Exp(1)
variate of token v), the same event as Gumbel-max on ``log w``.
"""

from __future__ import annotations

import torch

from flashspec_export.reference import noise
from flashspec_export.reference.verify_resample import (
    VerifyResult,
    count_accepted,
    is_greedy,
    logit_scale,
)


def acceptance_uniform(seed: torch.Tensor, positions: torch.Tensor, gamma: int) -> torch.Tensor:
    """``u_i = uniform(seed, position + i, 0, STREAM_ACCEPT)`` for i < γ: [N] x2 -> [N, γ]."""
    row_pos = positions[:, None] + torch.arange(gamma, device=positions.device)
    return noise.uniform(seed[:, None], row_pos, 0, noise.STREAM_ACCEPT)


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


def exponential_race(
    weights: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor, stream: int
) -> torch.Tensor:
    """Sample ``v ∝ weights_v`` as ``argmax_v weights_v / E_v`` (first index on ties).

    Parameters
    ----------
    weights : [N, R, V] non-negative (need not be normalised)
    seed : [N] int64
    positions : [N, R] int64, the position keying each row's noise
    stream : noise stream

    Returns
    -------
    [N, R] int64 token ids
    """
    token = torch.arange(weights.shape[-1], device=weights.device)
    e = noise.exponential_from_bits(
        noise.bits(seed[:, None, None], positions[..., None], token, stream)
    )
    return (weights / e).argmax(dim=-1)


def target_probs(target_logits: torch.Tensor, temperature: torch.Tensor) -> torch.Tensor:
    """``softmax(l / T)`` in fp32; one-hot of the (lowest) argmax where ``T == 0``.

    target_logits [N, R, V], temperature [N] -> [N, R, V] float32.
    """
    logits = target_logits.float()
    probs = torch.softmax(logits / logit_scale(temperature)[:, None, None], dim=-1)
    one_hot = torch.nn.functional.one_hot(logits.argmax(dim=-1), logits.shape[-1]).float()
    return torch.where(is_greedy(temperature)[:, None, None], one_hot, probs)


def sample_draft(
    draft_probs: torch.Tensor, seed: torch.Tensor, positions: torch.Tensor
) -> torch.Tensor:
    """Draw draft tokens ``x_i ~ q_i`` from the draft noise stream.

    draft_probs [N, γ, V], seed [N], positions [N] (position of draft 0) -> [N, γ] int64.
    """
    gamma = draft_probs.shape[1]
    row_pos = positions[:, None] + torch.arange(gamma, device=positions.device)
    return exponential_race(draft_probs.float(), seed, row_pos, noise.STREAM_DRAFT)


def verify_sampled(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
) -> VerifyResult:
    """Speculative sampling with a sampling drafter (materialised reference).

    Parameters
    ----------
    target_logits : [N, γ + 1, V] target logits before temperature
    draft_probs : [N, γ, V] the drafter's distributions q_i (rows sum to 1)
    draft_tokens : [N, γ] int64, x_i drawn from q_i (so q_i(x_i) > 0)
    temperature : [N] float32 >= 0 (0: greedy target, p is the one-hot argmax)
    seed : [N] int64
    positions : [N] int64, absolute position of row 0

    Returns
    -------
    VerifyResult(tokens [N, γ + 1] int64, num_emitted [N] int64, logprobs=None)
    """
    gamma = draft_tokens.shape[1]
    p = target_probs(target_logits, temperature)  # [N, γ + 1, V]
    q = draft_probs.float()  # [N, γ, V]
    p_x = p[:, :gamma].gather(-1, draft_tokens[..., None]).squeeze(-1)  # [N, γ]
    q_x = q.gather(-1, draft_tokens[..., None]).squeeze(-1)  # [N, γ]
    u = acceptance_uniform(seed, positions, gamma)
    accept = u * q_x <= p_x  # u <= min(1, p/q), without dividing

    residual = (p[:, :gamma] - q).clamp_min(0.0)  # [N, γ, V]
    # A rejection implies positive residual mass; guard rounding by falling back to p.
    empty = residual.sum(dim=-1, keepdim=True) <= 0
    residual = torch.where(empty, p[:, :gamma], residual)
    weights = torch.cat([residual, p[:, gamma:]], dim=1)  # [N, γ + 1, V]
    row_pos = positions[:, None] + torch.arange(gamma + 1, device=positions.device)
    candidates = exponential_race(weights, seed, row_pos, noise.STREAM_GUMBEL)  # [N, γ + 1]

    num_accepted = count_accepted(accept)
    tokens = select_emitted(num_accepted, draft_tokens, candidates, fill=-1)
    return VerifyResult(tokens, num_accepted + 1)
