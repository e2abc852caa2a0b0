"""The target step: a Hugging Face causal LM's decoder run over T new tokens per sequence with a
static, pre-allocated KV cache, written so that ``torch.onnx.export`` captures it whole.

Rollback of rejected drafts needs no work: the caller advances ``positions`` (the cache length)
by ``num_emitted``; stale slots past it are overwritten by the next step before any query can
attend to them (the mask only admits keys at positions <= the query's).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from flashspec_export.config import ConfigError
from flashspec_export.ops import torch_ops  # noqa: F401  (registers torch.ops.flashspec)

SUPPORTED_MODEL_TYPES = ("llama", "qwen2", "qwen3")


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def check_architecture(model_type: str) -> None:
    """Refuse a Hugging Face ``model_type`` the target step does not implement."""
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ConfigError(
            f"target: unsupported architecture {model_type!r}; expected one of "
            f"{', '.join(SUPPORTED_MODEL_TYPES)}"
        )


class TargetStep(nn.Module):
    """One forward of the target over ``tokens [N, T]`` with a static KV cache.

    Parameters
    ----------
    causal_lm : a ``LlamaForCausalLM`` / ``Qwen2ForCausalLM`` / ``Qwen3ForCausalLM``; its decoder
        weights are used as they are (not copied).

    Forward
    -------
    tokens : [N, T] int64 (-1: a placeholder draft, embedded as token 0)
    positions : [N] int64, cache length of each sequence = absolute position of ``tokens[:, 0]``
    k_cache, v_cache : [L, N, KV, S, D], S = the static cache length (positions + T <= S)
    inplace : write the new slots into the given caches (the GPU runtime) instead of new ones
    fused : a ``models.fused.FusedLayers`` of this decoder: run its kernels (in place)

    Returns
    -------
    hidden : [N, T, H] after the final norm (what the LM head consumes)
    k_cache, v_cache : [L, N, KV, S, D] with slots positions .. positions + T - 1 written
    """

    def __init__(self, causal_lm: nn.Module):
        super().__init__()
        config = causal_lm.config
        check_architecture(config.model_type)
        self.decoder = causal_lm.model
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = config.num_key_value_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads

    def cache_shape(self, batch: int, max_len: int) -> tuple[int, ...]:
        """Shape of one static cache tensor for ``batch`` sequences of up to ``max_len`` tokens."""
        return (len(self.decoder.layers), batch, self.num_kv_heads, max_len, self.head_dim)

    @property
    def geometry(self) -> tuple[int, int, int]:
        """(attention heads, KV heads, head dim)."""
        return self.num_heads, self.num_kv_heads, self.head_dim

    def forward(self, tokens, positions, k_cache, v_cache, inplace=False, fused=None):
        # A -1 placeholder draft (a drafter that proposed fewer than γ, issue 35) embeds as token
        # 0. Harmless: the verify never accepts a -1, so a sequence emits at most the rows up to
        # its first placeholder, and causal attention keeps the placeholder from those rows; its
        # cache slot lies at or past the advanced position, which the next step overwrites before
        # any query attends to it. A real token's embedding keeps that slot finite, as the
        # attention over the live window needs (a masked NaN would still poison the sums).
        x = self.decoder.embed_tokens(tokens.clamp(min=0))  # [N, T, H]
        if fused is not None:
            return (
                fused.norm(fused(x, positions, k_cache, v_cache), self.decoder.norm),
                k_cache,
                v_cache,
            )
        x, k_cache, v_cache = run_layers(
            self.decoder.layers,
            self.decoder.rotary_emb,
            self.geometry,
            x,
            positions,
            k_cache,
            v_cache,
            inplace,
        )
        return self.decoder.norm(x), k_cache, v_cache


def rope(rotary: nn.Module, pos: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [N, 1, T, D] of absolute positions ``pos [N, T]`` (HF's rotary layout)."""
    freqs = pos[..., None].float() * rotary.inv_freq.float()  # [N, T, D/2]
    emb = torch.cat((freqs, freqs), dim=-1)
    scale = rotary.attention_scaling
    return (emb.cos() * scale)[:, None], (emb.sin() * scale)[:, None]


