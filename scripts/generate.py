"""Speculative generation with an export's graphs in onnxruntime, its TensorRT engines, or the
PyTorch modules it was made from in the device-resident loop (--device cuda: fused layers, one
CUDA graph per step; --device cpu: the same loop on the CPU): text prompts through the export's
tokenizer (streamed as tokens are accepted), or random token ids.

python scripts/generate.py out/stdlib-tiny-mtp --prompt "def parse_args(" --temperature 0
python scripts/generate.py out/stdlib-tiny-mtp --prompt-file f.py --stop "\\n\\n\\n" --select ucb1
python scripts/generate.py out/tiny-llama-mtp --check     # random ids; PyTorch: same tokens?
python scripts/generate.py out/tiny-llama-mtp --engines   # TensorRT (scripts/build_engines.py)
python scripts/generate.py out/stdlib-tiny-mtp --prompt "def parse_args(" --device cuda
python scripts/generate.py out/sp --top-k 40 --top-p 0.9  # scripts/export.py --sampling-params
python scripts/generate.py out/a --prompt "[" --allowed-chars "0123456789, ]"  # --allowed-tokens
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys

from flashspec_export import cli
from flashspec_export.config import ConfigError
from flashspec_export.runtime.run import RunConfig, run
from flashspec_export.runtime.selection import POLICIES


def _prompts(args, parser) -> tuple[str, ...]:
    prompts = list(args.prompt or [])
    for name in args.prompt_file or []:
        try:
            prompts.append(pathlib.Path(name).read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as error:
            parser.exit(2, f"error: prompt-file: cannot read {name} ({error})\n")
    return tuple(prompts)


def main() -> None:
    parser = cli.parser(__doc__)
    d = RunConfig("")
    add = parser.add_argument
    add("export_dir", help="an output directory of scripts/export.py")
    add("--prompt", action="append", help="a text prompt (repeat: one per sequence of the batch)")
    add("--prompt-file", action="append", help="a file whose text is a prompt (repeatable)")
    add(
        "--stop",
        action="append",
        type=cli.unescaped,
        help="stop a sequence at this text (repeatable; backslash escapes such as \\n)",
    )
    add("--new-tokens", type=int, default=d.new_tokens, help="at most, per sequence")
    add("--prompt-len", type=int, default=d.prompt_len, help="random prompt ids (no --prompt)")
    add("--temperature", type=float, default=d.temperature, help="0: greedy")
    add("--seed", type=int, default=d.seed, help="sequence i samples with seed + i")
    add(
        "--top-k",
        type=int,
        help="sample among the k likeliest tokens (0: off; needs an export with --sampling-params)",
    )
    add("--top-p", type=float, help="then among the nucleus of mass p in (0, 1] (1: off; ditto)")
    add(
        "--allowed-chars",
        type=cli.unescaped,
        metavar="CHARS",
        help="only tokens made of these characters, and EOS (an export with --allowed-tokens)",
    )
    add("--select", choices=sorted(POLICIES), help="choose drafter and gamma online (bandit)")
    add("--check", action="store_true", help="compare with the PyTorch modules")
    add("--engines", action="store_true", help="run <export>/engines with TensorRT (GPU)")
    add(
        "--device",
        choices=["cpu", "cuda"],
        help="run the device loop here: the PyTorch modules the export was made from",
    )
    add("--metrics-json", default=None, help="also write the metrics as JSON")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    prompts = _prompts(args, parser)
    stop = tuple(args.stop or [])
    live = len(prompts) == 1  # one sequence streams as it is generated; several print at the end

    def echo(row, piece):
        sys.stdout.write(piece)
        sys.stdout.flush()

    config = RunConfig(
        args.export_dir,
        args.new_tokens,
        args.prompt_len,
        args.temperature,
        args.seed,
        args.check,
        args.engines,
        prompts,
        stop,
        args.select,
        echo if live else None,
        top_k=args.top_k,
        top_p=args.top_p,
        allowed_chars=args.allowed_chars,
        device=args.device,
    )
    if live:
        sys.stdout.write(prompts[0])
    try:
        report = run(config)
    except (ConfigError, FileNotFoundError) as error:
        parser.exit(2, f"{chr(10) if live else ''}error: {error}\n")
    result = report.onnx
    if live:
        print()
    elif report.texts is not None:
        for row, (prompt, generated) in enumerate(zip(prompts, report.texts, strict=True)):
            print(f"--- sequence {row}\n{prompt}{generated}")
    else:
        for row, tokens in enumerate(result.tokens):
            print(f"sequence {row}: {report.prompt[row]} -> {tokens}")
    backend = "TensorRT" if args.engines else "onnxruntime, CPU"
    print(f"-- {f'device loop, {args.device}' if args.device else backend}")
    print(result.metrics.summary())
    if args.metrics_json:
        pathlib.Path(args.metrics_json).write_text(json.dumps(result.metrics.to_json(), indent=1))
    if report.matches is not None:
        dtype = report.dtype
        if report.matches:
            print(f"PyTorch modules ({dtype}): same tokens")
        elif report.first_difference is None:
            print(f"PyTorch modules ({dtype}): same tokens, DIFFERENT steps")
        else:
            row, index = report.first_difference
            print(f"PyTorch modules ({dtype}): DIFFERENT from token {index} of sequence {row}")
        if not report.matches and dtype == "float32":
            raise SystemExit(1)  # exact in fp32; bf16 / fp16 rounding may flip a near-tie


if __name__ == "__main__":
    main()
