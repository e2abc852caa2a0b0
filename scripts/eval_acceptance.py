"""Acceptance of a trained preset's drafters on held-out standard-library files (T = 0).

Every held-out file (``training/corpus.py``: a tenth of the stdlib, never trained on) gives a
prompt of its first ``--prompt-tokens`` tokens; each drafter at each γ then generates
``--new-tokens`` greedily with the PyTorch modules an export is made of (the same graphs
``scripts/export.py`` writes; their tokens match onnxruntime's, tests/runtime). Reported: mean
tokens per target step and per-position acceptance per real draft, and in the JSON the share of
steps drafting each position (the n-gram drafter leaves positions it has nothing for as -1); the
text is the same for every drafter.

python scripts/eval_acceptance.py                       # stdlib-tiny, γ 3 and 5, JSON to stdout
python scripts/eval_acceptance.py --files 40 --json docs/bench/acceptance_stdlib_tiny.json
"""

from __future__ import annotations

import json
import logging
import pathlib

import torch

from flashspec_export import cli
from flashspec_export.models.build import DRAFTERS, ExportConfig, build_modules, resolve_trained
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate
from flashspec_export.training import corpus


def held_out_prompts(tokenizer, files: int, prompt_tokens: int) -> list[list[int]]:
    """The first ``prompt_tokens`` tokens of the first ``files`` held-out files long enough."""
    prompts = []
    for path in corpus.stdlib_files():
        if corpus.is_held_out(path):
            ids = tokenizer.encode(corpus.read(path), add_special_tokens=False)
            if len(ids) >= 2 * prompt_tokens:
                prompts.append(ids[:prompt_tokens])
        if len(prompts) == files:
            break
    return prompts


def evaluate(preset: str, draft: str, gamma: int, prompts, new_tokens: int) -> dict:
    batch = len(prompts)
    max_len = len(prompts[0]) + new_tokens + gamma + 1
    config = ExportConfig(
        target=preset, draft=draft, gamma=gamma, batch=batch, max_len=max_len, dtype="float32"
    )  # fp32: every drafter and γ give the same text at T = 0
    modules = build_modules(config)
    target, drafter = sessions.from_modules(modules, draft, batch, max_len)
    zeros = torch.zeros(batch)
    result = generate(target, drafter, prompts, new_tokens, gamma, zeros, zeros.long())
    m = result.metrics
    return {
        "drafter": draft,
        "gamma": gamma,
        "tokens_per_step": m.tokens_per_step,
        "acceptance": m.acceptance,
        "drafted": [d / m.sequence_steps for d in m.drafted_at],
        "tokens": result.tokens,
    }


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--preset", default="stdlib-tiny", help="a trained preset or train_tiny.py directory")
    add("--drafters", nargs="+", default=["ngram", "mtp", "eagle", "model"], choices=DRAFTERS)
    add("--gammas", nargs="+", type=cli.int_range(1, 16), default=[3, 5])
    add("--files", type=cli.int_range(1), default=16, help="held-out files (one prompt each)")
    add("--prompt-tokens", type=cli.int_range(2), default=64)
    add("--new-tokens", type=cli.int_range(1), default=64)
    add("--json", default=None, help="write the results here")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    target_dir = resolve_trained(ExportConfig(target=args.preset)).target
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    prompts = held_out_prompts(tokenizer, args.files, args.prompt_tokens)
    rows, reference = [], None
    print(f"{len(prompts)} held-out prompts of {args.prompt_tokens} tokens, T = 0")
    print("| drafter | γ | tokens/step | acceptance by position |")
    print("|---|---:|---:|---|")
    for draft in args.drafters:
        for gamma in args.gammas:
            row = evaluate(args.preset, draft, gamma, prompts, args.new_tokens)
            tokens = row.pop("tokens")
            reference = reference or tokens
            row["same_text"] = tokens == reference
            rows.append(row)
            rates = " ".join(f"{r:.2f}" for r in row["acceptance"])
            print(f"| {draft} | {gamma} | {row['tokens_per_step']:.2f} | {rates} |", flush=True)
    if not all(r["same_text"] for r in rows):
        raise SystemExit("the drafters gave different text at T = 0: a bug")
    if args.json:
        setup = {k: v for k, v in vars(args).items() if k != "json"}
        pathlib.Path(args.json).write_text(json.dumps({"setup": setup, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
