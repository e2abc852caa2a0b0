"""Run one speculative verification step on a random LM head and compare backends.

A greedy drafter (``tiled_argmax`` on the target's own rows, perturbed) proposes γ tokens per
sequence; ``verify_resample`` verifies them and emits the next tokens. Every backend asked for
runs on the same inputs and seeds, and the report says whether they emitted the same tokens.

python scripts/demo.py                       # tiny head, reference vs standard
python scripts/demo.py --head llama3-8b --batch 4 --gamma 6
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

import torch

from flashspec_export import cli, ops
from flashspec_export.config import HEAD_SHAPES, HeadShape
from flashspec_export.ops import backends


@dataclass(frozen=True)
class DemoConfig:
    head: str = "tiny"
    batch: int = 8
    gamma: int = 4
    temperature: float = 0.7
    seed: int = 0
    dtype: str = "float32"
    backends: tuple[str, ...] = ("reference", "standard")


@dataclass(frozen=True)
class DemoReport:
    shape: HeadShape
    tokens: dict[str, torch.Tensor]  # backend -> [batch, γ + 1] int64
    num_emitted: dict[str, torch.Tensor]  # backend -> [batch] int64
    seconds: dict[str, float]

    @property
    def backends_agree(self) -> bool:
        first = next(iter(self.tokens.values()))
        return all(torch.equal(first, t) for t in self.tokens.values())


def run(config: DemoConfig) -> DemoReport:
    """Run one speculative verification step with every backend in ``config.backends``."""
    shape = HeadShape.from_name(config.head)
    dtype = getattr(torch, config.dtype)
    g = torch.Generator().manual_seed(config.seed)
    rows = config.gamma + 1
    scale = 8.0 / shape.hidden_size**0.5  # logits with a spread typical of trained heads
    lm_head = (torch.randn(shape.padded_vocab, shape.hidden_size, generator=g) * scale).to(dtype)
    hidden = torch.randn(config.batch, rows, shape.hidden_size, generator=g).to(dtype)
    # The drafter: greedy on a noisy copy of the target's states, so some drafts are rejected.
    noisy = hidden.float() + 0.5 * torch.randn(hidden.shape, generator=g)
    drafts, _ = ops.tiled_argmax(
        noisy[:, : config.gamma].reshape(-1, shape.hidden_size).to(dtype), lm_head, shape.vocab_size
    )
    drafts = drafts.reshape(config.batch, config.gamma)
    seeds = torch.arange(config.batch) + config.seed
    tokens, emitted, seconds = {}, {}, {}
    for backend in config.backends:
        start = time.perf_counter()
        tokens[backend], emitted[backend] = ops.verify_resample(
            hidden, lm_head, drafts, config.temperature, seeds, 0, shape.vocab_size, backend=backend
        )
        seconds[backend] = time.perf_counter() - start
    return DemoReport(shape, tokens, emitted, seconds)


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("--head", default="tiny", choices=sorted(HEAD_SHAPES))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--temperature", type=float, default=0.7)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--backends",
        nargs="+",
        default=["reference", "standard"],
        choices=backends("verify_resample"),
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    report = run(
        DemoConfig(
            args.head,
            args.batch,
            args.gamma,
            args.temperature,
            args.seed,
            args.dtype,
            tuple(args.backends),
        )
    )
    shape = report.shape
    print(
        f"head {shape.name}: V={shape.vocab_size} (padded {shape.padded_vocab}), "
        f"H={shape.hidden_size}, gamma={args.gamma}, T={args.temperature}"
    )
    first = args.backends[0]
    for n, (row, k) in enumerate(zip(report.tokens[first], report.num_emitted[first], strict=True)):
        print(f"  seq {n}: emitted {int(k)}: {row[: int(k)].tolist()}")
    mean = report.num_emitted[first].float().mean()
    print(f"mean tokens per step: {mean:.2f} of {args.gamma + 1}")
    for backend, seconds in report.seconds.items():
        print(f"  {backend:>10}: {1e3 * seconds:8.1f} ms")
    print("backends agree on every token:", report.backends_agree)
    if not report.backends_agree:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