def select_rows(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[i, rows[i]]`` as [N, 1, H] for ``x`` [N, T, H] and ``rows`` [N] int64."""
    return torch.gather(x, 1, rows[:, None, None].expand(-1, 1, x.shape[-1]))


def _slots(update: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Cache slot of every element of ``update [N, KV, T, D]`` written at ``positions [N]``."""
    t = update.shape[2]
    slots = (positions[:, None] + torch.arange(t, device=positions.device))[:, None, :, None]
    return slots.expand_as(update)


@torch.library.custom_op("kvcache::write", mutates_args=())
def write_cache(cache: torch.Tensor, update: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """``cache [N, KV, S, D]`` with ``update [N, KV, T, D]`` written at slots ``positions[i]``
    .. ``positions[i] + T - 1`` of sequence i (a new tensor). The exporter turns it into ONNX
    ``TensorScatter`` (opset 24: a runtime writes the cache in place) or, for runtimes without
    it, ``ScatterElements`` (``onnx/translation.py``)."""
    return cache.scatter(2, _slots(update, positions), update)


@write_cache.register_fake
def _(cache, update, positions):
    return torch.empty_like(cache)


def _keep_slots(ctx, inputs, output):
    ctx.save_for_backward(_slots(inputs[1], inputs[2]))


def _write_cache_backward(ctx, grad):
    """The written slots' gradient goes to ``update``, the rest to ``cache`` (training)."""
    (slots,) = ctx.saved_tensors
    return grad.scatter(2, slots, 0.0), grad.gather(2, slots), None


write_cache.register_autograd(_write_cache_backward, setup_context=_keep_slots)


def live_window(positions: torch.Tensor, new_tokens: int, max_len: int) -> int:
    """Cache slots any query of this call can see: the longest sequence's length after it."""
    longest = positions.max().item()  # an unbacked size when exporting
    torch._check(longest >= 0)
    torch._check(longest + new_tokens <= max_len)
    return longest + new_tokens


def run_layers(layers, rotary, geometry, x, positions, k_cache, v_cache, inplace=False):
    """HF decoder ``layers`` over ``x [N, T, H]`` at absolute ``positions [N]`` with a static
    cache of ``len(layers)`` layers ``[N, KV, S, D]`` each; returns (x, k_cache, v_cache).

    The caches are a stacked tensor ``[L, N, KV, S, D]`` or a list of per-layer tensors (the
    exported graphs' form: one input and output per layer, which a runtime binds to one buffer
    so that ``TensorScatter`` writes in place); they are returned in the form given.
    Attention (GQA, K / V not expanded) covers the live window, the slots up to the longest
    sequence's end, so a call's cost follows the context, not ``S``.

    ``inplace``: write the new slots into the given caches (the GPU runtime's resident cache,
    captured in a CUDA graph: attention then covers all ``S`` slots behind the mask) instead of
    returning new ones (the functional form that ``torch.onnx.export`` captures)."""
    n, t, _ = x.shape
    heads, kv_heads, d = geometry
    pos = positions[:, None] + torch.arange(t, device=x.device)  # [N, T]
    cos, sin = (t.to(x.dtype) for t in rope(rotary, pos))  # as HF: in the model's dtype
    window = k_cache[0].shape[2] if inplace else live_window(positions, t, k_cache[0].shape[2])
    key_pos = torch.arange(window, device=x.device)  # [W]
    visible = (key_pos[None, None, :] <= pos[:, :, None])[:, None]  # [N, 1, T, W]
    new_k, new_v = [], []
    for i, layer in enumerate(layers):
        attn = layer.self_attn
        h = layer.input_layernorm(x)
        q = attn.q_proj(h).view(n, t, heads, d)
        k = attn.k_proj(h).view(n, t, kv_heads, d)
        v = attn.v_proj(h).view(n, t, kv_heads, d).transpose(1, 2)  # [N, KV, T, D]
        if hasattr(attn, "q_norm"):  # Qwen3: RMSNorm over each head
            q, k = attn.q_norm(q), attn.k_norm(k)
        q, k = q.transpose(1, 2), k.transpose(1, 2)  # [N, heads, T, D], [N, KV, T, D]
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        if inplace:
            slots = _slots(k, positions)  # [N, KV, T, D]
            keys = k_cache[i].scatter_(2, slots, k.to(k_cache.dtype))  # [N, KV, S, D]
            values = v_cache[i].scatter_(2, slots, v.to(v_cache.dtype))
        else:
            keys = write_cache(k_cache[i], k.to(k_cache[i].dtype), positions)
            values = write_cache(v_cache[i], v.to(v_cache[i].dtype), positions)
            new_k.append(keys)
            new_v.append(values)
        out = F.scaled_dot_product_attention(
            q,
            keys[:, :, :window].to(q.dtype),
            values[:, :, :window].to(q.dtype),
            attn_mask=visible,
            scale=attn.scaling,
            enable_gqa=True,
        )  # [N, heads, T, D]
        x = x + attn.o_proj(out.transpose(1, 2).reshape(n, t, heads * d))
        x = x + layer.mlp(layer.post_attention_layernorm(x))
    if inplace:
        return x, k_cache, v_cache
    if isinstance(k_cache, torch.Tensor):
        return x, torch.stack(new_k), torch.stack(new_v)
    return x, new_k, new_v


class SpeculativeTarget(nn.Module):
    """The exported target step: the decoder over the last accepted token and γ drafts, then
    ``flashspec.verify_resample`` over the LM head.

    Forward
    -------
    tokens : [N, γ + 1] int64 — the last accepted token, then the γ drafts (-1 past a
        sequence's last real draft: a placeholder, never accepted)
    positions : [N] int64 — cache length = absolute position of ``tokens[:, 0]``
    k_cache, v_cache : [L, N, KV, S, D]
    temperature : [N] float32 (0: greedy); seed : [N] int64
    top_k : [N] int64 (0: off), top_p : [N] float32 in (0, 1] (1: off), or None: the
        per-request truncation of ``VerifyResample`` (an export with ``--sampling-params`` has
        them as graph inputs)
    allowed_tokens : [N, γ + 1, ceil(V / 32)] int32 bit masks, or None: the tokens each row may
        emit, applied first (a grammar; an export with ``--allowed-tokens`` has it as an input)

    Returns
    -------
    emitted : [N, γ + 1] int64 (accepted drafts, the recovered / bonus token, then -1)
    num_emitted : [N] int64; logprobs : [N, γ + 1] float32 (only with ``logprobs``: without,
        the exported verify node leaves its output out, and its body and plugin skip the LSE)
    hidden : [N, γ + 1, H] (what a feature-level drafter consumes)
    k_cache, v_cache : updated; the caller advances ``positions`` by ``num_emitted``

    The noise of the token emitted at absolute position p is keyed by p: the first emitted token
    sits at ``positions + 1``.
    """

    def __init__(self, causal_lm: nn.Module, logprobs: bool = True):
        super().__init__()
        self.step = TargetStep(causal_lm)
        self.lm_head = causal_lm.lm_head.weight  # [V, H] (shared, not copied)
        self.vocab_size = causal_lm.config.vocab_size
        self.logprobs = logprobs

    def forward(
        self,
        tokens,
        positions,
        k_cache,
        v_cache,
        temperature,
        seed,
        top_k=None,
        top_p=None,
        allowed_tokens=None,
    ):
        hidden, k_cache, v_cache = self.step(tokens, positions, k_cache, v_cache)
        emitted, num_emitted, logprobs = torch.ops.flashspec.verify_resample(
            hidden,
            self.lm_head,
            tokens[:, 1:],
            temperature,
            seed,
            positions + 1,
            top_k,
            top_p,
            allowed_tokens,
            vocab_size=self.vocab_size,
        )
        if not self.logprobs:
            return emitted, num_emitted, hidden, k_cache, v_cache
        return emitted, num_emitted, logprobs, hidden, k_cache, v_cache
