"""How often the GPU decode path's tokens differ from the exported graph's form: the stdlib-tiny
preset + its MTP head on CUDA, ``DeviceLoop`` (fused Triton decoder layers, one CUDA graph per
step) against the host loop over the PyTorch modules in the exported, functional form
(``sessions.from_modules``), same seeds, γ 3, random 16-token prompts, T = 0.8; bf16 and fp32.

Per sequence, tokens are compared up to and including the first difference (after it the two
texts part ways); the flip rate is differences / tokens compared.

python docs/bench/fused_agreement.py --json docs/bench/fused_agreement_h100.json
"""

from __future__ import annotations

import argparse
import json
import pathlib

import torch

from flashspec_export.models.build import ExportConfig, build_modules
from flashspec_export.runtime import sessions
from flashspec_export.runtime.device_loop import DeviceLoop
from flashspec_export.runtime.loop import generate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=5)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    gamma, max_len, rows = 3, 16 + args.new_tokens + 8, []
    print("| dtype | sequences identical | tokens compared | differences | flip rate |")
    print("|---|---:|---:|---:|---:|")
    for dtype in ("bfloat16", "float32"):
        config = ExportConfig(dtype=dtype, batch=args.batch, max_len=max_len, gamma=gamma)
        reference = sessions.from_modules(
            build_modules(config), "mtp", args.batch, max_len, "cuda", getattr(torch, dtype)
        )
        modules = build_modules(config)
        for module in (modules.model, modules.drafter):
            module.to("cuda")
        loop = DeviceLoop(modules.model, modules.drafter, args.batch, max_len, gamma)
        vocab = modules.model.config.vocab_size
        compared, firsts, sequences = 0, [], 0
        for batch in range(args.batches):
            g = torch.Generator().manual_seed(batch)
            prompt = torch.randint(0, vocab, (args.batch, 16), generator=g)
            temperature = torch.full((args.batch,), args.temperature)
            seed = torch.arange(args.batch) + 100 * batch
            want = generate(*reference, prompt, args.new_tokens, gamma, temperature, seed)
            got, _ = loop.generate(prompt, args.new_tokens, temperature, seed)
            for a, b in zip(want.tokens, got, strict=True):
                sequences += 1
                first = next((i for i, (x, y) in enumerate(zip(a, b, strict=True)) if x != y), None)
                compared += len(a) if first is None else first + 1
                if first is not None:
                    firsts.append(first)
        row = dict(dtype=dtype, sequences=sequences, compared=compared, first_differences=firsts)
        row["flip_rate"] = len(firsts) / compared
        rows.append(row)
        print(
            f"| {dtype} | {sequences - len(firsts)} / {sequences} | {compared} | {len(firsts)} | "
            f"{row['flip_rate']:.2%} |",
            flush=True,
        )
    if args.json:
        report = {"setup": vars(args), "device": torch.cuda.get_device_name(), "rows": rows}
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
