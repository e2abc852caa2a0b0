"""The speculative loop: propose → one target step over γ + 1 tokens → accept → advance.

The target and the drafter are backend-neutral: each graph is a callable on CPU tensors
(``runtime.sessions`` builds them from the PyTorch modules or from onnxruntime sessions of an
export), so the same loop runs both and their tokens can be compared.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from flashspec_export.config import ConfigError
from flashspec_export.reference.truncation import pack_allowed, words_for
from flashspec_export.runtime.metrics import Metrics

Graph = Callable[..., tuple[torch.Tensor, ...]]  # positional tensors in, tuple of tensors out
# A sequence's constraint (a grammar): the tokens it has generated (not the prompt) -> bool [V],
# True for each token allowed next.
Allowed = Callable[[list[int]], torch.Tensor]


@dataclass(frozen=True)
class Target:
    """The target's two graphs and its static cache.

    prefill(tokens [N, T], positions [N], k, v) -> (hidden [N, T, H], k, v)
    step(tokens [N, γ + 1], positions [N], k, v, temperature [N], seed [N][, top_k [N],
        top_p [N]][, allowed_tokens [N, γ + 1, ceil(V / 32)]]) -> (emitted [N, γ + 1],
        num_emitted [N][, logprobs [N, γ + 1]], hidden [N, γ + 1, H], k, v) — top_k / top_p
        when ``sampling_params``, allowed_tokens when ``allowed_vocab`` (V), logprobs when
        ``logprobs`` (an export with ``--no-logprobs`` has none; the loop does not read them)
    cache_shape: [L, N, KV, S, D] of k and v (N and S are fixed by an export)

    A graph may return the k and v it was given, written in place (onnxruntime and TensorRT
    bind an opset-24 export's past and present caches to one buffer), or new tensors.
    """

    prefill: Graph
    step: Graph
    cache_shape: tuple[int, ...]
    cache_dtype: torch.dtype = torch.float32  # what the graphs take (written in place by some)
    cache_device: str = "cpu"  # TensorRT engines keep their caches on the GPU
    sampling_params: bool = False  # the step takes top_k [N] int64 and top_p [N] float32
    logprobs: bool = True  # the step returns logprobs after num_emitted
    allowed_vocab: int | None = None  # V: the step takes allowed_tokens masks of V tokens

    def new_cache(self) -> torch.Tensor:
        """A zeroed cache tensor (k or v) as the graphs take it."""
        return torch.zeros(self.cache_shape, dtype=self.cache_dtype, device=self.cache_device)

    @property
    def batch(self) -> int:
        return self.cache_shape[1]

    @property
    def max_len(self) -> int:
        return self.cache_shape[3]


class Drafter(Protocol):
    """What the loop asks of a drafter (``NgramDrafter``, ``runtime.drafting.GraphDrafter``)."""

    def start(self, prompt: torch.Tensor, hidden: torch.Tensor, lengths: torch.Tensor) -> None:
        """After the target prefill of ``prompt[:, :-1]`` ([N, T0], right-padded: sequence i is
        ``prompt[i, :lengths[i]]``); hidden [N, T0 - 1, H]."""

    def propose(self, sequences: list[list[int]], gamma: int) -> torch.Tensor:
        """[N, γ] int64 drafts following each sequence."""

    def update(self, step_positions, emitted, num_emitted, hidden, kept) -> None:
        """After a target step at ``step_positions`` [N] with its outputs; ``kept`` [N]: the
        tokens the loop kept of each sequence's ``num_emitted`` (0 once it finished, fewer at
        ``max_new_tokens`` or a stop string)."""


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # per sequence: the generated tokens (max_new_tokens each)
    metrics: Metrics

    @property
    def steps(self) -> int:
        """Target steps taken."""
        return self.metrics.steps

    @property
    def mean_emitted(self) -> float:
        """Tokens per target step of an unfinished sequence."""
        return self.metrics.tokens_per_step


class Stream(Protocol):
    """Receives each sequence's new tokens as steps accept them (``runtime.text.TextStream``)."""

    def push(self, row: int, tokens: list[int]) -> int | None:
        """None to go on, or how many of ``tokens`` to keep before sequence ``row`` stops."""


def as_prompts(prompt) -> list[list[int]]:
    """Prompts as N lists of token ids (lengths may differ) from a [N, T0] tensor or lists."""
    if isinstance(prompt, torch.Tensor):
        if prompt.dim() != 2:
            raise ConfigError(f"prompt: expected shape [N, T0], got {tuple(prompt.shape)}")
        return prompt.tolist()
    return [list(map(int, row)) for row in prompt]


