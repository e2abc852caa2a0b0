"""What a speculative run measured: tokens per target step, accepted length, per-position
acceptance and where the time went. Both loops (``loop.generate`` on CPU graphs,
``device_loop.DeviceLoop`` on the GPU) fill one ``Metrics``.

Definitions (as vLLM and TensorRT-LLM report them): a "step" of a sequence is one target step
while it is unfinished; ``tokens_per_step`` = emitted tokens / steps (accepted drafts + 1);
``acceptance[i]`` = steps whose draft at position i was accepted / steps that drafted position i
(a draft is accepted only if every earlier one was; with a fixed γ every step drafts every
position, except where a drafter left it empty: a -1 placeholder is no draft, counted in neither,
so the rates are per real draft). With online selection (``runtime/selection.py``) γ varies per
step: ``gamma`` is the largest, and ``arms`` counts the steps of each (drafter, γ) chosen.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class Metrics:
    gamma: int
    sequences: int
    steps: int = 0  # target steps (loop iterations)
    sequence_steps: int = 0  # (sequence, step) pairs while unfinished
    emitted: int = 0  # tokens emitted by those steps
    accepted_at: list[int] = field(default_factory=list)  # [γ]: steps accepting position i
    drafted_at: list[int] = field(default_factory=list)  # [γ]: steps drafting position i
    arms: dict[str, int] = field(default_factory=dict)  # "drafter:γ" -> steps (selection)
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # the target step: decoder + verify
    step_seconds: float = 0.0  # whole steps timed as one (the device loop's one graph per step)
    total_seconds: float = 0.0
    generated: int = 0  # tokens returned (new_tokens per sequence)

    def __post_init__(self):
        if not self.accepted_at:
            self.accepted_at = [0] * self.gamma
        if not self.drafted_at:
            self.drafted_at = [0] * self.gamma

    def add_step(self, num_emitted: list[int], drafted: int | list[int] | None = None) -> None:
        """Count one target step from the unfinished sequences' ``num_emitted`` (1..γ + 1);
        ``drafted``: the real drafts of this step, one count for every sequence or one per
        sequence (placeholders left out; default: ``self.gamma``)."""
        drafted = self.gamma if drafted is None else drafted
        if isinstance(drafted, int):
            drafted = [drafted] * len(num_emitted)
        self.steps += 1
        self.sequence_steps += len(num_emitted)
        self.emitted += sum(num_emitted)
        for count, drafts in zip(num_emitted, drafted, strict=True):
            for i in range(drafts):  # a sequence emits at most its real drafts + 1
                self.drafted_at[i] += 1
                self.accepted_at[i] += int(count > i + 1)

    @property
    def tokens_per_step(self) -> float:
        return self.emitted / max(self.sequence_steps, 1)

    @property
    def mean_accepted(self) -> float:
        """Accepted drafts per step (tokens per step minus the target's own token)."""
        return self.tokens_per_step - 1.0

    @property
    def acceptance(self) -> list[float]:
        return [a / max(d, 1) for a, d in zip(self.accepted_at, self.drafted_at, strict=True)]

    @property
    def rest_seconds(self) -> float:
        timed = self.draft_seconds + self.verify_seconds + self.step_seconds
        return max(self.total_seconds - timed, 0.0)

    @property
    def tokens_per_second(self) -> float:
        return self.generated / self.total_seconds if self.total_seconds > 0 else 0.0

    def to_json(self) -> dict:
        return {
            **asdict(self),
            "tokens_per_step": self.tokens_per_step,
            "mean_accepted": self.mean_accepted,
            "acceptance": self.acceptance,
            "rest_seconds": self.rest_seconds,
            "tokens_per_second": self.tokens_per_second,
        }

    def summary(self) -> str:
        """One screen: tokens per step, acceptance by position, time split, throughput."""
        rates = " ".join(f"{r:.2f}" for r in self.acceptance) or "-"
        total = max(self.total_seconds, 1e-12)
        parts = {"draft": self.draft_seconds, "verify": self.verify_seconds}
        if self.step_seconds:
            parts = {"step": self.step_seconds}
        parts["rest"] = self.rest_seconds
        split = " / ".join(f"{k} {100 * v / total:.0f}%" for k, v in parts.items())
        return "\n".join(
            [
                f"{self.steps} target steps, gamma {self.gamma}, {self.sequences} sequences",
                f"tokens per step {self.tokens_per_step:.2f} (accepted {self.mean_accepted:.2f})",
                f"acceptance by draft position: {rates}",
                f"time {self.total_seconds:.3f} s: {split}",
                f"{self.tokens_per_second:.1f} tokens/s ({self.generated} tokens)",
                *([f"arms chosen (steps): {self.arms}"] if self.arms else []),
            ]
        )
