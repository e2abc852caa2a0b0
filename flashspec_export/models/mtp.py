"""DeepSeek-V3-style multi-token-prediction (MTP) drafter.

One MTP step combines the target's hidden state at position p with the embedding of the token
at position p + 1, ``eh_proj([enorm(embed(token)); hnorm(hidden)])``, runs one decoder layer of
the target's architecture with its own KV cache, and predicts the token at p + 2 with the
target's final norm and LM head through ``flashspec.tiled_argmax`` (greedy drafting). Its output
hidden state feeds the next MTP step, so γ calls draft γ tokens.
"""

from __future__ import annotations

import torch
from torch import nn

from flashspec_export.models.target import TargetStep, run_layers
from flashspec_export.ops import torch_ops  # noqa: F401  (registers torch.ops.flashspec)


class MtpDrafter(nn.Module):
    """One MTP step.

    Parameters
    ----------
    causal_lm : the target (embeddings, rotary, final norm and LM head are shared, not copied)
    seed : random initialisation of the MTP's own weights (``load_state_dict`` to use trained ones)

    Forward
    -------
    hidden : [N, 1, H] — the previous hidden state (target or previous MTP step) at position p
    tokens : [N, 1] int64 — the token at position p + 1
    positions : [N] int64 — p + 1, the absolute position of ``tokens`` (keys the MTP cache)
    k_cache, v_cache : [1, N, KV, S, D] — the MTP layer's own cache

    Returns
    -------
    draft : [N] int64 — the greedy draft for position p + 2; max_logit : [N] float32
    hidden : [N, 1, H] — for the next MTP step; k_cache, v_cache : updated
    """

    def __init__(self, causal_lm: nn.Module, seed: int = 0):
        super().__init__()
        target = TargetStep(causal_lm)  # validates the architecture
        config = causal_lm.config
        decoder = causal_lm.model
        self.geometry = target.geometry
        self.embed_tokens = decoder.embed_tokens
        self.rotary_emb = decoder.rotary_emb
        self.norm = decoder.norm
        self.lm_head = causal_lm.lm_head.weight  # [V, H]
        self.vocab_size = config.vocab_size
        generator_state = torch.random.get_rng_state()
        torch.manual_seed(seed)
        norm_cls = type(decoder.norm)
        self.enorm = norm_cls(config.hidden_size, eps=config.rms_norm_eps)
        self.hnorm = norm_cls(config.hidden_size, eps=config.rms_norm_eps)
        self.eh_proj = nn.Linear(2 * config.hidden_size, config.hidden_size, bias=False)
        self.layers = nn.ModuleList([type(decoder.layers[0])(config, layer_idx=0)])
        torch.random.set_rng_state(generator_state)

    def cache_shape(self, batch: int, max_len: int) -> tuple[int, ...]:
        _, kv_heads, head_dim = self.geometry
        return (1, batch, kv_heads, max_len, head_dim)

    def forward(self, hidden, tokens, positions, k_cache, v_cache):
        combined = torch.cat([self.enorm(self.embed_tokens(tokens)), self.hnorm(hidden)], dim=-1)
        x = self.eh_proj(combined)  # [N, 1, H]
        x, k_cache, v_cache = run_layers(
            self.layers, self.rotary_emb, self.geometry, x, positions, k_cache, v_cache
        )
        draft, max_logit = torch.ops.flashspec.tiled_argmax(
            self.norm(x)[:, -1], self.lm_head, self.vocab_size
        )
        return draft, max_logit, x, k_cache, v_cache
