"""Frozen configurations and named presets."""

from __future__ import annotations

from dataclasses import dataclass

# The float types an export computes in (weights, activations, KV cache).
DTYPE_NAMES = ("float32", "bfloat16", "float16")
# ONNX opsets an export's graphs use: 24 (Attention, TensorScatter: the KV cache written in
# place, attention over the live window) or 18, the fallback for runtimes without them.
GRAPH_OPSETS = (24, 18)


class ConfigError(ValueError):
    """Bad user input (a preset, path, model or size): the message names the argument and what
    was expected. Scripts report it and exit with status 2; any other error is a bug."""


@dataclass(frozen=True)
class HeadShape:
    """An LM head: ``vocab_size`` logical tokens, ``padded_vocab`` rows of width ``hidden_size``."""

    name: str
    vocab_size: int
    hidden_size: int
    padded_vocab: int

    @classmethod
    def from_name(cls, name: str) -> HeadShape:
        if name not in HEAD_SHAPES:
            raise ConfigError(
                f"head: unknown preset {name!r}; expected one of {', '.join(HEAD_SHAPES)}"
            )
        return HEAD_SHAPES[name]


HEAD_SHAPES = {
    shape.name: shape
    for shape in (
        HeadShape("tiny", vocab_size=32_000, hidden_size=256, padded_vocab=32_064),
        HeadShape("llama3-8b", vocab_size=128_256, hidden_size=4096, padded_vocab=128_256),
        HeadShape("qwen3-8b", vocab_size=151_669, hidden_size=4096, padded_vocab=151_936),
        HeadShape("gemma3-12b", vocab_size=262_144, hidden_size=3840, padded_vocab=262_144),
    )
}


@dataclass(frozen=True)
class TargetConfig:
    """A target architecture preset: the shape of a Hugging Face causal LM with random weights."""

    name: str
    model_type: str  # "llama", "qwen2" or "qwen3"
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    max_positions: int = 4096

    @classmethod
    def from_name(cls, name: str) -> TargetConfig:
        if name not in TARGET_PRESETS:
            raise ConfigError(
                f"target: unknown preset {name!r}; expected one of {', '.join(TARGET_PRESETS)} "
                "or a checkpoint directory"
            )
        return TARGET_PRESETS[name]

    def build(self, seed: int = 0, device: str = "cpu", dtype=None):
        """The Hugging Face model with random weights drawn from ``seed`` (eval mode), created on
        ``device`` in ``dtype`` (default fp32; a GPU initialises an 8B model in seconds)."""
        import torch
        import transformers

        kwargs = dict(
            vocab_size=self.vocab_size,
            hidden_size=self.hidden_size,
            intermediate_size=self.intermediate_size,
            num_hidden_layers=self.num_layers,
            num_attention_heads=self.num_heads,
            num_key_value_heads=self.num_kv_heads,
            max_position_embeddings=self.max_positions,
            tie_word_embeddings=False,
        )
        if self.model_type == "qwen3":
            kwargs["head_dim"] = self.head_dim
        elif self.head_dim != self.hidden_size // self.num_heads:
            raise ValueError(f"{self.name}: head_dim must be hidden_size / num_heads")
        config = transformers.AutoConfig.for_model(self.model_type, **kwargs)
        torch.manual_seed(seed)
        with torch.device(device):
            model = transformers.AutoModelForCausalLM.from_config(config)
        return model.to(dtype or torch.float32).eval()


TARGET_PRESETS = {
    preset.name: preset
    for preset in (
        TargetConfig("tiny-llama", "llama", 512, 64, 128, 2, 4, 2, 16, max_positions=256),
        TargetConfig("tiny-qwen", "qwen3", 512, 64, 128, 2, 4, 2, 16, max_positions=256),
        # A standalone draft model for the tiny targets (same 512-token vocabulary).
        TargetConfig("tiny-draft-llama", "llama", 512, 32, 64, 1, 2, 1, 16, max_positions=256),
        # Shapes of public models, random weights (the decode benchmark, scripts/bench_decode.py).
        TargetConfig("llama3.2-1b-shape", "llama", 128_256, 2048, 8192, 16, 32, 8, 64, 8192),
        TargetConfig("qwen3-1.7b-shape", "qwen3", 151_936, 2048, 6144, 28, 16, 8, 128, 8192),
        TargetConfig("llama3-8b-shape", "llama", 128_256, 4096, 14_336, 32, 32, 8, 128, 8192),
    )
}
