"""DeepSeek-V3-style multi-token-prediction (MTP) drafter.

One MTP step combines the target's hidden state at position p with the embedding of the token
at position p + 1, ``eh_proj([enorm(embed(token)); hnorm(hidden)])``, runs one decoder layer of
the target's architecture with its own KV cache (keyed by p), and predicts the token at p + 2
with the target's final norm and LM head through ``flashspec.tiled_argmax`` (greedy drafting).

A call takes T rows at once: after a target step the runtime feeds all γ + 1 of its hidden
states with the emitted tokens (so the MTP cache holds target features for every accepted
position) and drafts from row ``last_row`` = the last accepted one; the output hidden state of
that row feeds the next call (T = 1), so one catch-up call plus γ - 1 single calls draft γ tokens.
"""

from __future__ import annotations

import functools

import torch
from torch import nn

from flashspec_export.models.target import TargetStep, run_layers, select_rows
from flashspec_export.ops import torch_ops  # noqa: F401  (registers torch.ops.flashspec)


def _norm(module: nn.Module, fused):
    """``module`` (an RMSNorm, or EAGLE's identity) as a function: one launch of ``fused``'s
    norm where it is given and the module has weights."""
    if fused is None or isinstance(module, nn.Identity):
        return module
    return functools.partial(fused.norm, module=module)


class MtpDrafter(nn.Module):
    """One MTP step.

    Parameters
    ----------
    causal_lm : the target (embeddings, rotary, final norm and LM head are shared, not copied)
    seed : random initialisation of the MTP's own weights (``load_state_dict`` to use trained ones)

    Forward
    -------
    hidden : [N, T, H] — hidden states (target or previous MTP step) at positions p .. p + T - 1
    tokens : [N, T] int64 — the tokens at positions p + 1 .. p + T
    positions : [N] int64 — p, the absolute position of ``hidden[:, 0]`` (keys the MTP cache)
    last_row : [N] int64 in [0, T) — the row to draft from
    k_cache, v_cache : [1, N, KV, S, D] — the MTP layer's own cache

    Returns
    -------
    draft : [N] int64 — the greedy draft for position p + last_row + 2; max_logit : [N] float32
    hidden : [N, 1, H] — row ``last_row`` of the output, for the next call
    k_cache, v_cache : updated at p .. p + T - 1
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

    def features(
        self, hidden, tokens, positions, last_row, k_cache, v_cache, inplace=False, fused=None
    ):
        """The MTP layer without its LM head: (normed row ``last_row`` [N, H] for the argmax,
        that row's hidden [N, 1, H], k_cache, v_cache); ``inplace`` writes the given caches,
        ``fused`` (a ``models.fused.FusedLayers`` of ``self.layers``) runs its kernels in place."""
        norm, enorm, hnorm = (_norm(m, fused) for m in (self.norm, self.enorm, self.hnorm))
        x = self.eh_proj(torch.cat([enorm(self.embed_tokens(tokens)), hnorm(hidden)], dim=-1))
        if fused is not None:
            x = fused(x, positions, k_cache, v_cache)
        else:
            x, k_cache, v_cache = run_layers(
                self.layers, self.rotary_emb, self.geometry, x, positions, k_cache, v_cache, inplace
            )
        x = select_rows(x, last_row)  # [N, 1, H]
        return norm(x)[:, 0], x, k_cache, v_cache

    def forward(self, hidden, tokens, positions, last_row, k_cache, v_cache):
        normed, x, k_cache, v_cache = self.features(
            hidden, tokens, positions, last_row, k_cache, v_cache
        )
        draft, max_logit = torch.ops.flashspec.tiled_argmax(normed, self.lm_head, self.vocab_size)
        return draft, max_logit, x, k_cache, v_cache
