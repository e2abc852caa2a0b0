"""The portable verify kernel at 1-16 rows, side by side in one process (Llama-3 / Qwen3 /
Gemma-3 heads, bf16):

    python docs/bench/small_rows_verify.py noise   # T = 1 (noise per logit) against T = 0 (a
        # greedy block skips it) and the argmax, same tiles
    python docs/bench/small_rows_verify.py epi     # scoring only the launched rows
        # (KernelConfig.epi_rows) against the whole 16-row block, and whether the tokens and
        # log-probabilities are equal (they must be, bit for bit)

Its operands() also serves docs/bench/kernel_times.py.
"""

import statistics
import sys

import torch

sys.path.insert(0, "scripts")
from kernel_bench import time_graph

from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import choose_config
from flashspec_export.kernels.verify_resample import verify_resample

HEADS = ("llama3-8b", "qwen3-8b", "gemma3-12b")


def operands(head: str, rows: int):
    """(verify's positional arguments at T = 1, the flat [R, H] rows, the lm_head): random bf16
    weights, one sequence of γ + 1 = R rows up to 4 rows, else γ = 3."""
    shape = HeadShape.from_name(head)
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    gamma = rows - 1 if rows <= 4 else 3
    n = rows // (gamma + 1)
    hidden = torch.randn(n, gamma + 1, shape.hidden_size, device="cuda").bfloat16()
    drafts = torch.randint(0, shape.vocab_size, (n, gamma), device="cuda")
    seeds = torch.arange(n, device="cuda") * 31
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    temps = torch.ones(n, device="cuda")
    args = (hidden, lm_head, drafts, temps, seeds, positions, shape.vocab_size)
    return args, hidden.reshape(rows, -1), lm_head


def line(head: str, rows: int, times: dict, extra: str = "") -> str:
    cells = "  ".join(f"{k} {v:.1f} ({v / times['matmul']:.3f})" for k, v in times.items())
    return f"{head} R={rows} {cells}{extra}"


def median_us(fn) -> float:
    return statistics.median(time_graph(fn, 20))


def noise(head: str, rows: int) -> str:
    args, flat, lm_head = operands(head, rows)
    vocab = args[-1]
    times = {"matmul": median_us(lambda: flat @ lm_head.T)}
    for temperature in (1.0, 0.0):
        run = (*args[:3], torch.full_like(args[3], temperature), *args[4:])
        times[f"verify T={temperature:g}"] = median_us(lambda run=run: verify_resample(*run))
    times["argmax"] = median_us(lambda: tiled_argmax(flat, lm_head, vocab))
    return line(head, rows, times)


def epi(head: str, rows: int) -> str:
    args, flat, lm_head = operands(head, rows)
    hidden_size, vocab = lm_head.shape[1], args[-1]
    base = choose_config("verify_resample", rows, hidden_size, vocab, lm_head.dtype, lm_head.device)
    times = {"matmul": median_us(lambda: flat @ lm_head.T)}
    results = []
    for epi_rows in (0, rows):
        config = base._replace(epi_rows=epi_rows)
        result = verify_resample(*args, return_logprobs=True, config=config)
        results.append((result.tokens.clone(), result.logprobs.clone()))
        times[f"epi{epi_rows}"] = median_us(lambda c=config: verify_resample(*args, config=c))
    times["argmax"] = median_us(lambda: tiled_argmax(flat, lm_head, vocab))
    equal = all(torch.equal(a, b) for a, b in zip(*results, strict=True))
    return line(head, rows, times, f" cfg={tuple(base)[:6]} equal={equal}")


if __name__ == "__main__":
    mode = sys.argv[1] if len(sys.argv) > 1 else ""
    if mode not in ("noise", "epi"):
        raise SystemExit(f"mode must be 'noise' or 'epi', got {mode!r}")
    print(torch.cuda.get_device_name(), flush=True)
    for head in HEADS:
        for rows in (1, 4, 16) if mode == "noise" else (1, 2, 4, 8):
            print((noise if mode == "noise" else epi)(head, rows), flush=True)
