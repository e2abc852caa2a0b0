"""Online drafter selection on the GPU against every fixed (drafter, γ): the stdlib-tiny pair in
the device loop (``runtime/device_loop.py``: fused layers, a CUDA graph per arm), two prompt
kinds from held-out standard-library files — code (a chunk starting at a ``def``) and prose-like
docstrings (a chunk starting inside one) — one request at a time (batch 1), ``--new-tokens``
each.

Per drafter (MTP, EAGLE, draft model, n-gram lookup) and γ: tokens per step, acceptance per
draft position and tokens/s (generated tokens / wall time of the ``generate`` call, the host's
reads included); γ = 0 (plain decoding) for scale. Then ``--select`` as ``scripts/generate.py``
runs it — the arms of an MTP export (MTP and n-gram at γ 1 .. ``--gamma``), a fresh policy per
request, rewarded by device time — as a fraction of the best fixed arm among those it chooses
from. Every run's text is checked equal to plain decoding's (same seeds). JSON with
``--json``; timings median of ``--repeats``.

With ``--shapes`` (the decode benchmark's random-weight shapes, e.g. ``llama3.2-1b-shape
llama3-8b-shape``) it chooses γ alone: an MTP drafter whose drafts are the plain run's text kept
with probability ``--alpha`` (``bench_decode.controlled_filter``), arms γ 1 .. ``--gamma``, at
``--batches``, T = 1, against every fixed γ. The control holds while the loop's text is the
plain run's: at batch 1 it is (tokens per step as α predicts); at batch 16 the decoder's
(γ + 1)-row steps round their bf16 hidden states unlike the plain one-row steps and the text
drifts from the oracle at some γ (its tokens per step collapse to ~1.4: the JSON shows it),
so only batch 1 is the default.

python scripts/bench_select.py --json docs/bench/select_h100.json
python scripts/bench_select.py --drafters mtp --prompts 8 --select-rounds 8 16 \
    --discounts 0.97 0.98 0.99 0.995 --json docs/bench/select_sweep_h100.json
python scripts/bench_select.py --shapes llama3.2-1b-shape llama3-8b-shape --gamma 7 --repeats 5 \
    --json docs/bench/select_shapes_h100.json
"""

from __future__ import annotations

import itertools
import json
import logging
import pathlib
import re
import statistics
import sys

import torch

from flashspec_export import cli
from flashspec_export.models.build import ExportConfig, build_modules, resolve_trained
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import selection
from flashspec_export.runtime.device_loop import SELECT_ROUND, DeviceLoop
from flashspec_export.runtime.metrics import Metrics
from flashspec_export.training import corpus

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))  # bench_decode, with --shapes

KINDS = {
    "code": re.compile(r"^(    )?def \w+\(", re.M),  # a function, from its signature
    "docstring": re.compile(r'"""[A-Z][a-z]+ [a-z]+ [a-z]+'),  # a docstring, from its first words
}


def prompts_of(tokenizer, kind: str, count: int, tokens: int) -> list[list[int]]:
    """``count`` prompts of ``tokens`` tokens: the first match of ``KINDS[kind]`` in each
    held-out file that has one (a file gives at most one prompt)."""
    prompts = []
    for path in corpus.stdlib_files():
        if not corpus.is_held_out(path):
            continue
        text = corpus.read(path)
        match = KINDS[kind].search(text)
        if match is None:
            continue
        ids = tokenizer.encode(text[match.start() :], add_special_tokens=False)
        if len(ids) >= tokens:
            prompts.append(ids[:tokens])
        if len(prompts) == count:
            return prompts
    raise SystemExit(f"only {len(prompts)} held-out files have a {kind} prompt of {tokens} tokens")


def run_requests(loop, prompts, new_tokens, temperature, repeats, **how):
    """Every prompt as its own request; per repeat the tokens/s over all of them (generated /
    wall seconds), and the pooled metrics and tokens of the last repeat."""
    speeds = []
    for _ in range(repeats):
        seconds, generated, tokens = 0.0, 0, []
        pooled = Metrics(loop.gamma, 1)
        for i, prompt in enumerate(prompts):
            seeds = torch.tensor([i])
            policy = how.get("select")
            if policy is not None:
                discount = how.get("discount", selection.DISCOUNT)
                how["policy"] = selection.make_policy(policy, loop.arms, seed=i, discount=discount)
            args = {k: v for k, v in how.items() if k not in ("select", "discount")}
            out, m = loop.generate(
                [prompt], new_tokens, torch.full((1,), temperature), seeds, **args
            )
            seconds += m.total_seconds
            generated += m.generated
            tokens.append(out[0])
            pooled.steps += m.steps
            pooled.sequence_steps += m.sequence_steps
            pooled.emitted += m.emitted
            pooled.accepted_at = [
                a + b for a, b in zip(pooled.accepted_at, m.accepted_at, strict=True)
            ]
            pooled.drafted_at = [
                a + b for a, b in zip(pooled.drafted_at, m.drafted_at, strict=True)
            ]
            for arm, steps in m.arms.items():
                pooled.arms[arm] = pooled.arms.get(arm, 0) + steps
        speeds.append(generated / seconds)
    return statistics.median(speeds), pooled, tokens


