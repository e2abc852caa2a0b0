"""Public entry point of the FlashSpec ops, dispatching through one registry.

>>> tokens, num_emitted = verify_resample(hidden, lm_head, draft_tokens, temperature=1.0)
>>> token, max_logit = tiled_argmax(hidden_1d, lm_head)
"""

from __future__ import annotations

import torch

from flashspec_export.ops import registry, validation
from flashspec_export.ops.registry import backends

# The backends that take top_k / top_p / allowed_tokens.
TRUNCATING_BACKENDS = ("reference", "standard", "triton", "cuda")


def verify_resample(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: float | torch.Tensor = 1.0,
    seed: int | torch.Tensor = 0,
    positions: int | torch.Tensor = 0,
    vocab_size: int | None = None,
    *,
    return_logprobs: bool = False,
    backend: str = "reference",
    check_values: bool = True,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    allowed_tokens: torch.Tensor | None = None,
):
    """Verify γ greedy drafts per sequence and emit the next tokens (VerifyResample in
    docs/DESIGN.md): per position the Gumbel-max sample ``y``; drafts accepted while equal to it.

    Parameters
    ----------
    hidden : [N, γ + 1, H] float32 / bfloat16 / float16; row i is the target state after the
        prefix and the drafts ``d[:i]``
    lm_head : [V, H], same dtype and device as ``hidden``
    draft_tokens : [N, γ] int64, ids in [0, vocab_size)
    temperature : float or [N] tensor, >= 0; below 1e-5 (0 included) a greedy target
    seed : int or [N] int64 tensor, >= 0
    positions : int or [N] int64 tensor, absolute position of row 0 (keys the noise)
    vocab_size : LM-head rows >= vocab_size are padding (default: V)
    return_logprobs : also return the target log-probabilities of the emitted tokens
    backend : one of ``backends("verify_resample")``
    check_values : check value ranges and finiteness (reads data back to the host)
    top_k : int or [N] int64 tensor, >= 0 (0: off): sample among the k largest logits
    top_p : float or [N] float32 tensor in (0, 1] (1: off): then among the nucleus of mass p
    allowed_tokens : [N, γ + 1, ceil(vocab_size / 32)] int32 bit masks (bit j of word w allows
        token 32·w + j), applied first; every row must allow a token. Drafts may end early:
        ``draft_tokens[i, j:] = -1``. The law is the truncated target's, the coupled rule holds
        on the kept tokens (``reference/truncation.py``); every backend takes these

    Returns
    -------
    tokens : [N, γ + 1] int64, accepted drafts, then the recovered or bonus token, then -1
    num_emitted : [N] int64 in 1..γ + 1
    logprobs : [N, γ + 1] float32 (only with ``return_logprobs``), 0 past ``num_emitted``
    """
    inputs = validation.check_verify_inputs(
        hidden, lm_head, draft_tokens, temperature, seed, positions, vocab_size, check_values
    )
    truncation = validation.check_truncation(top_k, top_p, allowed_tokens, inputs, check_values)
    implementation = registry.resolve("verify_resample", backend)
    if not truncation.active:
        result = implementation(*inputs, return_logprobs=return_logprobs)
    elif backend in TRUNCATING_BACKENDS:
        result = implementation(*inputs, return_logprobs=return_logprobs, **truncation._asdict())
    else:
        raise ValueError(
            f"backend: {backend!r} does not take top_k / top_p / allowed_tokens yet; "
            f"{', '.join(repr(b) for b in TRUNCATING_BACKENDS[:-1])} and "
            f"{TRUNCATING_BACKENDS[-1]!r} do"
        )
    return tuple(result) if return_logprobs else (result.tokens, result.num_emitted)


def tiled_argmax(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    vocab_size: int | None = None,
    *,
    backend: str = "reference",
    check_values: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Greedy drafting: ``argmax_v hidden · lm_head[v]`` without materialising the logits.

    Parameters
    ----------
    hidden : [N, H] float32 / bfloat16 / float16
    lm_head : [V, H], same dtype and device
    vocab_size : LM-head rows >= vocab_size are padding (default: V)
    backend : one of ``backends("tiled_argmax")``
    check_values : check finiteness (reads data back to the host)

    Returns
    -------
    token : [N] int64, the lowest index among the maximal logits
    max_logit : [N] float32
    """
    hidden, lm_head, vocab_size = validation.check_argmax_inputs(
        hidden, lm_head, vocab_size, check_values
    )
    return registry.resolve("tiled_argmax", backend)(hidden, lm_head, vocab_size)


# Registers torch.ops.flashspec.verify_resample / tiled_argmax (for tracing and ONNX export).
from flashspec_export.ops import torch_ops  # noqa: E402

__all__ = ["backends", "tiled_argmax", "torch_ops", "verify_resample"]
