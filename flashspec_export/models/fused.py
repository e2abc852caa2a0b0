"""The decoder layers of the GPU decode path: ``run_layers(..., inplace=True)`` in nine launches
per layer (``kernels/decoder.py``) instead of ~40 PyTorch ops.

Per layer: one packed q / k / v matmul, RoPE writing k and v into the static cache in place,
attention over each sequence's live prefix only (GQA, the cache never copied or expanded), o
projection, the residual add fused with the next RMSNorm, one packed gate / up matmul, SiLU·mul,
down projection. The packed weights are views: the modules' own q / k / v and gate / up weights
are re-pointed into them (same values, no second copy), so the model stays usable as it was.

``run_layers`` (PyTorch) is the reference and the exported graph's form:
``tests/parity/test_fused_decoder.py`` checks the layers against it and the device loop's
tokens against the host loop's.
"""

from __future__ import annotations

import weakref

import torch
import torch.nn.functional as F
from torch import nn

from flashspec_export.kernels import decoder
from flashspec_export.models.target import rope

# per layer module: (qkv weight, qkv bias, gate-up weight, gate-up bias, qk-norm weights or None)
_PACKED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _pack(modules: list[nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for ``modules`` side by side; theirs become views into it."""
    weight = torch.cat([m.weight.detach() for m in modules])
    biases = [m.bias for m in modules]
    bias = None if biases[0] is None else torch.cat([b.detach() for b in biases])
    row = 0
    for m in modules:
        rows = m.weight.shape[0]
        m.weight.data = weight[row : row + rows]
        if bias is not None:
            m.bias.data = bias[row : row + rows]
        row += rows
    return weight, bias


def _packed(layer: nn.Module):
    if layer not in _PACKED:
        attn, mlp = layer.self_attn, layer.mlp
        probe = torch.linspace(-4, 4, 9)
        if not torch.allclose(mlp.act_fn(probe), F.silu(probe)):
            raise ValueError(f"fused layers: SiLU MLPs only, got {type(mlp.act_fn).__name__}")
        qkv = _pack([attn.q_proj, attn.k_proj, attn.v_proj])
        gate_up = _pack([mlp.gate_proj, mlp.up_proj])
        qk_norm = None
        if hasattr(attn, "q_norm"):  # Qwen3
            weights = torch.stack([attn.q_norm.weight.detach(), attn.k_norm.weight.detach()])
            qk_norm = (weights, attn.q_norm.variance_epsilon)
        _PACKED[layer] = (*qkv, *gate_up, qk_norm)
    return _PACKED[layer]


class FusedLayers:
    """``run_layers(layers, rotary, geometry, x, positions, k_cache, v_cache, inplace=True)``
    with the Triton kernels; caches [L, N, KV, S, D] (or a list of [N, KV, S, D]), written in
    place. ``splits``: flash-decoding splits of the attention (None: from the cache length and
    the GPU; fixed when a CUDA graph is captured)."""

    def __init__(self, layers, rotary: nn.Module, geometry: tuple[int, int, int]):
        self.layers = list(layers)
        self.rotary = rotary
        self.heads, self.kv_heads, self.head_dim = geometry
        self.packed = [_packed(layer) for layer in self.layers]
        self._rope_tables: dict[tuple, tuple[torch.Tensor, torch.Tensor]] = {}

    def rope_tables(self, length: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin [length, D] of positions 0 .. length - 1 in ``like``'s dtype, as HF computes
        them per call (made once per cache length: no launches per step)."""
        key = (length, like.dtype, like.device)
        if key not in self._rope_tables:
            positions = torch.arange(length, device=like.device)[None]
            cos, sin = rope(self.rotary, positions)  # [1, 1, length, D]
            self._rope_tables[key] = (cos[0, 0].to(like.dtype), sin[0, 0].to(like.dtype))
        return self._rope_tables[key]

    @staticmethod
    def norm(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
        """A Hugging Face RMSNorm ``module`` applied to ``x`` in one launch."""
        return decoder.rms_norm(x, module.weight, module.variance_epsilon)[1]

    def __call__(self, x, positions, k_cache, v_cache, splits: int | None = None):
        n = x.shape[0]
        cos, sin = self.rope_tables(k_cache[0].shape[2], x)
        if splits is None:
            splits = decoder.attention_splits(n, self.kv_heads, k_cache[0].shape[2], x.device)
        first = self.layers[0].input_layernorm
        _, h = decoder.rms_norm(x, first.weight, first.variance_epsilon)
        for i, (layer, packed) in enumerate(zip(self.layers, self.packed, strict=True)):
            attn, mlp = layer.self_attn, layer.mlp
            qkv_weight, qkv_bias, gate_up_weight, gate_up_bias, qk_norm = packed
            q = decoder.rope_write(
                F.linear(h, qkv_weight, qkv_bias),
                cos,
                sin,
                positions,
                k_cache[i],
                v_cache[i],
                self.heads,
                qk_norm,
            )
            out = decoder.attention(q, k_cache[i], v_cache[i], positions, attn.scaling, splits)
            norm = layer.post_attention_layernorm
            x, h = decoder.rms_norm(x, norm.weight, norm.variance_epsilon, attn.o_proj(out))
            down = mlp.down_proj(decoder.silu_mul(F.linear(h, gate_up_weight, gate_up_bias)))
            if i + 1 < len(self.layers):
                norm = self.layers[i + 1].input_layernorm
                x, h = decoder.rms_norm(x, norm.weight, norm.variance_epsilon, down)
            else:
                x = x + down
        return x
