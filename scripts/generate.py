"""Speculative generation with an export's graphs in onnxruntime, or its TensorRT engines
(random prompt token ids).

python scripts/generate.py out/tiny-llama-mtp --new-tokens 32 --temperature 0.8
python scripts/generate.py out/tiny-llama-mtp --check     # also the PyTorch modules: same tokens?
python scripts/generate.py out/tiny-llama-mtp --engines   # TensorRT (scripts/build_engines.py)
"""

from __future__ import annotations

import json
import logging
import pathlib

from flashspec_export import cli
from flashspec_export.config import ConfigError
from flashspec_export.runtime.run import RunConfig, run


def main() -> None:
    parser = cli.parser(__doc__)
    d = RunConfig("")
    parser.add_argument("export_dir", help="an output directory of scripts/export.py")
    parser.add_argument("--new-tokens", type=int, default=d.new_tokens, help="per sequence")
    parser.add_argument("--prompt-len", type=int, default=d.prompt_len, help="random prompt ids")
    parser.add_argument("--temperature", type=float, default=d.temperature, help="0: greedy")
    parser.add_argument("--seed", type=int, default=d.seed, help="sequence i samples with seed + i")
    parser.add_argument("--check", action="store_true", help="compare with the PyTorch modules")
    parser.add_argument(
        "--engines", action="store_true", help="run <export>/engines with TensorRT (GPU)"
    )
    parser.add_argument("--metrics-json", default=None, help="also write the metrics as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    config = RunConfig(
        args.export_dir,
        args.new_tokens,
        args.prompt_len,
        args.temperature,
        args.seed,
        args.check,
        args.engines,
    )
    try:
        report = run(config)
    except (ConfigError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    result = report.onnx
    for row, tokens in enumerate(result.tokens):
        print(f"sequence {row}: {report.prompt[row].tolist()} -> {tokens}")
    print(f"-- {'TensorRT' if args.engines else 'onnxruntime, CPU'}")
    print(result.metrics.summary())
    if args.metrics_json:
        pathlib.Path(args.metrics_json).write_text(json.dumps(result.metrics.to_json(), indent=1))
    if report.matches is not None:
        print(f"PyTorch modules: {'same tokens' if report.matches else 'DIFFERENT tokens'}")
        if not report.matches:
            raise SystemExit(1)


if __name__ == "__main__":
    main()
