"""Side-by-side GPU timing of the FlashSpec ops against cuBLAS and the materialised path.

For one LM head (V, H, dtype) and a sweep of row counts R = N·(γ+1), every provider runs on the
same inputs in the same process:

- ``verify_resample`` / ``tiled_argmax``: the fused Triton kernels (verify-and-resample, greedy
  drafter); ``+logprobs``: the verify op also returning log-probabilities (online LSE);
- ``verify_resample[cuda]`` / ``tiled_argmax[cuda]``: the same ops as the CUDA kernels behind the
  TensorRT plugins (``plugins/``, through their C ABI);
- ``matmul``: cuBLAS ``hidden @ lm_head.T`` alone (the floor the fused ops aim for);
- ``matmul+argmax``: cuBLAS followed by ``argmax`` (the unfused drafter);
- ``materialised_torch_rng``: the baseline serving stacks run (vLLM-style rejection sampler):
  fp32 logits → softmax → ``p(x)`` against ``torch.rand`` → residual → exponential race with
  ``torch``'s own RNG;
- ``onepass_torch_rng``: a careful torch version of the coupled rule: fp32 logits once, Gumbel
  noise from ``torch``'s RNG, one argmax (and the LSE for ``+logprobs``);
- ``two_pass``: cuBLAS writes the logits in the head's dtype, then ONE fused Triton kernel reads
  them once and takes the Gumbel-max sample with Philox noise (FlashInfer's
  ``sampling_from_logits`` design; ``scripts/two_pass_sampler.py``), drafts accepted iff equal;
- ``standard``: the counter-noise oracle (``ops`` backend "standard"): dozens of elementwise
  kernels generate the noise, so it is a correctness oracle, not a speed baseline.

``materialised_torch_rng``, ``onepass_torch_rng`` and ``two_pass`` are the baselines a user would
run instead; speed claims are against the fastest of them at each row count.

Each provider's back-to-back calls are captured in one CUDA graph (launch gaps excluded, as in a
deployed engine), as ``triton.testing.do_bench_cudagraph`` does; at each row count the graphs of
all providers are then replayed in turn, 10 rounds with the first provider rotating, each replay
timed with CUDA events, so that a GPU warming up during the sweep weighs on every provider
alike (timed one after the other, the later providers ran up to 5% slower on an H200). Before
each timed replay the same graph is replayed untimed for ``settle_ms``: at the power limit the SM
clock follows the power drawn, so a replay timed right after another provider's starts at that
provider's clock. Without it the same verify kernel read 1.29x and 1.54x the matmul in two orders
of one H200 run (512 rows), against 1.37x at steady state (docs/bench/interleaved_h200.log).

The report gives the median per call and the spread (second lowest and highest of the 10
replays, fields ``p10_us`` / ``p90_us``), and the LM-head bytes streamed per second as a fraction
of the measured device-to-device copy bandwidth (bytes read plus written by a large ``copy_``).
"""

from __future__ import annotations

import json
import math
import platform
import statistics
import subprocess
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

import torch
from two_pass_sampler import two_pass_verify

from flashspec_export import ops
from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiled_argmax import tiled_argmax as triton_argmax
from flashspec_export.kernels.tiles import choose_config
from flashspec_export.kernels.verify_resample import verify_resample as triton_verify
from flashspec_export.reference.sampled_verify import select_emitted
from flashspec_export.reference.verify_resample import count_accepted

PROVIDERS = (
    "verify_resample",
    "verify_resample+logprobs",
    "tiled_argmax",
    "verify_resample[portable]",
    "tiled_argmax[portable]",
    "verify_resample[cuda]",
    "verify_resample[cuda]+logprobs",
    "tiled_argmax[cuda]",
    "matmul",
    "matmul+argmax",
    "materialised_torch_rng",
    "onepass_torch_rng",
    "two_pass",
    "standard",
)
BASELINES = ("materialised_torch_rng", "onepass_torch_rng", "two_pass")


ROUNDS = 10  # timed replays of each provider's graph
SETTLE_MS = 200  # GPU ms of untimed replays of a graph before its timed replay


@dataclass(frozen=True)
class BenchConfig:
    heads: tuple[str, ...] = ("llama3-8b", "qwen3-8b", "gemma3-12b")
    rows: tuple[int, ...] = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    providers: tuple[str, ...] = tuple(p for p in PROVIDERS if p != "standard")
    dtype: str = "bfloat16"
    gamma: int = 3  # rows R >= γ + 1 are laid out as N = R / (γ + 1) sequences
    temperature: float = 1.0
    rep_ms: int = 100  # GPU time per timed graph replay
    settle_ms: int = SETTLE_MS  # untimed replays of the same graph before each timed one


