"""Benchmark the fused ops against cuBLAS and the materialised path on a CUDA GPU.

python scripts/bench_kernels.py --out bench.json --plot bench.png
python scripts/bench_kernels.py --heads llama3-8b --rows 1 8 64 --providers verify_resample matmul
"""

from __future__ import annotations

import torch
from kernel_bench import PROVIDERS, BenchConfig, markdown, run, write_report

from flashspec_export import cli
from flashspec_export.config import HEAD_SHAPES


def main() -> None:
    parser = cli.parser(__doc__)
    defaults = BenchConfig()
    add = parser.add_argument
    add("--heads", nargs="+", default=defaults.heads, choices=sorted(HEAD_SHAPES), help="LM heads")
    add("--rows", nargs="+", type=cli.int_range(1), default=defaults.rows, help="R = N·(γ+1)")
    add("--providers", nargs="+", default=defaults.providers, choices=PROVIDERS, help="to time")
    parser.add_argument(
        "--dtype", default=defaults.dtype, choices=["bfloat16", "float16", "float32"]
    )
    parser.add_argument(
        "--rep-ms", type=cli.int_range(1), default=defaults.rep_ms, help="GPU ms per timed replay"
    )
    parser.add_argument(
        "--settle-ms",
        type=cli.int_range(0),
        default=defaults.settle_ms,
        help="GPU ms of untimed replays before each timed one (clocks settle at the power limit)",
    )
    parser.add_argument("--out", default="bench_kernels.json", help="JSON report path")
    parser.add_argument("--plot", default=None, help="PNG plot path")
    args = parser.parse_args()
    if not torch.cuda.is_available():
        parser.exit(2, "error: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    config = BenchConfig(
        heads=tuple(args.heads),
        rows=tuple(args.rows),
        providers=tuple(args.providers),
        dtype=args.dtype,
        rep_ms=args.rep_ms,
        settle_ms=args.settle_ms,
    )
    report = run(config, progress=lambda line: print(line, flush=True))
    write_report(report, args.out, args.plot)
    print(markdown(report))
    print(f"copy bandwidth {report['copy_gbps']:.0f} GB/s on {report['environment']['gpu']}")


if __name__ == "__main__":
    main()
