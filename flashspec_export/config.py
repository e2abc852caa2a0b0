"""Frozen configurations and named presets."""

from __future__ import annotations

from dataclasses import dataclass


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
            raise ValueError(
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
