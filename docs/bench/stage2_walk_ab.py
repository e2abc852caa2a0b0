"""Top-k's stage 2 without log-probabilities, before and after the walk by score: the sample
first (the known keys walked by descending noisy score until one of rank below k) against the
cut by bisection and the nucleus compacted. Whole ``verify_resample`` calls in one process
(``scripts/kernel_bench.time_graphs``: CUDA graphs, settled, interleaved), × plain verify; bf16,
logits of std 4, γ 3, ``settle_only``. ``--before`` is the earlier ``kernels/verify_resample.py``
(``git show COMMIT:kernels/verify_resample.py > FILE``), loaded as a module of its own. Each
call's outputs (tokens, counts, unsettled rows) must be the same bit for bit with both.

    python docs/bench/stage2_walk_ab.py --before FILE --heads llama3-8b qwen3-8b
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import pathlib
import statistics
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs
from ring_depth_ab import cases, tensors  # beside this script

from flashspec_export.kernels import verify_resample as after


def load_before(path: str):
    """The module at ``path`` (an earlier ``kernels/verify_resample.py``)."""
    spec = importlib.util.spec_from_file_location("flashspec_export.kernels._before", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--heads", nargs="+", default=["llama3-8b"])
    parser.add_argument("--rows", nargs="+", type=int, default=[4, 16, 64, 128, 512])
    parser.add_argument("--k", nargs="+", type=int, default=[50, 1024])
    args = parser.parse_args()
    before = load_before(args.before)
    versions = {"before": before, "after": after}
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for head in args.heads:
        for rows, n, _, call_args in cases(head, args.rows):
            fns = {"verify": functools.partial(after.verify_resample, *call_args)}
            for k in args.k:
                top_k = torch.full((n,), k, device="cuda")
                outs = {}
                for tag, module in versions.items():
                    fn = functools.partial(
                        module.verify_resample, *call_args, settle_only=True, top_k=top_k
                    )
                    fns[f"top_k_{k}/{tag}"] = fn
                    outs[tag] = tensors(fn())
                if not all(map(torch.equal, outs["before"], outs["after"])):
                    raise SystemExit(f"{head} R={rows} top-k {k}: the outputs differ")
                unsettled = int(outs["after"][-1].sum())
                print(f"{head} R={rows} top-k {k}: {unsettled} of {rows} rows unsettled")
            times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
            plain = times["verify"]
            cells = "; ".join(cell(times, plain, k) for k in args.k)
            print(f"{head} R={rows} verify {plain:.1f} µs, x verify, before -> after: {cells}",
                  flush=True)  # fmt: skip


def cell(times: dict[str, float], plain: float, k: int) -> str:
    """Top-k ``k``'s ratios to plain verify, before -> after, and the µs saved."""
    was, now = times[f"top_k_{k}/before"], times[f"top_k_{k}/after"]
    return f"top-k {k} {was / plain:.3f} -> {now / plain:.3f} ({was - now:+.1f} µs)"


if __name__ == "__main__":
    main()
