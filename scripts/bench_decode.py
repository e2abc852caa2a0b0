"""End-to-end speculative decoding on a CUDA GPU: what the fused ops buy in tokens/s.

For each model shape (random bf16 weights, an MTP drafter: one decoder layer + the shared LM
head), batch and γ, three decoders run the same device-resident loop (runtime/device_loop.py,
CUDA graphs) in one process:

- ``flashspec``: fused VerifyResample (Triton) and TiledArgmax drafting;
- ``materialised``: the same loop with the sampler a serving stack runs (fp32 logits of every
  row, then argmax at T = 0) and matmul + argmax drafting;
- ``plain``: no speculation (one token per step, the materialised sampler).

Acceptance is controlled: the drafter runs the real MTP compute, then proposes the decoder's own
continuation with each draft kept with probability alpha (a fixed random table per (sequence,
position), the same for both speculative decoders) and otherwise corrupted, so the expected
tokens per step is (1 - alpha^(γ+1)) / (1 - alpha). "The decoder's own continuation" is that of
the decoder being timed: a random-weight model's near-flat logits make its argmax flip with bf16
rounding, and a (γ+1)-row forward rounds unlike the plain one-row forward, so the untimed first
run of each decoder (drafts from the plain run's text) records its own text, which then drafts
the timed runs. At T > 0 (``--temperature``) FlashSpec's text is still a function of the seeds
and positions (one Gumbel-max sample per position), so the same control holds; the materialised
decoder runs its whole rejection sampler (softmax, p(draft), torch uniforms, the residual, the
exponential race) and then takes the controlled outcome, so both emit the same tokens per step
and only the compute differs.

python scripts/bench_decode.py --out decode.json --plot decode.png
python scripts/bench_decode.py --models llama3.2-1b-shape --batches 1 --gammas 3
python scripts/bench_decode.py --temperature 1.0 --gammas 3 --out decode_t1.json
"""

from __future__ import annotations

import json
import statistics
import time

import torch

from flashspec_export import cli
from flashspec_export.config import TargetConfig
from flashspec_export.models.mtp import MtpDrafter
from flashspec_export.runtime.device_loop import DeviceLoop

MODELS = ("llama3.2-1b-shape", "qwen3-1.7b-shape", "llama3-8b-shape")


def materialised_ops(sampling: bool, oracle: torch.Tensor | None = None):
    """The unfused baseline: fp32 logits of every row, then the sampler a serving stack runs.

    T = 0 (``sampling`` False): argmax, accept while equal. T > 0: softmax, p(draft), a torch
    uniform per draft, the residual without the draft and the exponential race over it (the
    bonus row over p): what vLLM's rejection sampler computes for greedy (one-hot) drafts.
    With ``oracle`` (the controlled drafter's text, per absolute position) that sampler still
    runs in full, but its outcome is replaced by the controlled table — accept while the draft
    is the oracle's token, then emit the oracle's token — so it emits what FlashSpec emits and
    only the compute differs.
    """

    def logits(hidden, lm_head, vocab_size):
        return (hidden @ lm_head.T)[..., :vocab_size].float()

    def verify(hidden, lm_head, drafts, temperature, seed, positions, vocab_size):
        scores = logits(hidden, lm_head, vocab_size)  # [N, γ + 1, V]
        gamma = drafts.shape[1]
        rows = torch.arange(gamma + 1, device=scores.device)[None, :]
        if not sampling:
            y = scores.argmax(dim=-1)  # [N, γ + 1]
        else:
            probs = torch.softmax(scores / temperature.clamp(min=1e-6)[:, None, None], dim=-1)
            p_draft = probs[:, :gamma].gather(2, drafts[..., None])[..., 0]  # [N, γ]
            kept = torch.rand_like(p_draft) < p_draft  # q(draft) = 1
            residual = probs[:, :gamma].scatter(2, drafts[..., None], 0.0)
            race = torch.cat([residual, probs[:, gamma:]], dim=1)
            sampled = (race / torch.empty_like(race).exponential_()).argmax(dim=-1)
            y = torch.cat([torch.where(kept, drafts, sampled[:, :gamma]), sampled[:, gamma:]], 1)
            if oracle is not None:  # the controlled outcome
                index = (positions[:, None] + rows).clamp(max=oracle.shape[1] - 1)
                y = oracle.gather(1, index)
        accept = (drafts == y[:, :gamma]).long().cumprod(dim=1)  # leading accepts
        k = accept.sum(dim=1)
        return torch.where(rows <= k[:, None], y, -1), k + 1

    def argmax(hidden, lm_head, vocab_size):
        return logits(hidden, lm_head, vocab_size).argmax(dim=-1)

    return verify, argmax


