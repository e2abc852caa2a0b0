"""Generate with an export's graphs in onnxruntime (or its TensorRT engines, or the PyTorch
modules it was made from in the device loop on a GPU or the CPU), from text prompts (the
export's tokenizer) or random token ids, optionally checked token for token against the PyTorch
modules it was exported from (same prompts, temperatures and seeds)."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.reference.noise import MAX_SEED
from flashspec_export.runtime import selection, sessions, text
from flashspec_export.runtime.loop import Allowed, GenerationResult, generate


@dataclass(frozen=True)
class RunConfig:
    export_dir: str
    new_tokens: int = 32
    prompt_len: int = 8  # random prompt tokens when no text prompts are given
    temperature: float = 0.8
    seed: int = 0
    check: bool = False  # also run the PyTorch modules and compare tokens
    engines: bool = False  # run the TensorRT engines (<export>/engines) instead of onnxruntime
    prompts: tuple[str, ...] = ()  # text prompts, one per sequence of the export's batch
    stop: tuple[str, ...] = ()  # stop strings (text prompts only)
    select: str | None = None  # ucb1 | thompson: choose (drafter, γ) every step
    echo: Callable[[int, str], None] | None = None  # receives text as it is accepted
    device: str | None = None  # cpu | cuda: the device loop (PyTorch modules), not onnxruntime
    top_k: int | None = None  # sample among the k likeliest tokens (0: off); needs an export
    top_p: float | None = None  # ... and the nucleus of mass p (1: off) with --sampling-params
    # Per sequence, the tokens allowed after those it generated (loop.Allowed; None: any), or
    # allowed_chars: tokens whose text uses only these characters, and EOS (every sequence);
    # either needs an export with --allowed-tokens.
    allowed: tuple[Allowed | None, ...] | None = None
    allowed_chars: str | None = None


@dataclass(frozen=True)
class RunReport:
    prompt: list[list[int]]  # per sequence: its prompt's token ids
    onnx: GenerationResult  # the run's (onnxruntime, the engines or the device loop)
    seconds: float
    reference: GenerationResult | None  # with check=True
    texts: list[str] | None  # the generated text per sequence (text prompts)
    dtype: str = "float32"  # the export's: tokens match the reference exactly only in float32

    @property
    def matches(self) -> bool | None:
        """Same tokens (and, with a fixed drafter and γ, the same steps) as the reference."""
        if self.reference is None:
            return None
        same_steps = bool(self.onnx.metrics.arms) or self.onnx.steps == self.reference.steps
        return self.onnx.tokens == self.reference.tokens and same_steps

    @property
    def first_difference(self) -> tuple[int, int] | None:
        """(sequence, token index) of the first token that differs from the reference."""
        if self.reference is None:
            return None
        pairs = zip(self.onnx.tokens, self.reference.tokens, strict=True)
        for row, (ours, theirs) in enumerate(pairs):
            for index, (a, b) in enumerate(zip(ours, theirs, strict=True)):
                if a != b:
                    return row, index
        return None


def _check(config: RunConfig) -> None:
    if config.prompt_len < 2:
        raise ConfigError(f"prompt_len: expected at least 2, got {config.prompt_len}")
    if config.new_tokens < 1:
        raise ConfigError(f"new_tokens: expected at least 1, got {config.new_tokens}")
    if not (math.isfinite(config.temperature) and config.temperature >= 0):
        raise ConfigError(f"temperature: expected a finite value >= 0, got {config.temperature}")
    if not 0 <= config.seed <= MAX_SEED:
        raise ConfigError(f"seed: expected 0 <= seed <= {MAX_SEED}, got {config.seed}")
    if config.stop and not config.prompts:
        raise ConfigError("stop: stop strings need text prompts (--prompt / --prompt-file)")
    if config.select is not None and config.select not in selection.POLICIES:
        raise ConfigError(f"select: expected one of {', '.join(selection.POLICIES)}")
    if config.device is not None and config.engines:
        raise ConfigError(
            "device: --device runs the PyTorch modules, --engines the TensorRT engines; give one"
        )
    if config.top_k is not None and config.top_k < 0:
        raise ConfigError(f"--top-k: expected an integer >= 0 (0: off), got {config.top_k}")
    if config.top_p is not None and not 0 < config.top_p <= 1:  # NaN fails too
        raise ConfigError(f"--top-p: expected a value in (0, 1] (1: off), got {config.top_p}")
    if config.allowed is not None and config.allowed_chars is not None:
        raise ConfigError("allowed: give allowed callables or --allowed-chars, not both")
    if config.allowed_chars == "":
        raise ConfigError("--allowed-chars: expected at least one character")


def _sampling(config: RunConfig, manifest, batch: int) -> dict:
    """top_k / top_p for ``generate``: per sequence, the export's inputs fed only where it has
    them (off where not asked), and an ask refused, naming the flag, where it has not."""
    asked = [f for f, v in (("--top-k", config.top_k), ("--top-p", config.top_p)) if v is not None]
    if not manifest.sampling_params:
        if asked:
            raise ConfigError(
                f"{asked[0]}: this export's target step takes no top_k / top_p; re-export with "
                "scripts/export.py --sampling-params"
            )
        return {}
    top_k = config.top_k if config.top_k is not None else 0
    top_p = config.top_p if config.top_p is not None else 1.0
    return dict(
        top_k=torch.full((batch,), top_k, dtype=torch.int64), top_p=torch.full((batch,), top_p)
    )


def _allowed(config: RunConfig, manifest, tokenizer) -> dict:
    """``allowed`` for ``generate``: the callables given, or --allowed-chars's mask for every
    sequence; refused, naming the argument, where the export's step takes no mask."""
    if config.allowed is None and config.allowed_chars is None:
        return {}
    flag = "allowed" if config.allowed is not None else "--allowed-chars"
    if sessions.step_allowed_vocab(manifest) is None:
        raise ConfigError(
            f"{flag}: this export's target step takes no allowed-token mask; re-export with "
            "scripts/export.py --allowed-tokens"
        )
    if config.allowed is not None:
        return dict(allowed=config.allowed)
    if tokenizer is None:
        if manifest.tokenizer is None:
            raise ConfigError(
                f"--allowed-chars: {config.export_dir} has no tokenizer to read the tokens' text"
            )
        tokenizer = text.load_tokenizer(config.export_dir, manifest)
    mask = text.tokens_of(tokenizer, config.allowed_chars, manifest.vocab_size)
    mask[[i for i in text.eos_ids(tokenizer) if i < manifest.vocab_size]] = True
    if not bool(mask.any()):
        raise ConfigError(f"--allowed-chars: no token is made of {config.allowed_chars!r}")
    return dict(allowed=(lambda generated: mask,) * manifest.batch)


