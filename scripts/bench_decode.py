"""End-to-end speculative decoding on a CUDA GPU: what the fused ops buy in tokens/s.

For each model shape (random bf16 weights, an MTP drafter: one decoder layer + the shared LM
head), batch and γ, three decoders run the same device-resident loop (runtime/device_loop.py:
fused decoder layers, one CUDA graph per step) in one process:

- ``flashspec``: fused VerifyResample (Triton) and TiledArgmax drafting;
- ``materialised``: the same loop with the sampler a serving stack runs (fp32 logits of every
  row, then argmax at T = 0) and matmul + argmax drafting;
- ``plain``: no speculation, one token per step (FlashSpec's fused sampler: the fastest plain
  decoder here, whose step the weight-read roofline bounds).

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

Per row: tokens/s; ms per step split into the target's decoder, verify (the sampler and the
bookkeeping) and the draft chain (a second, untimed-for-throughput run with the three pieces in
separate graphs timed by CUDA events); the weight-read roofline fraction (the weights a step
reads — the target's once, the drafter's and the LM head γ times — at the measured copy
bandwidth, over the measured step time); with ``--profile``, the GPU-busy fraction of one whole
generation (CUDA profiler: the union of kernel intervals over the span from the first to the
last). ``--layers pytorch`` runs the PyTorch decoder layers instead of the fused ones (before /
after).
"""

from __future__ import annotations

import functools
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


def gpu_busy_fraction(loop: DeviceLoop, prompt, new_tokens: int, temperature: float) -> float:
    """The GPU-busy fraction of the decode loop of one generation, measured once with the CUDA
    profiler: from the first step's graph launch (after the prompt's uncaptured prefill) to the
    last kernel's end, the union of the kernels' and copies' intervals over that span."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    temps = torch.full((loop.batch,), temperature)
    seeds = torch.arange(loop.batch)
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        loop.generate(prompt, new_tokens, temps, seeds)
    events = prof.events()
    launches = [e.time_range.start for e in events if e.name == "cudaGraphLaunch"]
    first_launch = min(launches, default=0)
    kernels = sorted(
        (e.time_range.start, e.time_range.end)
        for e in events
        if e.device_type == DeviceType.CUDA and e.time_range.start >= first_launch
    )
    busy, cursor = 0.0, kernels[0][0]
    for start, end in kernels:
        busy += max(0.0, end - max(start, cursor))
        cursor = max(cursor, end)
    return busy / (cursor - kernels[0][0])


def copy_bandwidth() -> float:
    """Bytes per second of a 2 GiB device-to-device copy (read + written), median of 10."""
    source = torch.empty(2**29, dtype=torch.float32, device="cuda")
    target = torch.empty_like(source)
    times = []
    for _ in range(12):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        target.copy_(source)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    return 2 * source.nbytes / statistics.median(times[2:])


def weight_bytes(model, drafter, gamma: int) -> int:
    """Bytes of weights one step reads: the target's (the embedding table only when it is the
    LM head too), and γ times the drafter's own layer and the LM head."""
    embed = model.model.embed_tokens.weight
    tied = embed.data_ptr() == model.lm_head.weight.data_ptr()
    own = {p.data_ptr(): p for p in model.parameters() if tied or p is not embed}
    total = sum(p.nbytes for p in own.values())
    if gamma:
        shared = {p.data_ptr() for p in model.parameters()}
        head = [p for p in drafter.parameters() if p.data_ptr() not in shared]
        total += gamma * (sum(p.nbytes for p in head) + model.lm_head.weight.nbytes)
    return total


def measure(args, make_loop, prompt, bandwidth: float, bytes_per_step: int, oracle=None) -> dict:
    """One decoder: tokens/s (median of the timed runs), ms per step by piece, the roofline
    fraction, and with ``--profile`` the GPU-busy fraction."""
    loop = make_loop(split_timing=False)
    seconds, (tokens, metrics) = timed(
        loop, prompt, args.new_tokens, args.repeats, args.temperature, oracle
    )
    busy = (
        gpu_busy_fraction(loop, prompt, args.new_tokens, args.temperature) if args.profile else None
    )
    del loop
    split = make_loop(split_timing=True)
    temps, seeds = torch.full((split.batch,), args.temperature), torch.arange(split.batch)
    split.generate(prompt, args.new_tokens, temps, seeds)  # capture
    _, split_metrics = split.generate(prompt, args.new_tokens, temps, seeds)
    pieces = {k: 1e3 * v / split_metrics.steps for k, v in split.piece_seconds.items()}
    del split
    step_seconds = seconds / metrics.steps
    return dict(
        seconds=seconds,
        ms_per_step=1e3 * step_seconds,
        ms_per_step_by_piece=pieces,
        weight_bytes_per_step=bytes_per_step,
        roofline_fraction=bytes_per_step / bandwidth / step_seconds,
        gpu_busy_fraction=busy,
        tokens=tokens,
        **_figures(metrics, seconds),
    )


