"""Boundary checks for the public ops: clear errors that name the argument and what was expected.

Shape, dtype and device checks cost nothing. Value checks (NaN/Inf, token ranges, temperatures,
seeds) read the data back to the host; ``check_values=False`` skips them in a hot loop whose
inputs are already known to be valid.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

from flashspec_export.reference import noise, truncation

FLOAT_DTYPES = (torch.float32, torch.bfloat16, torch.float16)


class VerifyInputs(NamedTuple):
    """Canonical ``VerifyResample`` inputs (all on ``hidden.device``)."""

    hidden: torch.Tensor  # [N, γ + 1, H]
    lm_head: torch.Tensor  # [V, H]
    draft_tokens: torch.Tensor  # [N, γ] int64
    temperature: torch.Tensor  # [N] float32
    seed: torch.Tensor  # [N] int64
    positions: torch.Tensor  # [N] int64
    vocab_size: int


def _shape(t: torch.Tensor) -> str:
    return "(" + ", ".join(str(d) for d in t.shape) + ")"


def _require_tensor(name: str, value, expected: str) -> torch.Tensor:
    if not isinstance(value, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor {expected}, got {type(value).__name__}")
    return value


def _check_float_tensor(name: str, t: torch.Tensor, expected: str) -> None:
    if t.dtype not in FLOAT_DTYPES:
        raise TypeError(
            f"{name}: unsupported dtype {t.dtype}; expected {expected} of float32, bfloat16 "
            "or float16"
        )


def _check_finite(name: str, t: torch.Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise ValueError(f"{name}: contains {bad} NaN/Inf value(s); expected finite values")


def check_lm_head(lm_head, hidden_size: int, hidden: torch.Tensor, vocab_size) -> tuple:
    """Validate ``lm_head [V, H]`` against ``hidden``; returns (lm_head, vocab_size)."""
    lm_head = _require_tensor("lm_head", lm_head, "[V, H]")
    if lm_head.dim() != 2 or lm_head.shape[1] != hidden_size:
        raise ValueError(
            f"lm_head: expected shape [V, H] with H = {hidden_size} (the last dimension of "
            f"hidden), got {_shape(lm_head)}"
        )
    if lm_head.dtype != hidden.dtype:
        raise TypeError(
            f"lm_head: dtype {lm_head.dtype} differs from hidden's {hidden.dtype}; expected the "
            "same dtype"
        )
    if lm_head.device != hidden.device:
        raise ValueError(f"lm_head: on {lm_head.device}, expected hidden's device {hidden.device}")
    padded_vocab = lm_head.shape[0]
    if padded_vocab < 1:
        raise ValueError("lm_head: empty vocabulary (V = 0); expected V >= 1")
    if padded_vocab > noise.MAX_TOKEN:
        raise ValueError(
            f"lm_head: V = {padded_vocab} exceeds the noise key range {noise.MAX_TOKEN}"
        )
    if vocab_size is None:
        vocab_size = padded_vocab
    if isinstance(vocab_size, bool) or not isinstance(vocab_size, int):
        raise TypeError(f"vocab_size: expected an int or None, got {type(vocab_size).__name__}")
    if not 1 <= vocab_size <= padded_vocab:
        raise ValueError(
            f"vocab_size: expected 1 <= vocab_size <= {padded_vocab} (lm_head rows), "
            f"got {vocab_size}"
        )
    return lm_head, vocab_size


def _per_row(name, value, n: int, device, dtype, kind: str) -> torch.Tensor:
    """A python scalar, 0-d or [N] tensor -> [N] tensor of ``dtype``."""
    if isinstance(value, torch.Tensor):
        if value.dim() > 1 or (value.dim() == 1 and value.shape[0] != n):
            raise ValueError(f"{name}: expected a scalar or shape [{n}] (N), got {_shape(value)}")
        if dtype.is_floating_point and not value.dtype.is_floating_point:
            raise TypeError(f"{name}: expected a floating-point tensor, got {value.dtype}")
        if not dtype.is_floating_point and value.dtype not in (torch.int64, torch.int32):
            raise TypeError(f"{name}: expected an int64 tensor, got {value.dtype}")
        return value.to(device=device, dtype=dtype).expand(n).contiguous()
    if isinstance(value, bool) or not isinstance(value, kind):
        expected = "float" if dtype.is_floating_point else "int"
        raise TypeError(
            f"{name}: expected a {expected} or a [{n}] tensor, got {type(value).__name__}"
        )
    return torch.full((n,), value, dtype=dtype, device=device)


def _check_range(name: str, t: torch.Tensor, low, high, what: str) -> None:
    if t.numel() and not bool(((t >= low) & (t <= high)).all()):
        bad = t[~((t >= low) & (t <= high))][0].item()
        raise ValueError(f"{name}: expected {what}, got {bad}")


def _check_drafts(draft_tokens: torch.Tensor, vocab_size: int) -> None:
    """Ids in [0, V), or -1 from some position on (a sequence that proposed fewer drafts)."""
    want = f"ids in [0, {vocab_size}), or -1 placeholders after a sequence's last draft"
    _check_range("draft_tokens", draft_tokens, -1, vocab_size - 1, want)
    placeholder = draft_tokens == -1
    if bool((placeholder[:, :-1] & ~placeholder[:, 1:]).any()):
        seq = int((placeholder[:, :-1] & ~placeholder[:, 1:]).any(dim=1).nonzero()[0])
        raise ValueError(
            f"draft_tokens: sequence {seq} has a draft after a -1 placeholder "
            f"{draft_tokens[seq].tolist()}; expected {want}"
        )


def check_temperature(temperature, n: int, device, check_values: bool) -> torch.Tensor:
    """float or [N] tensor -> [N] float32, finite and >= 0 (0: greedy)."""
    t = _per_row("temperature", temperature, n, device, torch.float32, (float, int))
    if isinstance(temperature, torch.Tensor):
        if check_values and not bool((torch.isfinite(t) & (t >= 0)).all()):
            bad = t[~(torch.isfinite(t) & (t >= 0))][0].item()
            raise ValueError(f"temperature: expected finite values >= 0, got {bad}")
    elif not (math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature: expected a finite value >= 0, got {temperature}")
    return t


def check_verify_inputs(
    hidden,
    lm_head,
    draft_tokens,
    temperature,
    seed,
    positions,
    vocab_size,
    check_values: bool,
) -> VerifyInputs:
    """Validate and canonicalise ``verify_resample`` arguments (see ``ops.verify_resample``)."""
    hidden = _require_tensor("hidden", hidden, "[N, gamma + 1, H]")
    if hidden.dim() != 3:
        raise ValueError(f"hidden: expected shape [N, gamma + 1, H], got {_shape(hidden)}")
    n, rows, hidden_size = hidden.shape
    if n == 0:
        raise ValueError("hidden: empty batch (N = 0); expected N >= 1 sequences")
    if rows == 0 or hidden_size == 0:
        raise ValueError(f"hidden: expected gamma + 1 >= 1 rows and H >= 1, got {_shape(hidden)}")
    _check_float_tensor("hidden", hidden, "[N, gamma + 1, H]")
    gamma = rows - 1
    lm_head, vocab_size = check_lm_head(lm_head, hidden_size, hidden, vocab_size)

    draft_tokens = _require_tensor("draft_tokens", draft_tokens, f"[{n}, {gamma}]")
    if draft_tokens.shape != (n, gamma):
        raise ValueError(
            f"draft_tokens: expected shape [N, gamma] = [{n}, {gamma}] (from hidden "
            f"{_shape(hidden)}), got {_shape(draft_tokens)}"
        )
    if draft_tokens.dtype not in (torch.int64, torch.int32):
        raise TypeError(f"draft_tokens: expected an int64 tensor, got {draft_tokens.dtype}")
    draft_tokens = draft_tokens.to(device=hidden.device, dtype=torch.int64)

    device = hidden.device
    temperature = check_temperature(temperature, n, device, check_values)
    seed = _per_row("seed", seed, n, device, torch.int64, (int,))
    positions = _per_row("positions", positions, n, device, torch.int64, (int,))
    if check_values:
        _check_finite("hidden", hidden)
        _check_finite("lm_head", lm_head[:vocab_size])
        _check_drafts(draft_tokens, vocab_size)
        _check_range("seed", seed, 0, noise.MAX_SEED, "values >= 0")
        top = noise.MAX_POSITION - gamma
        _check_range(
            "positions", positions, 0, top, f"values in [0, {top}] (position + gamma < 2**31 - 1)"
        )
    return VerifyInputs(hidden, lm_head, draft_tokens, temperature, seed, positions, vocab_size)


class Truncation(NamedTuple):
    """Canonical sampling truncation of ``VerifyResample`` (``reference/truncation.py``); None:
    off."""

    top_k: torch.Tensor | None  # [N] int64, 0: off
    top_p: torch.Tensor | None  # [N] float32 in (0, 1], 1: off
    allowed_tokens: torch.Tensor | None  # [N, γ + 1, ceil(V / 32)] int32

    @property
    def active(self) -> bool:
        return any(x is not None for x in self)


def check_truncation(top_k, top_p, allowed_tokens, inputs: VerifyInputs, check_values: bool):
    """Validate ``top_k``, ``top_p`` and ``allowed_tokens`` against the verify inputs."""
    n, rows, _ = inputs.hidden.shape
    device = inputs.hidden.device
    if top_k is not None:
        top_k = _per_row("top_k", top_k, n, device, torch.int64, (int,))
        if check_values:
            _check_range("top_k", top_k, 0, 2**62, "integers >= 0 (0: off)")
    if top_p is not None:
        top_p = _per_row("top_p", top_p, n, device, torch.float32, (float, int))
        ok = (top_p > 0) & (top_p <= 1)
        if check_values and not bool(ok.all()):
            bad = top_p[~ok][0].item()
            raise ValueError(f"top_p: expected values in (0, 1] (1: off), got {bad}")
    if allowed_tokens is not None:
        words = truncation.words_for(inputs.vocab_size)
        want = f"[N, gamma + 1, ceil(vocab_size / 32)] = [{n}, {rows}, {words}]"
        allowed_tokens = _require_tensor("allowed_tokens", allowed_tokens, want)
        if allowed_tokens.shape != (n, rows, words) or allowed_tokens.dtype != torch.int32:
            raise ValueError(
                f"allowed_tokens: expected an int32 tensor of shape {want}, got "
                f"{allowed_tokens.dtype} {_shape(allowed_tokens)}"
            )
        allowed_tokens = allowed_tokens.to(device)
        if check_values:
            ids = torch.arange(inputs.vocab_size, device=device)
            counts = truncation.allowed_ids(allowed_tokens, ids).sum(dim=-1)  # [N, R]
            if bool((counts == 0).any()):
                seq, row = (int(i) for i in (counts == 0).nonzero()[0])
                raise ValueError(
                    f"allowed_tokens: sequence {seq}, position {row} allows no token below "
                    f"vocab_size {inputs.vocab_size}; every row must allow at least one"
                )
    return Truncation(top_k, top_p, allowed_tokens)


def check_argmax_inputs(hidden, lm_head, vocab_size, check_values: bool):
    """Validate ``tiled_argmax`` arguments; returns (hidden, lm_head, vocab_size)."""
    hidden = _require_tensor("hidden", hidden, "[N, H]")
    if hidden.dim() != 2:
        raise ValueError(f"hidden: expected shape [N, H], got {_shape(hidden)}")
    if hidden.shape[0] == 0:
        raise ValueError("hidden: empty batch (N = 0); expected N >= 1 rows")
    if hidden.shape[1] == 0:
        raise ValueError(f"hidden: expected H >= 1, got {_shape(hidden)}")
    _check_float_tensor("hidden", hidden, "[N, H]")
    lm_head, vocab_size = check_lm_head(lm_head, hidden.shape[1], hidden, vocab_size)
    if check_values:
        _check_finite("hidden", hidden)
        _check_finite("lm_head", lm_head[:vocab_size])
    return hidden, lm_head, vocab_size
