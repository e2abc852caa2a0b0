"""Measure how often speculation leaves the text unchanged: the loop's tokens for every drafter,
γ and temperature against the γ = 0 loop's, same seeds (PyTorch modules, any device / dtype).

python scripts/check_invariance.py                                   # CPU, fp32: all equal
python scripts/check_invariance.py --device cuda --dtype bfloat16 --out invariance.json

The default target is tiny-llama with its LM head scaled by 100, so that drafts are accepted at
T > 0 (random weights give nearly flat distributions otherwise).
"""

from __future__ import annotations

import collections
import dataclasses
import json
import tempfile

import torch

from flashspec_export import cli
from flashspec_export.config import TARGET_PRESETS, TargetConfig
from flashspec_export.models.build import DRAFTERS, ExportConfig, build_modules
from flashspec_export.runtime import sessions
from flashspec_export.runtime.invariance import compare_with_plain
from flashspec_export.runtime.loop import generate


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--target", default="tiny-llama", choices=sorted(TARGET_PRESETS), help="target preset")
    add("--head-scale", type=float, default=100.0, help="LM-head scale (peaks the distributions)")
    add("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS, help="to compare")
    add("--gammas", nargs="+", type=cli.int_range(1, 64), default=[1, 3, 7], help="vs γ = 0")
    add("--temperatures", nargs="+", type=float, default=[0.6, 1.0, 1.5], help="T > 0")
    add("--batch", type=cli.int_range(1), default=3, help="sequences per run (one seed each)")
    add("--batches", type=cli.int_range(1), default=2, help="runs per (drafter, γ, T)")
    add("--new-tokens", type=cli.int_range(1), default=24, help="per sequence")
    add("--device", default="cpu", help="cpu or cuda")
    add("--dtype", default="float32", choices=["float32", "bfloat16", "float16"], help="modules")
    add("--out", default=None, help="JSON report path")
    args = parser.parse_args()
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device: {args.device} asked for, but torch.cuda.is_available() is False")

    checkpoint = tempfile.mkdtemp(prefix="invariance-target-")
    model = TargetConfig.from_name(args.target).build(seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(args.head_scale)
    model.save_pretrained(checkpoint)

    prompt_len = 6
    max_len = prompt_len + args.new_tokens + max(args.gammas)  # exactly what the loop needs
    dtype = getattr(torch, args.dtype)
    report = {"args": vars(args), "cases": []}
    for draft in args.drafters:
        config = ExportConfig(
            target=checkpoint,
            draft=draft,
            draft_model=checkpoint if draft == "model" else None,
            batch=args.batch,
            max_len=max_len,
        )
        modules = build_modules(config)
        for batch_index in range(args.batches):
            g = torch.Generator().manual_seed(batch_index)
            shape = (args.batch, prompt_len)
            prompt = torch.randint(0, model.config.vocab_size, shape, generator=g)
            prompt[:, 3:] = prompt[:, :3]  # a repetition the n-gram drafter can use
            seeds = torch.arange(args.batch) + 1000 * batch_index

            def run(gamma, temperature, seeds, modules=modules, prompt=prompt, draft=draft):
                runtime = sessions.from_modules(
                    modules, draft, args.batch, max_len, args.device, dtype
                )
                temps = torch.full((args.batch,), temperature)
                return generate(*runtime, prompt, args.new_tokens, gamma, temps, seeds)

            for case in compare_with_plain(run, args.gammas, args.temperatures, seeds):
                report["cases"].append({"drafter": draft, **dataclasses.asdict(case)})

    by_drafter = collections.defaultdict(list)
    for case in report["cases"]:
        by_drafter[case["drafter"]].append(case)
    print(f"{args.target} x{args.head_scale:g}, {args.dtype} on {args.device}:")
    for draft, cases in by_drafter.items():
        equal = sum(c["equal"] for c in cases)
        rate = sum(c["tokens_per_step"] for c in cases) / len(cases)
        print(f"  {draft:>6}: {equal}/{len(cases)} sequences equal γ = 0, {rate:.2f} tokens/step")
    total = sum(c["equal"] for c in report["cases"])
    print(f"  all: {total}/{len(report['cases'])} equal")
    report["equal"], report["total"] = total, len(report["cases"])
    if args.out:
        with open(args.out, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
