"""Export a target LLM and a drafter to ONNX with FlashSpec custom nodes.

python scripts/export.py --target tiny-llama --draft mtp --out out/tiny-llama-mtp
python scripts/export.py --target /path/to/hf-checkpoint --draft ngram --gamma 4 --out out/x
"""

from __future__ import annotations

import argparse
import logging

from flashspec_export import cli
from flashspec_export.config import GRAPH_OPSETS, TARGET_PRESETS, ConfigError
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import DRAFTERS, DTYPES, ExportConfig


def main() -> None:
    parser = cli.parser(__doc__)
    d = ExportConfig()
    parser.add_argument(
        "--target",
        default=d.target,
        help=f"preset ({', '.join(TARGET_PRESETS)}) or checkpoint directory",
    )
    parser.add_argument("--draft", default=d.draft, choices=DRAFTERS, help="the drafter")
    parser.add_argument("--out", default=None, help="output directory; None: out/TARGET-DRAFT")
    parser.add_argument("--gamma", type=int, default=d.gamma, help="drafts per step (0..64)")
    parser.add_argument("--batch", type=int, default=d.batch, help="sequences (static)")
    parser.add_argument("--max-len", type=int, default=d.max_len, help="KV-cache length (static)")
    parser.add_argument("--seed", type=int, default=d.seed, help="seed of preset weights")
    parser.add_argument("--draft-weights", default=None, help="state dict of an mtp/eagle drafter")
    parser.add_argument(
        "--draft-model",
        default=None,
        help="--draft model: preset (e.g. tiny-draft-llama) or checkpoint directory",
    )
    parser.add_argument(
        "--dtype",
        default=d.dtype,
        choices=("auto", *DTYPES),
        help="weights, activations and KV cache (auto: the checkpoint's; presets: float32)",
    )
    parser.add_argument(
        "--opset",
        type=int,
        default=d.opset,
        choices=GRAPH_OPSETS,
        help="24: Attention + TensorScatter (cache written in place); 18: for runtimes without",
    )
    parser.add_argument(
        "--sampling-params",
        action="store_true",
        help="the target step takes per-sequence top_k / top_p inputs (generate.py --top-k/-p)",
    )
    parser.add_argument(
        "--allowed-tokens",
        action="store_true",
        help="the target step takes per-row allowed-token masks (generate.py --allowed-chars)",
    )
    parser.add_argument(
        "--logprobs",
        action=argparse.BooleanOptionalAction,
        default=d.logprobs,
        help="the target step returns the emitted tokens' log-probabilities (--no-logprobs: "
        "no logprobs output; the verify skips the log-sum-exp)",
    )
    parser.add_argument("--force", action="store_true", help="overwrite a non-empty --out")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    out = args.out or f"out/{args.target.rstrip('/').split('/')[-1]}-{args.draft}"
    config = ExportConfig(
        args.target,
        args.draft,
        out,
        args.gamma,
        args.batch,
        args.max_len,
        args.seed,
        args.force,
        args.draft_weights,
        args.draft_model,
        args.dtype,
        args.opset,
        args.sampling_params,
        args.logprobs,
        args.allowed_tokens,
    )
    try:
        manifest = export(config)
    except (ConfigError, FileExistsError) as error:
        parser.exit(2, f"error: {error}\n")
    for graph in manifest.graphs.values():
        print(f"{out}/{graph.file}: {len(graph.inputs)} inputs, {len(graph.outputs)} outputs")
    sampling = ", ".join(manifest.sampling_params)
    print(
        f"{out}/manifest.json: {manifest.architecture}, vocab {manifest.vocab_size}, "
        f"{manifest.dtype}, opset {manifest.opset}, gamma {manifest.gamma}, "
        f"drafter {manifest.drafter}{f', sampling params {sampling}' if sampling else ''}"
        f"{', allowed-token masks' if args.allowed_tokens else ''}"
        f"{'' if args.logprobs else ', no logprobs'}"
    )


if __name__ == "__main__":
    main()