@dataclass
class Measurement:
    head: str
    vocab_size: int
    hidden_size: int
    rows: int
    provider: str
    median_us: float
    p10_us: float
    p90_us: float
    weight_gbps: float  # LM-head bytes / median time
    copy_fraction: float  # weight_gbps / measured copy bandwidth
    extra: dict = field(default_factory=dict)


def environment() -> dict:
    """GPU, driver, CUDA and library versions, for the JSON report."""
    import triton

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "sm_count": props.multi_processor_count,
        "cuda": torch.version.cuda,
        "torch": torch.__version__,
        "triton": triton.__version__,
        "driver": _driver_version(),
        "python": platform.python_version(),
    }


def _driver_version() -> str:
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            check=True,
        )
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def time_graph(
    fn: Callable[[], object], rep_ms: float = 100, settle_ms: float = SETTLE_MS
) -> list[float]:
    """Times per call in µs of ``fn`` (``ROUNDS`` samples), as ``time_graphs`` gives them."""
    return time_graphs({"fn": fn}, rep_ms, settle_ms)["fn"]


def time_graphs(
    fns: dict[str, Callable[[], object]], rep_ms: float = 100, settle_ms: float = SETTLE_MS
) -> dict[str, list[float]]:
    """Times per call in µs of each of ``fns`` (``ROUNDS`` samples each): per function, one
    warm-up call (it compiles and allocates), then ``rep_ms`` worth of back-to-back calls
    captured in one CUDA graph (the count estimated from a graph of one call) and replayed once
    untimed; then ``ROUNDS`` rounds that replay every graph, the first function of a round
    rotating: untimed for at least ``settle_ms`` (at the power limit the clock follows the power
    drawn, so a replay right after another function's would start at that one's clock), then once
    timed with CUDA events."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())  # the inputs, made on the current stream
    graphs = {}
    with torch.cuda.stream(stream):
        for name, fn in fns.items():
            fn()
            single = _capture(fn, 1, stream)
            calls = max(1, int(rep_ms / _replay_ms(single, stream)))
            graphs[name] = (_capture(fn, calls, stream), calls)
            _replay_ms(graphs[name][0], stream)  # the first replay uploads the graph
            del single
        times = {name: [] for name in fns}
        names = list(graphs)
        for round_ in range(ROUNDS):
            start = round_ % len(names)  # each function leads in turn
            for name in names[start:] + names[:start]:
                graph, calls = graphs[name]
                if len(names) > 1 or round_ == 0:  # else the replay before was this graph's
                    for _ in range(math.ceil(settle_ms / rep_ms)):
                        graph.replay()
                times[name].append(1e3 * _replay_ms(graph, stream) / calls)
    return times


def _capture(
    fn: Callable[[], object], calls: int, stream: torch.cuda.Stream
) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=stream):
        for _ in range(calls):
            fn()
    torch.cuda.synchronize()
    return graph


def _replay_ms(graph: torch.cuda.CUDAGraph, stream: torch.cuda.Stream) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record(stream)
    graph.replay()
    end.record(stream)
    end.synchronize()
    return start.elapsed_time(end)


def copy_bandwidth_gbps(nbytes: int = 2**31, repeats: int = 20) -> float:
    """Device-to-device copy bandwidth of a large fp32 buffer, bytes read plus bytes written per
    second (GB/s), timed with events around plain ``copy_`` calls."""
    src = torch.randn(nbytes // 4, device="cuda")
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        dst.copy_(src)
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e-3)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * nbytes / statistics.median(times) / 1e9


def _layout(rows: int, gamma: int) -> tuple[int, int]:
    """(N, γ) with N·(γ+1) = rows: γ as configured when it divides, else one sequence."""
    if rows % (gamma + 1) == 0:
        return rows // (gamma + 1), gamma
    return 1, rows - 1


def _providers(shape: HeadShape, rows: int, config: BenchConfig, lm_head: torch.Tensor):
    n, gamma = _layout(rows, config.gamma)
    dtype = lm_head.dtype
    g = torch.Generator(device="cuda").manual_seed(rows)
    hidden = torch.randn(n, gamma + 1, shape.hidden_size, device="cuda", dtype=dtype, generator=g)
    flat = hidden.reshape(rows, shape.hidden_size)
    drafts = torch.randint(0, shape.vocab_size, (n, gamma), device="cuda", generator=g)
    temps = torch.full((n,), config.temperature, device="cuda")
    seeds = torch.arange(n, device="cuda")
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    vocab = shape.vocab_size

    def verify(backend, logprobs=False):
        return lambda: ops.verify_resample(
            hidden,
            lm_head,
            drafts,
            temps,
            seeds,
            positions,
            vocab,
            return_logprobs=logprobs,
            backend=backend,
            check_values=False,
        )

    def argmax(backend):
        return lambda: ops.tiled_argmax(flat, lm_head, vocab, backend=backend, check_values=False)

    def logits():  # [N, γ + 1, V] fp32, as serving stacks feed their samplers
        # the whole (padded) head: a slice to an unaligned V would slow cuBLAS down (Qwen3: 3x)
        return (hidden @ lm_head.T)[..., :vocab].float() / temps[:, None, None]

    def materialised_torch_rng():
        probs = logits().softmax(dim=-1)  # [N, γ + 1, V]
        p_x = probs[:, :gamma].gather(-1, drafts[..., None]).squeeze(-1)  # [N, γ]
        accept = torch.rand(n, gamma, device="cuda") <= p_x  # q(x) = 1 for a greedy draft
        probs[:, :gamma].scatter_(-1, drafts[..., None], 0.0)  # residual max(0, p - q)
        recovered = probs.div_(torch.empty_like(probs).exponential_()).argmax(dim=-1)
        return _emit(accept, drafts, recovered)

    def onepass_torch_rng():
        scores = logits()
        gumbel = torch.empty_like(scores).exponential_().log_().neg_()
        y = (scores + gumbel).argmax(dim=-1)  # [N, γ + 1]
        return _emit(drafts == y[:, :gamma], drafts, y)

    def cuda_path(op):  # which kernels the cuda backend runs: "triton_aot" or "native"
        from flashspec_export.ops import cuda

        if op == "verify_resample":
            return cuda.kernel_path(op, hidden, lm_head, drafts, temps, seeds, positions, vocab)
        return cuda.kernel_path(op, flat, lm_head, vocab)

    def portable_config(op):  # the Triton kernels without the Hopper stage 1
        return choose_config(op, rows, shape.hidden_size, vocab, dtype, hidden.device, hopper=False)

    def triton_path(op):  # which stage 1 the triton backend runs: "hopper" or "portable"
        chosen = choose_config(op, rows, shape.hidden_size, vocab, dtype, hidden.device)
        return "hopper" if chosen.hopper is not None else "portable"

    verify_portable = portable_config("verify_resample")
    argmax_portable = portable_config("tiled_argmax")
    paths = {
        "verify_resample": lambda: triton_path("verify_resample"),
        "verify_resample+logprobs": lambda: triton_path("verify_resample"),
        "tiled_argmax": lambda: triton_path("tiled_argmax"),
        "verify_resample[cuda]": lambda: cuda_path("verify_resample"),
        "verify_resample[cuda]+logprobs": lambda: cuda_path("verify_resample"),
        "tiled_argmax[cuda]": lambda: cuda_path("tiled_argmax"),
    }
    providers = {
        "verify_resample": verify("triton"),
        "verify_resample+logprobs": verify("triton", logprobs=True),
        "tiled_argmax": argmax("triton"),
        "verify_resample[portable]": lambda: triton_verify(
            hidden, lm_head, drafts, temps, seeds, positions, vocab, config=verify_portable
        ),
        "tiled_argmax[portable]": lambda: triton_argmax(
            flat, lm_head, vocab, config=argmax_portable
        ),
        "verify_resample[cuda]": verify("cuda"),
        "verify_resample[cuda]+logprobs": verify("cuda", logprobs=True),
        "tiled_argmax[cuda]": argmax("cuda"),
        "matmul": lambda: flat @ lm_head.T,
        "matmul+argmax": lambda: (flat @ lm_head.T)[:, :vocab].argmax(dim=-1),
        "materialised_torch_rng": materialised_torch_rng,
        "onepass_torch_rng": onepass_torch_rng,
        "two_pass": lambda: two_pass_verify(hidden, lm_head, drafts, temps, vocab),
        "standard": verify("standard"),
    }
    return providers, paths


def _emit(accept: torch.Tensor, drafts: torch.Tensor, candidates: torch.Tensor):
    """Tokens and counts from ``accept [N, γ]`` and ``candidates [N, γ + 1]`` (baselines)."""
    k = count_accepted(accept)  # [N]
    return select_emitted(k, drafts, candidates, fill=-1), k + 1


def run(config: BenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict:
    """Run the sweep; returns {"environment", "copy_gbps", "config", "measurements"}."""
    copy_gbps = copy_bandwidth_gbps()
    dtype = getattr(torch, config.dtype)
    measurements = []
    for head in config.heads:
        shape = HeadShape.from_name(head)
        lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=dtype)
        lm_head *= shape.hidden_size**-0.5
        weight_bytes = lm_head.numel() * lm_head.element_size()
        for rows in config.rows:
            providers, paths = _providers(shape, rows, config, lm_head)
            chosen = {name: fn for name, fn in providers.items() if name in config.providers}
            timed = time_graphs(chosen, config.rep_ms, config.settle_ms)
            for name, times in timed.items():
                extra = {"kernel_path": paths[name]()} if name in paths else {}
                times = sorted(times)
                median = statistics.median(times)
                gbps = weight_bytes / (median * 1e-6) / 1e9
                measurements.append(
                    Measurement(
                        head,
                        shape.vocab_size,
                        shape.hidden_size,
                        rows,
                        name,
                        median,
                        times[len(times) // 10],
                        times[(9 * len(times)) // 10],
                        gbps,
                        gbps / copy_gbps,
                        extra,
                    )
                )
                progress(
                    f"{head:>11} R={rows:<4} {name:>16}: {median:9.1f} us "
                    f"({100 * gbps / copy_gbps:5.1f}% of copy bw) {extra.get('kernel_path', '')}"
                )
            del timed, chosen
            torch.cuda.empty_cache()
        del lm_head
    return {
        "environment": environment(),
        "copy_gbps": copy_gbps,
        "config": asdict(config),
        "measurements": [asdict(m) for m in measurements],
    }


def write_report(report: dict, json_path: str, png_path: str | None = None) -> None:
    """Write the JSON report and, if asked, a plot: µs vs rows, one panel per head."""
    with open(json_path, "w") as f:
        json.dump(report, f, indent=1)
    if png_path is None:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    heads = list(dict.fromkeys(m["head"] for m in report["measurements"]))
    fig, axes = plt.subplots(1, len(heads), figsize=(5.5 * len(heads), 4.5), squeeze=False)
    for ax, head in zip(axes[0], heads, strict=True):
        for provider in PROVIDERS:
            points = [
                (m["rows"], m["median_us"])
                for m in report["measurements"]
                if m["head"] == head and m["provider"] == provider
            ]
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=provider)
        ax.set(
            xscale="log",
            yscale="log",
            xlabel="rows N·(γ+1)",
            ylabel="µs (median)",
            title=f"{head} ({report['environment']['gpu']})",
        )
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(png_path, dpi=120)


def markdown(report: dict) -> str:
    """One table per head: median µs [p10–p90] per provider; the fused verify's ratio to the
    cuBLAS matmul, its fraction of the copy bandwidth, and the fastest baseline (BASELINES) over
    the fused verify (Triton and CUDA, without log-probabilities)."""
    lines = []
    ms = report["measurements"]
    for head in dict.fromkeys(m["head"] for m in ms):
        mine = [m for m in ms if m["head"] == head]
        shape = mine[0]
        providers = [p for p in PROVIDERS if any(m["provider"] == p for m in mine)]
        lines += [
            f"#### {head} (V = {shape['vocab_size']}, H = {shape['hidden_size']})",
            "",
            "| rows | " + " | ".join(providers) + " | verify / matmul | argmax / matmul "
            "| verify % copy bw | baseline / verify | baseline / verify[cuda] |",
            "|---:|" + "---:|" * (len(providers) + 5),
        ]
        for rows in sorted({m["rows"] for m in mine}):
            at = {m["provider"]: m for m in mine if m["rows"] == rows}
            cells = [
                f"{at[p]['median_us']:.0f} [{at[p]['p10_us']:.0f}–{at[p]['p90_us']:.0f}]"
                for p in providers
            ]
            verify, argmax, matmul = (
                at.get(p) for p in ("verify_resample", "tiled_argmax", "matmul")
            )
            baselines = [at[p] for p in BASELINES if p in at]
            baseline = min(baselines, key=lambda m: m["median_us"]) if baselines else None
            ratio = lambda a, b: f"{a['median_us'] / b['median_us']:.2f}" if a and b else "–"  # noqa: E731
            bw = f"{100 * verify['copy_fraction']:.0f}%" if verify else "–"
            lines.append(
                f"| {rows} | " + " | ".join(cells) + f" | {ratio(verify, matmul)} | "
                f"{ratio(argmax, matmul)} | {bw} | {ratio(baseline, verify)} | "
                f"{ratio(baseline, at.get('verify_resample[cuda]'))} |"
            )
        lines.append("")
    return "\n".join(lines)
