"""Generate with an export's graphs in onnxruntime, optionally checked token for token against
the PyTorch modules it was exported from (same prompts, temperatures and seeds)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest
from flashspec_export.reference.noise import MAX_SEED
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import GenerationResult, generate


@dataclass(frozen=True)
class RunConfig:
    export_dir: str
    new_tokens: int = 32
    prompt_len: int = 8  # random prompt tokens (presets have no tokenizer)
    temperature: float = 0.8
    seed: int = 0
    check: bool = False  # also run the PyTorch modules and compare tokens
    engines: bool = False  # run the TensorRT engines (<export>/engines) instead of onnxruntime


@dataclass(frozen=True)
class RunReport:
    prompt: torch.Tensor  # [N, prompt_len] int64
    onnx: GenerationResult
    seconds: float
    reference: GenerationResult | None  # with check=True

    @property
    def matches(self) -> bool | None:
        if self.reference is None:
            return None
        return self.onnx.tokens == self.reference.tokens and self.onnx.steps == self.reference.steps


def run(config: RunConfig) -> RunReport:
    """Generate ``new_tokens`` per sequence (the export's batch) from random prompts."""
    if config.prompt_len < 2:
        raise ConfigError(f"prompt_len: expected at least 2, got {config.prompt_len}")
    if config.new_tokens < 1:
        raise ConfigError(f"new_tokens: expected at least 1, got {config.new_tokens}")
    if not (math.isfinite(config.temperature) and config.temperature >= 0):
        raise ConfigError(f"temperature: expected a finite value >= 0, got {config.temperature}")
    if not 0 <= config.seed <= MAX_SEED:
        raise ConfigError(f"seed: expected 0 <= seed <= {MAX_SEED}, got {config.seed}")
    manifest = export_manifest.read(config.export_dir)
    if config.engines:
        target, drafter = sessions.from_engines(config.export_dir)
    else:
        target, drafter = sessions.from_export(config.export_dir)
    g = torch.Generator().manual_seed(config.seed)
    shape = (target.batch, config.prompt_len)
    prompt = torch.randint(0, manifest.vocab_size, shape, generator=g)
    temperature = torch.full((target.batch,), config.temperature)
    if config.seed + target.batch - 1 > MAX_SEED:  # sequence i uses seed + i
        raise ConfigError(f"seed: {config.seed} + batch {target.batch} - 1 exceeds {MAX_SEED}")
    seeds = torch.arange(target.batch, dtype=torch.int64) + config.seed
    args = (prompt, config.new_tokens, manifest.gamma, temperature, seeds)
    start = time.perf_counter()
    result = generate(target, drafter, *args)
    seconds = time.perf_counter() - start
    reference = None
    if config.check:
        reference = generate(*sessions.reference_of(config.export_dir), *args)
    return RunReport(prompt, result, seconds, reference)