def controlled_filter(oracle: torch.Tensor, keep: torch.Tensor, vocab_size: int):
    """Drafts = the oracle's next tokens after each sequence's last accepted position where
    ``keep [N, L]`` (bool, per absolute position) says so, a wrong id elsewhere. ``oracle`` may be
    rewritten in place between runs (the captured graphs read it)."""

    def draft_filter(drafts, positions):
        gamma = drafts.shape[1]
        index = positions[:, None] + 1 + torch.arange(gamma, device=drafts.device)
        index = index.clamp(max=oracle.shape[1] - 1)
        truth = oracle.gather(1, index)
        return torch.where(keep.gather(1, index), truth, (truth + 1) % vocab_size)

    return draft_filter


def timed(loop: DeviceLoop, prompt, new_tokens, repeats: int, temperature: float, oracle=None):
    """Median wall seconds of ``repeats`` runs after one warm-up (capture), and the last run's
    (tokens, metrics). ``oracle``: the controlled drafter's text, set to the warm-up's own text."""
    temps = torch.full((loop.batch,), temperature)
    seeds = torch.arange(loop.batch)
    tokens, _ = loop.generate(prompt, new_tokens, temps, seeds)
    if oracle is not None:
        start = prompt.shape[1]
        oracle[:, start : start + new_tokens].copy_(torch.tensor(tokens))
    times, result = [], None
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        result = loop.generate(prompt, new_tokens, temps, seeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def step_idle_fraction(loop: DeviceLoop, steps: int = 20) -> float:
    """GPU idle time inside a step, measured once with the CUDA profiler: after a generation
    (every sequence finished, so steps idle at position 0 and the caches stay in bounds), replay
    the step's two graphs ``steps`` times with the loop's host read between steps; per step, idle
    = the span from its first kernel's start to its last kernel's end minus the union of its
    kernels' (and copies') intervals. Returns total idle / total span."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    draft, step = loop._graphs
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            draft.replay()
            step.replay()
            loop.step_record.cpu()
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in prof.events()
        if e.device_type == DeviceType.CUDA
    )
    # Steps are separated by the host read: split the kernel timeline at its `steps - 1`
    # largest gaps.
    gaps = sorted(range(1, len(kernels)), key=lambda i: kernels[i][0] - kernels[i - 1][1])
    cuts = sorted(gaps[len(gaps) - (steps - 1) :]) if steps > 1 else []
    span = idle = 0.0
    for lo, hi in zip([0, *cuts], [*cuts, len(kernels)], strict=True):
        window = kernels[lo:hi]
        first, last = window[0][0], max(end for _, end in window)
        busy, cursor = 0.0, first
        for start, end in window:
            busy += max(0.0, end - max(start, cursor))
            cursor = max(cursor, end)
        span += last - first
        idle += (last - first) - busy
    return idle / span


def run(args) -> list[dict]:
    rows = []
    for name in args.models:
        preset = TargetConfig.from_name(name)
        model = preset.build(seed=0, device="cuda", dtype=torch.bfloat16)
        with torch.device("cuda"):
            drafter = MtpDrafter(model, seed=1).to(torch.bfloat16).eval()
        sampling = args.temperature > 0
        baseline_verify, baseline_argmax = materialised_ops(sampling)
        for batch in args.batches:
            g = torch.Generator().manual_seed(batch)
            prompt = torch.randint(0, preset.vocab_size, (batch, args.prompt_len), generator=g)
            max_len = args.prompt_len + args.new_tokens + max(args.gammas) + 1
            plain = DeviceLoop(
                model, None, batch, max_len, 0, verify=baseline_verify, argmax=baseline_argmax
            )
            seconds, (tokens, metrics) = timed(
                plain, prompt, args.new_tokens, args.repeats, args.temperature
            )
            oracle = torch.cat([prompt, torch.tensor(tokens)], dim=1).cuda()
            pad = torch.zeros(batch, max_len + 1 - oracle.shape[1], dtype=torch.int64).cuda()
            oracle = torch.cat([oracle, pad], dim=1)
            keep = torch.rand(oracle.shape, generator=g).cuda() < args.alpha
            base = dict(
                model=name,
                batch=batch,
                new_tokens=args.new_tokens,
                alpha=args.alpha,
                temperature=args.temperature,
            )
            rows.append(
                dict(base, decoder="plain", gamma=0, seconds=seconds, **_figures(metrics, seconds))
            )
            print(_line(rows[-1]), flush=True)
            del plain
            for gamma in args.gammas:
                expected = (1 - args.alpha ** (gamma + 1)) / (1 - args.alpha)
                for decoder in ("flashspec", "materialised"):
                    own = oracle.clone()
                    ops = {}
                    if decoder == "materialised":
                        verify, _ = materialised_ops(sampling, own if sampling else None)
                        ops = dict(verify=verify, argmax=baseline_argmax)
                    loop = DeviceLoop(
                        model,
                        drafter,
                        batch,
                        max_len,
                        gamma,
                        draft_filter=controlled_filter(own, keep, preset.vocab_size),
                        **ops,
                    )
                    seconds, (got, metrics) = timed(
                        loop, prompt, args.new_tokens, args.repeats, args.temperature, own
                    )
                    profiled = args.profile and batch == 1 and gamma == 3
                    idle = step_idle_fraction(loop) if profiled else None
                    rows.append(
                        dict(
                            base,
                            decoder=decoder,
                            gamma=gamma,
                            seconds=seconds,
                            expected_tokens_per_step=expected,
                            # at T > 0 each decoder samples its own text
                            same_tokens_as_plain=None if sampling else got == tokens,
                            step_idle_fraction=idle,
                            **_figures(metrics, seconds),
                        )
                    )
                    print(_line(rows[-1]), flush=True)
                    del loop
        del model, drafter
        torch.cuda.empty_cache()
        _write(args, rows)  # after each model: a run cut short keeps what it measured
    return rows


def _write(args, rows: list[dict]) -> None:
    from kernel_bench import environment

    with open(args.out, "w") as f:
        json.dump(dict(environment=environment(), args=vars(args), rows=rows), f, indent=1)


def _figures(metrics, seconds: float) -> dict:
    return dict(
        tokens_per_second=metrics.generated / seconds,
        tokens_per_step=metrics.tokens_per_step,
        acceptance=metrics.acceptance,
        steps=metrics.steps,
        draft_seconds=metrics.draft_seconds,
        verify_seconds=metrics.verify_seconds,
        total_seconds=metrics.total_seconds,
    )


def _line(row: dict) -> str:
    expected = row.get("expected_tokens_per_step")
    formula = f" (formula {expected:.2f})" if expected else ""
    busy = (row["draft_seconds"] + row["verify_seconds"]) / row["total_seconds"]
    idle = row.get("step_idle_fraction")
    inside = f", idle inside a step {100 * idle:.2f}%" if idle is not None else ""
    return (
        f"{row['model']:>18} b={row['batch']:<3} {row['decoder']:>12} g={row['gamma']} "
        f"{row['tokens_per_second']:9.1f} tok/s  {row['tokens_per_step']:.2f} tok/step{formula}"
        f"  graphs {100 * busy:.1f}% of the wall time{inside}"
    )


def markdown(rows: list[dict]) -> str:
    """Per model and batch: tokens/s of each decoder by γ, and flashspec / materialised."""
    lines = []
    for name in dict.fromkeys(r["model"] for r in rows):
        lines += [
            f"#### {name}, T = {rows[0]['temperature']}",
            "",
            "| batch | γ | plain tok/s | materialised tok/s | flashspec tok/s | flashspec / "
            "materialised | tokens/step (formula) |",
            "|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for batch in dict.fromkeys(r["batch"] for r in rows if r["model"] == name):
            mine = [r for r in rows if r["model"] == name and r["batch"] == batch]
            plain = next(r for r in mine if r["decoder"] == "plain")
            for gamma in sorted({r["gamma"] for r in mine if r["gamma"] > 0}):
                at = {r["decoder"]: r for r in mine if r["gamma"] == gamma}
                fs, mat = at["flashspec"], at["materialised"]
                lines.append(
                    f"| {batch} | {gamma} | {plain['tokens_per_second']:.0f} | "
                    f"{mat['tokens_per_second']:.0f} | {fs['tokens_per_second']:.0f} | "
                    f"{fs['tokens_per_second'] / mat['tokens_per_second']:.3f} | "
                    f"{fs['tokens_per_step']:.2f} ({fs['expected_tokens_per_step']:.2f}) |"
                )
        lines.append("")
    return "\n".join(lines)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    models = list(dict.fromkeys(r["model"] for r in rows))
    fig, axes = plt.subplots(1, len(models), figsize=(6 * len(models), 4.5), squeeze=False)
    for ax, name in zip(axes[0], models, strict=True):
        for batch in dict.fromkeys(r["batch"] for r in rows if r["model"] == name):
            mine = [r for r in rows if r["model"] == name and r["batch"] == batch]
            for decoder, style in (("flashspec", "-o"), ("materialised", "--x")):
                mine_decoder = [r for r in mine if r["decoder"] == decoder]
                series = sorted((r["gamma"], r["tokens_per_second"]) for r in mine_decoder)
                ax.plot(*zip(*series, strict=True), style, label=f"{decoder} b={batch}")
            plain = next(r for r in mine if r["decoder"] == "plain")
            ax.axhline(plain["tokens_per_second"], linestyle=":", linewidth=0.8)
        ax.set(title=name, xlabel="γ", ylabel="tokens/s", yscale="log")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = cli.parser(__doc__)
    add = parser.add_argument
    add("--models", nargs="+", default=list(MODELS), choices=list(MODELS), help="model shapes")
    add("--batches", nargs="+", type=cli.int_range(1, 256), default=[1, 4, 16, 64])
    add("--gammas", nargs="+", type=cli.int_range(1, 16), default=[1, 2, 3, 4, 5, 6, 7])
    add("--alpha", type=float, default=0.8, help="probability that a draft is kept")
    add("--temperature", type=float, default=0.0, help="0: greedy; > 0: sampled (all rows)")
    add("--prompt-len", type=cli.int_range(2, 4096), default=16)
    add("--new-tokens", type=cli.int_range(1, 4096), default=64)
    add("--repeats", type=cli.int_range(1, 100), default=3, help="timed runs (median)")
    add("--profile", action="store_true", help="GPU idle inside a step (profiler; batch 1, γ 3)")
    add("--out", default="bench_decode.json", help="JSON report path")
    add("--plot", default=None, help="PNG plot path")
    args = parser.parse_args()
    if not 0 < args.alpha < 1:
        parser.error(f"--alpha: expected 0 < alpha < 1, got {args.alpha}")
    if not 0 <= args.temperature < float("inf"):
        parser.error(f"--temperature: expected a finite value >= 0, got {args.temperature}")
    if not torch.cuda.is_available():
        parser.exit(2, "error: needs a CUDA GPU (torch.cuda.is_available() is False)\n")
    rows = run(args)
    if args.plot:
        plot(rows, args.plot)
    print(markdown(rows))


if __name__ == "__main__":
    main()
