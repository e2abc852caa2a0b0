"""Random but meaningful inputs for the ops: logits spread enough that drafts get accepted."""

from __future__ import annotations

import torch

from flashspec_export.ops import standard


def make_case(n, gamma, hidden_size, vocab, dtype, *, padded_vocab=None, temperature=1.0, seed=0):
    """A VerifyResample case whose drafts mix likely tokens (the target's greedy choice) and
    random ones, so acceptance, rejection and the bonus path all occur.

    Returns (hidden [N, γ+1, H], lm_head [V_pad, H], drafts [N, γ], temperature [N],
    seeds [N], positions [N], vocab_size).
    """
    g = torch.Generator().manual_seed(seed)
    padded_vocab = padded_vocab or vocab
    hidden = torch.randn(n, gamma + 1, hidden_size, generator=g)
    lm_head = torch.randn(padded_vocab, hidden_size, generator=g) * (6.0 / hidden_size**0.5)
    hidden, lm_head = hidden.to(dtype), lm_head.to(dtype)
    greedy_tokens, _ = standard.tiled_argmax(hidden.reshape(-1, hidden_size), lm_head, vocab)
    greedy_tokens = greedy_tokens.reshape(n, gamma + 1)[:, :gamma]
    random_tokens = torch.randint(0, vocab, (n, gamma), generator=g)
    use_greedy = torch.rand(n, gamma, generator=g) < 0.7
    drafts = torch.where(use_greedy, greedy_tokens, random_tokens)
    if isinstance(temperature, torch.Tensor):
        temps = temperature
    else:
        temps = torch.full((n,), float(temperature))
    seeds = torch.randint(0, 2**62, (n,), generator=g)
    positions = torch.randint(0, 10_000, (n,), generator=g)
    return hidden, lm_head, drafts, temps, seeds, positions, vocab