def check_request(prompts, max_new_tokens, gamma, temperature, batch, max_len) -> None:
    """Refuse a generation request the loop cannot run, naming the argument."""
    n = len(prompts)
    if max_new_tokens < 1:
        raise ConfigError(f"new_tokens: expected at least 1, got {max_new_tokens}")
    if gamma < 0:
        raise ConfigError(f"gamma: expected >= 0, got {gamma}")
    finite = temperature.shape == (n,) and bool(torch.isfinite(temperature).all())
    if not finite or bool((temperature < 0).any()):
        values = temperature.tolist()
        raise ConfigError(f"temperature: expected {n} finite values >= 0 (0: greedy), got {values}")
    if n != batch:
        raise ConfigError(f"prompt: expected {batch} sequences (the batch), got {n}")
    shortest, longest = min(map(len, prompts)), max(map(len, prompts))
    if shortest < 2:
        raise ConfigError(f"prompt: expected at least 2 tokens per sequence, got {shortest}")
    needed = longest + max_new_tokens + gamma
    if needed > max_len:
        raise ConfigError(
            f"max_new_tokens: prompt ({longest}) + max_new_tokens ({max_new_tokens}) + gamma "
            f"({gamma}) = {needed} exceeds the cache length {max_len}"
        )


def sampling_inputs(target: Target, n: int, top_k, top_p) -> tuple[torch.Tensor, ...]:
    """What the step takes after the seed: top_k [N] int64 and top_p [N] float32 (the off
    values, 0 and 1, where not given) for a target with ``sampling_params``; else nothing, and a
    given top_k / top_p is refused."""
    if not target.sampling_params:
        if top_k is not None or top_p is not None:
            raise ConfigError(
                f"{'top_k' if top_k is not None else 'top_p'}: this target step takes no "
                "per-sequence top_k / top_p (export with --sampling-params)"
            )
        return ()
    return sampling_values(n, top_k, top_p)


def sampling_values(n: int, top_k, top_p) -> tuple[torch.Tensor, torch.Tensor]:
    """top_k [N] int64 and top_p [N] float32 on the host, the off values (0, 1) where one is
    not given; a ConfigError naming a bad one."""
    top_k = torch.zeros(n, dtype=torch.int64) if top_k is None else torch.as_tensor(top_k).cpu()
    top_p = torch.ones(n) if top_p is None else torch.as_tensor(top_p).cpu()
    if top_k.shape != (n,) or top_k.is_floating_point() or bool((top_k < 0).any()):
        raise ConfigError(f"top_k: expected {n} integers >= 0 (0: off), got {top_k.tolist()}")
    if top_p.shape != (n,) or not bool(((top_p > 0) & (top_p <= 1)).all()):
        raise ConfigError(f"top_p: expected {n} values in (0, 1] (1: off), got {top_p.tolist()}")
    return top_k.long(), top_p.float()


def _allowed_row(allowed: Allowed, prefix: list[int], vocab: int, row: int, j: int):
    """``allowed(prefix)`` of sequence ``row``'s step row ``j``, checked: a bool [V] tensor that
    allows some token."""
    mask = allowed(list(prefix))  # a copy: the callable may keep it
    if not isinstance(mask, torch.Tensor) or mask.dtype != torch.bool or mask.shape != (vocab,):
        got = f"{mask.dtype} {list(mask.shape)}" if isinstance(mask, torch.Tensor) else repr(mask)
        raise ConfigError(
            f"allowed: sequence {row} returned {got}; expected a bool tensor of shape [{vocab}]"
        )
    if not bool(mask.any()):
        raise ConfigError(
            f"allowed: sequence {row}, row {j} (after {len(prefix) - j} generated tokens and {j} "
            "drafts) allows no token; every row needs at least one (e.g. EOS)"
        )
    return mask


def check_allowed(allowed, n: int) -> None:
    """``allowed``: None, or one ``Allowed`` callable or None per sequence."""
    if allowed is not None and len(allowed) != n:
        raise ConfigError(f"allowed: expected {n} callables or None (one per sequence)")


def allowed_inputs(
    vocab: int | None, allowed, sequences: list[list[int]], starts, drafts: torch.Tensor, active
) -> tuple[torch.Tensor, ...]:
    """What the step takes after top_k / top_p: allowed_tokens [N, γ + 1, ceil(V / 32)] int32
    for a step that takes masks of ``vocab`` (V) tokens, else (None) nothing.

    Row j of sequence i is ``allowed[i](sequences[i][starts[i]:] + drafts[i, :j])``: the mask
    after the tokens it generated and the drafts before the row. Rows past a draft that its own
    row does not allow (never accepted) or past the real drafts (-1 placeholders) cannot be
    reached: they repeat the last row reached, so the callable sees only prefixes its masks
    allow and the op no empty row. A finished sequence, or one whose callable is None, allows
    every token.
    sequences : prompt and generated tokens; starts : [N] where each one's generated tokens
    begin; drafts : [N, γ] int64; active : [N] bool
    """
    if vocab is None:
        return ()
    n, gamma = drafts.shape
    words = torch.full((n, gamma + 1, words_for(vocab)), -1, dtype=torch.int32)
    for row in range(n if allowed is not None else 0):
        if allowed[row] is None or not active[row]:
            continue
        prefix = sequences[row][starts[row] :]
        for j in range(gamma + 1):
            mask = _allowed_row(allowed[row], prefix, vocab, row, j)
            words[row, j:] = pack_allowed(mask)  # the rows after: until their own is known
            draft = int(drafts[row, j]) if j < gamma else -1
            if not 0 <= draft < vocab or not mask[draft]:
                break
            prefix.append(draft)
    return (words,)