def _prompts(config: RunConfig, manifest, batch: int):
    """(token ids per sequence, tokenizer or None)."""
    if not config.prompts:
        g = torch.Generator().manual_seed(config.seed)
        ids = torch.randint(0, manifest.vocab_size, (batch, config.prompt_len), generator=g)
        return ids.tolist(), None
    if len(config.prompts) != batch:
        raise ConfigError(
            f"prompt: the export's batch is {batch}; got {len(config.prompts)} prompt(s) (give "
            f"{batch}, or export with --batch {len(config.prompts)})"
        )
    tokenizer = text.load_tokenizer(config.export_dir, manifest)
    return text.encode_prompts(tokenizer, list(config.prompts)), tokenizer


def _check_select(manifest, config: RunConfig) -> None:
    if config.select is not None and manifest.gamma == 0:
        raise ConfigError(
            "select: the export drafts nothing (gamma 0), so there is no drafter or gamma to "
            "choose; export with --gamma >= 1"
        )


def _selecting(drafter, manifest, config: RunConfig):
    if config.select is None:
        return drafter
    drafters = {manifest.drafter: drafter}
    drafters.setdefault("ngram", NgramDrafter())
    arms = selection.arms_for(manifest.drafter, manifest.gamma)
    return selection.SelectingDrafter(
        drafters, selection.make_policy(config.select, arms, seed=config.seed)
    )


def run(config: RunConfig) -> RunReport:
    """Generate up to ``new_tokens`` per sequence (the export's batch).

    The manifest is read once and handed down; the graph (or engine) files are hashed once,
    by the session that loads them. With ``check`` the PyTorch reference is rebuilt, and its
    weights checked against the export's, before anything is generated."""
    _check(config)
    manifest = export_manifest.read(config.export_dir)
    _check_select(manifest, config)
    if config.device is not None:
        device_loop = sessions.device_loop_of(manifest, config.device, config.select is not None)
        target = drafter = None  # the device loop holds the modules
    elif config.engines:
        target, drafter = sessions.from_engines(config.export_dir, manifest)
    else:
        target, drafter = sessions.from_export(config.export_dir, manifest)
    sampling = _sampling(config, manifest, manifest.batch)
    prompt, tokenizer = _prompts(config, manifest, manifest.batch)
    sampling |= _allowed(config, manifest, tokenizer)
    temperature = torch.full((manifest.batch,), config.temperature)
    if config.seed + manifest.batch - 1 > MAX_SEED:  # sequence i uses seed + i
        raise ConfigError(f"seed: {config.seed} + batch {manifest.batch} - 1 exceeds {MAX_SEED}")
    reference_pair = sessions.reference_of(manifest) if config.check else None
    seeds = torch.arange(manifest.batch, dtype=torch.int64) + config.seed
    args = (prompt, config.new_tokens, manifest.gamma, temperature, seeds)

    eos = tokenizer and text.eos_ids(tokenizer)

    def stream(echo=None):
        return tokenizer and text.TextStream(tokenizer, manifest.batch, config.stop, echo, eos)

    drafting = None if config.device is not None else _selecting(drafter, manifest, config)
    streaming = stream(config.echo)
    start = time.perf_counter()
    if config.device is not None:
        policy = None
        if config.select is not None:  # over the loop's arms, rewarded by device time
            policy = selection.make_policy(config.select, device_loop.arms, seed=config.seed)
        generated = device_loop.generate(
            prompt, config.new_tokens, temperature, seeds, streaming, policy=policy, **sampling
        )
        result = GenerationResult(*generated)  # with a policy, its metrics count the arms
    else:
        result = generate(target, drafting, *args, stream=streaming, **sampling)
    seconds = time.perf_counter() - start
    if streaming is not None:
        streaming.finish()
    if isinstance(drafting, selection.SelectingDrafter):
        result.metrics.arms = {f"{a.drafter}:{a.gamma}": n for a, n in drafting.chosen.items()}
    reference = None
    if reference_pair is not None:
        ref_target, ref_drafter = reference_pair
        ref_drafting = _selecting(ref_drafter, manifest, config)
        reference = generate(ref_target, ref_drafting, *args, stream=stream(), **sampling)
    texts = streaming.texts if streaming is not None else None
    return RunReport(prompt, result, seconds, reference, texts, manifest.dtype)