def run(args) -> list[dict]:
    rows = []
    bandwidth = copy_bandwidth()
    print(f"device-to-device copy bandwidth {bandwidth / 1e12:.2f} TB/s", flush=True)
    fused = args.layers == "fused"
    for name in args.models:
        preset = TargetConfig.from_name(name)
        model = preset.build(seed=0, device="cuda", dtype=torch.bfloat16)
        with torch.device("cuda"):
            drafter = MtpDrafter(model, seed=1).to(torch.bfloat16).eval()
        sampling = args.temperature > 0
        _, baseline_argmax = materialised_ops(sampling)
        for batch in args.batches:
            g = torch.Generator().manual_seed(batch)
            prompt = torch.randint(0, preset.vocab_size, (batch, args.prompt_len), generator=g)
            max_len = args.prompt_len + args.new_tokens + max(args.gammas) + 1
            base = dict(
                model=name,
                batch=batch,
                new_tokens=args.new_tokens,
                alpha=args.alpha,
                temperature=args.temperature,
                layers=args.layers,
                copy_bandwidth=bandwidth,
            )

            plain_loop = functools.partial(DeviceLoop, model, None, batch, max_len, 0, fused=fused)
            row = measure(args, plain_loop, prompt, bandwidth, weight_bytes(model, drafter, 0))
            tokens = row.pop("tokens")
            rows.append(dict(base, decoder="plain", gamma=0, **row))
            print(_line(rows[-1]), flush=True)
            oracle = torch.cat([prompt, torch.tensor(tokens)], dim=1).cuda()
            pad = torch.zeros(batch, max_len + 1 - oracle.shape[1], dtype=torch.int64).cuda()
            oracle = torch.cat([oracle, pad], dim=1)
            keep = torch.rand(oracle.shape, generator=g).cuda() < args.alpha
            for gamma in args.gammas:
                expected = (1 - args.alpha ** (gamma + 1)) / (1 - args.alpha)
                for decoder in ("flashspec", "materialised"):
                    own = oracle.clone()
                    ops = {}
                    if decoder == "materialised":
                        verify, _ = materialised_ops(sampling, own if sampling else None)
                        ops = dict(verify=verify, argmax=baseline_argmax)

                    spec_loop = functools.partial(
                        DeviceLoop, model, drafter, batch, max_len, gamma, fused=fused,
                        draft_filter=controlled_filter(own, keep, preset.vocab_size), **ops,
                    )  # fmt: skip
                    row = measure(
                        args, spec_loop, prompt, bandwidth,
                        weight_bytes(model, drafter, gamma), own,
                    )  # fmt: skip
                    got = row.pop("tokens")
                    rows.append(
                        dict(
                            base,
                            decoder=decoder,
                            gamma=gamma,
                            expected_tokens_per_step=expected,
                            # at T > 0 each decoder samples its own text
                            same_tokens_as_plain=None if sampling else got == tokens,
                            **row,
                        )
                    )
                    print(_line(rows[-1]), flush=True)
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
        step_seconds=metrics.step_seconds,
        total_seconds=metrics.total_seconds,
    )


def _line(row: dict) -> str:
    expected = row.get("expected_tokens_per_step")
    formula = f" (formula {expected:.2f})" if expected else ""
    pieces = " / ".join(f"{k} {v:.3f}" for k, v in row["ms_per_step_by_piece"].items())
    busy = row.get("gpu_busy_fraction")
    busy = f", GPU busy {100 * busy:.1f}%" if busy is not None else ""
    return (
        f"{row['model']:>18} b={row['batch']:<3} {row['decoder']:>12} g={row['gamma']} "
        f"{row['tokens_per_second']:9.1f} tok/s  {row['tokens_per_step']:.2f} tok/step{formula}"
        f"  {row['ms_per_step']:.3f} ms/step ({pieces}), roofline "
        f"{100 * row['roofline_fraction']:.1f}%{busy}"
    )


def markdown(rows: list[dict]) -> str:
    """Per model and batch: tokens/s of each decoder by γ, flashspec / materialised, the step's
    pieces (ms: target decoder / verify / draft chain) and roofline fractions."""

    def pieces(row):
        return " / ".join(f"{v:.2f}" for v in row["ms_per_step_by_piece"].values())

    lines = []
    for name in dict.fromkeys(r["model"] for r in rows):
        lines += [
            f"#### {name}, T = {rows[0]['temperature']}",
            "",
            "| batch | γ | plain tok/s (roofline) | materialised tok/s | flashspec tok/s | "
            "flashspec / materialised | ms/step target / verify / draft: materialised; "
            "flashspec | roofline: mat.; fs. | tokens/step (formula) |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for batch in dict.fromkeys(r["batch"] for r in rows if r["model"] == name):
            mine = [r for r in rows if r["model"] == name and r["batch"] == batch]
            plain = next(r for r in mine if r["decoder"] == "plain")
            for gamma in sorted({r["gamma"] for r in mine if r["gamma"] > 0}):
                at = {r["decoder"]: r for r in mine if r["gamma"] == gamma}
                fs, mat = at["flashspec"], at["materialised"]
                lines.append(
                    f"| {batch} | {gamma} | {plain['tokens_per_second']:.0f} "
                    f"({100 * plain['roofline_fraction']:.0f}%) | "
                    f"{mat['tokens_per_second']:.0f} | {fs['tokens_per_second']:.0f} | "
                    f"{fs['tokens_per_second'] / mat['tokens_per_second']:.3f} | "
                    f"{pieces(mat)}; {pieces(fs)} | {100 * mat['roofline_fraction']:.0f}%; "
                    f"{100 * fs['roofline_fraction']:.0f}% | "
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
    add("--profile", action="store_true", help="GPU-busy fraction of a generation (profiler)")
    add("--layers", choices=["fused", "pytorch"], default="fused", help="the decoder layers")
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