def generate(
    target: Target,
    drafter: Drafter,
    prompt,
    max_new_tokens: int,
    gamma: int,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    stream: Stream | None = None,
    top_k: torch.Tensor | None = None,
    top_p: torch.Tensor | None = None,
    allowed: Sequence[Allowed | None] | None = None,
) -> GenerationResult:
    """Generate up to ``max_new_tokens`` per sequence after ``prompt`` ([N, T0] or N lists of
    token ids of any lengths >= 2); ``stream`` sees the tokens as they come and may stop a
    sequence early (EOS, stop strings).

    The prompts minus their last tokens are prefilled, right-padded to the longest (the padded
    cache slots lie past each sequence's position: the first step overwrites them before any
    query can see them); every step then feeds the last accepted token and the drafts at
    ``positions`` = the cache length, and advances it by ``num_emitted``. The drafter may
    return fewer than ``gamma`` drafts (online selection): the step verifies those.
    temperature : [N] float32 (0: greedy); seed : [N] int64
    top_k : [N] int64 (0: off); top_p : [N] float32 in (0, 1] (1: off) — a target with
        ``sampling_params`` only (``sampling_inputs``)
    allowed : per sequence, an ``Allowed`` callable or None (unconstrained): ``allowed[i](
        generated)`` -> bool [V], the tokens allowed after the tokens sequence i generated (its
        prompt excluded); called for each row of each step, drafts included (``allowed_inputs``)
        — a target with ``allowed_vocab`` only
    """
    sequences = as_prompts(prompt)
    n = len(sequences)
    check_request(sequences, max_new_tokens, gamma, temperature, target.batch, target.max_len)
    sampling = sampling_inputs(target, n, top_k, top_p)
    if allowed is not None and target.allowed_vocab is None:
        raise ConfigError(
            "allowed: this target step takes no allowed-token masks (export with --allowed-tokens)"
        )
    check_allowed(allowed, n)
    metrics = Metrics(gamma, n)
    start = time.perf_counter()
    lengths = torch.tensor([len(s) for s in sequences])
    longest = int(lengths.max())
    padded = torch.tensor([s + s[-1:] * (longest - len(s)) for s in sequences])
    k, v = target.new_cache(), target.new_cache()
    hidden, k, v = target.prefill(padded[:, :-1], torch.zeros(n, dtype=torch.int64), k, v)
    drafter.start(padded, hidden, lengths)
    totals = lengths + max_new_tokens
    stopped = [False] * n
    positions = lengths - 1
    starts = lengths.tolist()  # where each sequence's generated tokens begin
    while True:
        lengths = torch.tensor([len(s) for s in sequences])
        active = (lengths < totals) & ~torch.tensor(stopped)
        if not active.any():
            break
        last = torch.tensor([s[-1] for s in sequences])[:, None]
        clock = time.perf_counter()
        drafts = drafter.propose(sequences, gamma)
        tokens = torch.cat([last, drafts], dim=1)  # [N, γ + 1]
        metrics.draft_seconds += time.perf_counter() - clock
        # Finished sequences idle at position 0: their cache is dead, and their writes (γ + 1
        # slots from the step position, more in the drafter) stay inside the cache.
        step_positions = torch.where(active, positions, 0)
        masks = allowed_inputs(target.allowed_vocab, allowed, sequences, starts, drafts, active)
        clock = time.perf_counter()
        step = target.step(tokens, step_positions, k, v, temperature, seed, *sampling, *masks)
        metrics.verify_seconds += time.perf_counter() - clock
        emitted, num_emitted, *rest = step
        hidden, k, v = rest[1:] if target.logprobs else rest  # the logprobs are not read
        num_emitted = torch.where(active, num_emitted, 0)
        counts = (torch.minimum(num_emitted, totals - lengths)).tolist()
        kept = [0] * n
        for row, count in enumerate(counts):
            new = emitted[row, :count].tolist()
            keep = stream.push(row, new) if stream is not None and new else None
            if keep is not None:
                new, stopped[row] = new[:keep], True
            sequences[row].extend(new)
            kept[row] = len(new)
        finished = (lengths + num_emitted >= totals) | torch.tensor(stopped)
        drafter.update(
            torch.where(finished, 0, positions),
            emitted,
            num_emitted.clamp(min=1),
            hidden,
            torch.tensor(kept),
        )
        positions = positions + num_emitted
        # the metrics count the tokens kept, not those cut at max_new_tokens or a stop string,
        # and the real drafts, not the -1 placeholders of a drafter that proposed fewer
        drafted = (drafts >= 0).sum(dim=1).tolist()
        rows = [row for row in range(n) if active[row]]
        metrics.add_step([kept[row] for row in rows], [drafted[row] for row in rows])
    prompt_lengths = [int(x) for x in totals - max_new_tokens]
    generated = [s[length:] for s, length in zip(sequences, prompt_lengths, strict=True)]
    metrics.total_seconds = time.perf_counter() - start
    metrics.generated = sum(map(len, generated))
    return GenerationResult(generated, metrics)
