"""Benchmark the fused ops against cuBLAS and the materialised path on a CUDA GPU.

python scripts/bench_kernels.py --out bench.json --plot bench.png
python scripts/bench_kernels.py --heads llama3-8b --rows 1 8 64 --providers verify_resample matmul
"""

from __future__ import annotations

import argparse

import torch

from flashspec_export.benchmark import PROVIDERS, BenchConfig, markdown, run, write_report
from flashspec_export.config import HEAD_SHAPES


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    defaults = BenchConfig()
    parser.add_argument("--heads", nargs="+", default=defaults.heads, choices=sorted(HEAD_SHAPES))
    parser.add_argument("--rows", nargs="+", type=int, default=defaults.rows)
    parser.add_argument("--providers", nargs="+", default=defaults.providers, choices=PROVIDERS)
    parser.add_argument(
        "--dtype", default=defaults.dtype, choices=["bfloat16", "float16", "float32"]
    )
    parser.add_argument("--repeats", type=int, default=defaults.repeats)
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
        repeats=args.repeats,
    )
    report = run(config, progress=lambda line: print(line, flush=True))
    write_report(report, args.out, args.plot)
    print(markdown(report))
    print(f"copy bandwidth {report['copy_gbps']:.0f} GB/s on {report['environment']['gpu']}")


if __name__ == "__main__":
    main()
