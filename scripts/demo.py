"""Run one speculative verification step on a random LM head and compare backends.

python scripts/demo.py                       # tiny head, reference vs standard
python scripts/demo.py --head llama3-8b --batch 4 --gamma 6
"""

from __future__ import annotations

import logging

from flashspec_export import cli
from flashspec_export.config import HEAD_SHAPES
from flashspec_export.demo import DemoConfig, run
from flashspec_export.ops import backends


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