def _speed(loop, prompt, new_tokens, temps, seeds, repeats, **how):
    """Median tokens/s of ``repeats`` requests after a warm-up (the capture), and the last
    one's metrics; ``select=`` a fresh policy per request."""
    runs = []
    for repeat in range(repeats + 1):
        if "select" in how:
            how["policy"] = selection.make_policy(how["select"], loop.arms, seed=repeat)
        kw = {k: v for k, v in how.items() if k != "select"}
        _, m = loop.generate(prompt, new_tokens, temps, seeds, **kw)
        runs.append((m.generated / m.total_seconds, m))
    return statistics.median(r for r, _ in runs[1:]), runs[-1][1]


def shapes(args) -> dict:
    """γ chosen online on random-weight shapes with controlled acceptance (see the docstring)."""
    from bench_decode import controlled_filter

    from flashspec_export.config import TargetConfig
    from flashspec_export.models.mtp import MtpDrafter

    rows, bandits = [], []
    for name in args.shapes:
        preset = TargetConfig.from_name(name)
        model = preset.build(seed=0, device="cuda", dtype=torch.bfloat16)
        with torch.device("cuda"):
            drafter = MtpDrafter(model, seed=1).to(torch.bfloat16).eval()
        for batch in args.batches:
            g = torch.Generator().manual_seed(batch)
            prompt = torch.randint(0, preset.vocab_size, (batch, args.prompt_tokens), generator=g)
            max_len = args.prompt_tokens + args.new_tokens + args.gamma + 1
            temps, seeds = torch.ones(batch), torch.arange(batch)
            plain = DeviceLoop(model, None, batch, max_len, 0)
            text, _ = plain.generate(prompt, args.new_tokens, temps, seeds)
            oracle = torch.cat([prompt, torch.tensor(text)], dim=1)
            oracle = torch.nn.functional.pad(oracle, (0, max_len + 1 - oracle.shape[1])).cuda()
            keep = torch.rand(oracle.shape, generator=g).cuda() < args.alpha
            arms = [selection.Arm("mtp", gamma) for gamma in range(1, args.gamma + 1)]
            draft_filter = controlled_filter(oracle, keep, preset.vocab_size)
            loop = DeviceLoop(
                model, drafter, batch, max_len, args.gamma, arms=arms, draft_filter=draft_filter
            )
            request = (loop, prompt, args.new_tokens, temps, seeds, args.repeats)

            fixed = {}
            for arm in arms:
                fixed[arm.gamma], m = _speed(*request, arm=arm)
                rows.append(dict(shape=name, batch=batch, gamma=arm.gamma,
                                 tokens_per_second=fixed[arm.gamma],
                                 tokens_per_step=m.tokens_per_step))  # fmt: skip
            best = max(fixed, key=fixed.get)
            line = " ".join(f"γ{g} {v:.0f}" for g, v in fixed.items())
            print(f"{name} batch {batch}: {line}", flush=True)
            for policy in sorted(selection.POLICIES):
                value, m = _speed(*request, select=policy)
                share = value / fixed[best]
                bandits.append(dict(shape=name, batch=batch, policy=policy, tokens_per_second=value,
                                    of_best=share, best_gamma=best, arms=m.arms))  # fmt: skip
                print(f"  {policy}: {value:.0f} tokens/s = {100 * share:.1f}% of γ {best} "
                      f"({fixed[best]:.0f}); steps per arm {m.arms}", flush=True)  # fmt: skip
        del model, drafter
        torch.cuda.empty_cache()
    return {"rows": rows, "bandits": bandits}


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--drafters", nargs="+", default=["mtp", "eagle", "model", "ngram"])
    add("--gamma", type=cli.int_range(1, 16), default=5, help="the largest γ swept")
    add("--prompts", type=cli.int_range(1), default=4, help="requests per prompt kind")
    add("--prompt-tokens", type=cli.int_range(2), default=64)
    add("--new-tokens", type=cli.int_range(1), default=512)
    add("--temperature", type=float, default=0.0)
    add("--repeats", type=cli.int_range(1), default=3)
    add("--select-rounds", nargs="+", type=cli.int_range(1), default=[SELECT_ROUND])
    add("--discounts", nargs="+", type=float, default=[selection.DISCOUNT], help="the policies'")
    add("--device", default="cuda", choices=["cuda", "cpu"], help="cpu: a smoke run")
    add("--shapes", nargs="+", default=None, help="random-weight shapes: choose γ (see above)")
    add("--batches", nargs="+", type=cli.int_range(1), default=[1], help="with --shapes")
    add("--alpha", type=float, default=0.8, help="with --shapes: a draft's keep probability")
    add("--json", default=None)
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    if args.shapes:
        out = shapes(args)
        if args.json:
            setup = {k: v for k, v in vars(args).items() if k != "json"}
            gpu = torch.cuda.get_device_name()
            pathlib.Path(args.json).write_text(json.dumps({"gpu": gpu, "setup": setup, **out}))
        return
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_trained(ExportConfig()).target)
    kinds = {k: prompts_of(tokenizer, k, args.prompts, args.prompt_tokens) for k in KINDS}
    max_len = args.prompt_tokens + args.new_tokens + args.gamma + 1
    gpu = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    dtype = "bfloat16" if args.device == "cuda" else "float32"
    print(
        f"{gpu}; stdlib-tiny {dtype}, batch 1, {args.prompts} requests per kind of "
        f"{args.prompt_tokens} prompt tokens + {args.new_tokens} new, T = {args.temperature}"
    )
    rows, plain = [], {}
    loops = {}
    for draft in [None, *args.drafters]:
        config = ExportConfig(draft=draft or "mtp", max_len=max_len, dtype=dtype)
        modules = build_modules(config)
        model = modules.model.to(args.device)
        if draft is None:
            loop = DeviceLoop(model, None, 1, max_len, 0)
            gammas = [0]
        else:
            drafter = NgramDrafter() if draft == "ngram" else modules.drafter.to(args.device)
            arms = [selection.Arm(draft, g) for g in range(1, args.gamma + 1)]
            if draft == "mtp":  # the arms --select chooses from
                arms = selection.arms_for("mtp", args.gamma)
            loop = DeviceLoop(model, drafter, 1, max_len, args.gamma, arms=arms)
            loops[draft] = loop
            gammas = range(1, args.gamma + 1)
        for gamma in gammas:
            arm = None if draft is None else selection.Arm(draft, gamma)
            for kind, prompts in kinds.items():
                how = {} if arm is None else {"arm": arm}
                speed, m, tokens = run_requests(
                    loop, prompts, args.new_tokens, args.temperature, args.repeats, **how
                )
                if draft is None:
                    plain[kind] = tokens
                row = dict(
                    drafter=draft or "none", gamma=gamma, kind=kind, tokens_per_second=speed,
                    tokens_per_step=m.tokens_per_step, acceptance=m.acceptance,
                    same_text=tokens == plain[kind],
                )  # fmt: skip
                rows.append(row)
                rates = " ".join(f"{r:.2f}" for r in m.acceptance)
                print(f"| {row['drafter']} | {gamma} | {kind} | {speed:.0f} | "
                      f"{m.tokens_per_step:.2f} | {rates} |", flush=True)  # fmt: skip
    if "mtp" in loops:
        # n-gram arms in the MTP loop (the graph drafter catches up on their steps, as there)
        for gamma in range(1, args.gamma + 1):
            for kind, prompts in kinds.items():
                arm = selection.Arm("ngram", gamma)
                speed, m, tokens = run_requests(
                    loops["mtp"], prompts, args.new_tokens, args.temperature, args.repeats, arm=arm
                )
                rows.append(dict(
                    drafter="ngram beside mtp", gamma=gamma, kind=kind, tokens_per_second=speed,
                    tokens_per_step=m.tokens_per_step, acceptance=m.acceptance,
                    same_text=tokens == plain[kind],
                ))  # fmt: skip
                print(f"| ngram beside mtp | {gamma} | {kind} | {speed:.0f} | "
                      f"{m.tokens_per_step:.2f} |", flush=True)  # fmt: skip
    bandits = []
    if "mtp" in loops:
        loop = loops["mtp"]
        for kind, prompts in kinds.items():
            choosable = ("mtp", "ngram beside mtp")
            choices = [r for r in rows if r["kind"] == kind and r["drafter"] in choosable]
            best = max(choices, key=lambda r: r["tokens_per_second"])
            for policy in sorted(selection.POLICIES):
                for select_round, discount in itertools.product(args.select_rounds, args.discounts):
                    speed, m, tokens = run_requests(
                        loop, prompts, args.new_tokens, args.temperature, args.repeats,
                        select=policy, select_round=select_round, discount=discount,
                    )  # fmt: skip
                    share = speed / best["tokens_per_second"]
                    bandits.append(dict(
                        kind=kind, policy=policy, select_round=select_round, discount=discount,
                        tokens_per_second=speed, of_best=share, arms=m.arms,
                        best=f"{best['drafter']}:{best['gamma']}",
                        same_text=tokens == plain[kind],
                    ))  # fmt: skip
                    print(
                        f"{kind}: {policy} round {select_round} discount {discount}: "
                        f"{speed:.0f} tokens/s = "
                        f"{100 * share:.1f}% of the best arm {best['drafter']}:{best['gamma']} "
                        f"({best['tokens_per_second']:.0f}); steps per arm {m.arms}",
                        flush=True,
                    )
    same = all(r["same_text"] for r in rows + bandits)
    print("every run's text = plain decoding's:", same)
    if args.json:
        setup = {k: v for k, v in vars(args).items() if k != "json"}
        out = {"gpu": gpu, "setup": setup, "rows": rows, "bandits": bandits, "same_text": same}
        pathlib.Path(args.json).write_text(json.dumps(out, indent=1))
    if not same and dtype == "bfloat16":
        print("note: bf16 logits of different step widths may round a near-tie differently")


if __name__ == "__main__":
    main()
