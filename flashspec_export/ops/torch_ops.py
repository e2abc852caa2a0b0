"""The FlashSpec ops as ``torch.library`` custom ops, so models that call them trace, compile and
export (``torch.onnx.export`` turns them into ``flashspec`` nodes, see ``onnx/translation.py``).

``torch.ops.flashspec.verify_resample`` and ``torch.ops.flashspec.tiled_argmax`` take canonical
tensors (as the backends do) and run the Triton kernels on CUDA, the reference elsewhere.
"""

from __future__ import annotations

import importlib.util

import torch

from flashspec_export.ops import registry


def _backend(t: torch.Tensor) -> str:
    return "triton" if t.is_cuda and importlib.util.find_spec("triton") else "reference"


@torch.library.custom_op("flashspec::verify_resample", mutates_args=())
def verify_resample(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VerifyResample: (tokens [N, γ+1] int64, num_emitted [N] int64, logprobs [N, γ+1] f32)."""
    result = registry.resolve("verify_resample", _backend(hidden))(
        hidden,
        lm_head,
        draft_tokens,
        temperature,
        seed,
        positions,
        vocab_size,
        return_logprobs=True,
    )
    return tuple(result)


@verify_resample.register_fake
def _(hidden, lm_head, draft_tokens, temperature, seed, positions, vocab_size):
    n, rows, _ = hidden.shape
    return (
        hidden.new_empty((n, rows), dtype=torch.int64),
        hidden.new_empty((n,), dtype=torch.int64),
        hidden.new_empty((n, rows), dtype=torch.float32),
    )


@torch.library.custom_op("flashspec::tiled_argmax", mutates_args=())
def tiled_argmax(
    hidden: torch.Tensor, lm_head: torch.Tensor, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """TiledArgmax: (token [N] int64, max_logit [N] float32)."""
    token, max_logit = registry.resolve("tiled_argmax", _backend(hidden))(
        hidden, lm_head, vocab_size
    )
    return token, max_logit


@tiled_argmax.register_fake
def _(hidden, lm_head, vocab_size):
    n = hidden.shape[0]
    return hidden.new_empty((n,), dtype=torch.int64), hidden.new_empty((n,), dtype=torch.float32)
