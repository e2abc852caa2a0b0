"""Where the Hopper hand-in's time goes (issue 35): the thresholds (cuBLAS over every
HAND_IN_STRIDE-th id by ``sampled_logits``, beside cuBLAS, then ``_hand_in_threshold_kernel``), the
tile pass with and without the
hand-in, stage 2 on its keys (top-k 50; top-p 0.9). Llama-3-8B head, logits of std 4, γ 3, all
rows truncated; CUDA graphs (``scripts/kernel_bench.time_graphs``), median µs; with the keys
handed in per row (mean, max).

    python docs/bench/hopper_hand_in_parts.py $OUT/hopper_hand_in_parts.json
"""

from __future__ import annotations

import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kernel_bench import time_graphs  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import hopper_tiles  # noqa: E402
from flashspec_export.kernels import verify_resample as vr  # noqa: E402
from flashspec_export.kernels.tiles import choose_config  # noqa: E402

WIDTH = 4


def parts(rows: int, lm: torch.Tensor, shape: HeadShape) -> dict:
    n = rows // WIDTH
    hidden = (4 * torch.randn(n, WIDTH, shape.hidden_size, device="cuda")).to(torch.bfloat16)
    h2 = hidden.view(rows, -1)
    temperature = torch.ones(n, device="cuda")
    seed = torch.arange(n, device="cuda") + 1
    positions = torch.arange(n, device="cuda") * 7
    config = choose_config(
        "verify_resample", rows, shape.hidden_size, shape.vocab_size, lm.dtype, lm.device
    )
    ws = vr.make_workspace(rows, config.num_splits, lm.device)
    summaries = (ws.floats[0], ws.index, *ws.floats[1:4])
    truncated = torch.empty(n, dtype=torch.int32, device="cuda")
    top_k = torch.full((n,), 50, device="cuda")
    top_p = torch.full((n,), 0.9, device="cuda")
    counts = torch.zeros(rows, dtype=torch.int32, device="cuda")
    keys = torch.empty(rows, hopper_tiles.HAND_IN_CAP, dtype=torch.int64, device="cuda")
    vocab = shape.vocab_size

    spare = torch.empty_like(counts)  # the thresholds zero it: the timed stage 2 keeps counts

    def thresholds():
        return vr._hand_in_thresholds(h2, lm, vocab, top_k, None, WIDTH, None, truncated, spare)

    theta = thresholds()
    common = dict(
        verify=True, temperature=temperature, seed=seed, positions=positions, gamma=WIDTH - 1,
        config=config.hopper,
    )  # fmt: skip

    def tile(hand_in: bool, logprobs: bool = False):
        if hand_in:
            counts.zero_()
        hopper_tiles.launch(
            h2, lm, vocab, summaries, return_logprobs=logprobs,
            hand_in=(truncated, theta, counts, keys) if hand_in else None, **common,
        )  # fmt: skip

    tile(True)
    fns = {
        "tile_plain": lambda: tile(False),
        "tile_hand_in": lambda: tile(True),
        "tile_hand_in_lp": lambda: tile(True, True),
        "thresholds": thresholds,
        "sample_cublas": lambda: h2 @ lm[: vocab : vr.HAND_IN_STRIDE].T,
        "sample": lambda: vr.sampled_logits(h2, lm, vocab),
        "stage2": lambda: vr._truncated_summaries(
            ws, keys, counts, theta, truncated, top_k, None, temperature, seed, positions
        ),
        "stage2_p": lambda: vr._truncated_summaries(
            ws, keys, counts, theta, truncated, None, top_p, temperature, seed, positions
        ),
    }
    times = {k: round(statistics.median(v), 1) for k, v in time_graphs(fns, 20, 200).items()}
    handed = counts.float()
    times["count_mean"] = round(handed.mean().item(), 1)
    times["count_max"] = int(handed.max().item())
    return times


def main() -> None:
    shape = HeadShape.from_name("llama3-8b")
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    out = {"device": torch.cuda.get_device_name()}
    for rows in (32, 64, 128, 256, 512):
        out[rows] = parts(rows, lm, shape)
        print(rows, out[rows], flush=True)
    if len(sys.argv) > 1:
        pathlib.Path(sys.argv[1]).write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
