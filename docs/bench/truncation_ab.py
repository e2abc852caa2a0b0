"""Truncated verify calls at this checkout against an earlier one's kernels: whole
``verify_resample`` calls in one process (``scripts/kernel_bench.time_graphs``: CUDA graphs,
settled, interleaved), × plain verify; bf16, logits of std 4, γ 3, ``settle_only``. ``--before``
is a folder holding an earlier commit's ``kernels/*.py`` (``for f in $(git ls-tree --name-only
COMMIT kernels/); do git show COMMIT:$f > DIR/$(basename $f); done``): its ``order_keys``,
``noise``, ``hopper_tiles`` and ``verify_resample`` are loaded as modules of their own, each
importing the earlier ones. Each call's outputs (tokens, counts, unsettled rows) must be the same
bit for bit with both.

    python docs/bench/truncation_ab.py --before DIR --heads llama3-8b qwen3-8b
    # stage2_walk_ab_h200.log (the walk by score, 698851d -> afc6c46: --before held
    # 698851d's verify_resample.py alone), truncation_ab_h200.log
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

CALLS = {  # name: (top-k, top-p)
    "top_k_50": (50, None),
    "top_k_1024": (1024, None),
    "top_p_0.9": (None, 0.9),
    "top_k_50_top_p_0.9": (50, 0.9),
}


# The modules reloaded from --before, in import order (the rest are this checkout's).
RELOADED = ("order_keys", "noise", "hopper_tiles", "verify_resample")


def load_before(folder: str):
    """The earlier ``verify_resample`` module: each of ``RELOADED`` from ``folder``, loaded while
    the ones before it stand in for this checkout's (in ``sys.modules`` and as attributes of
    ``flashspec_export.kernels``), which are put back after."""
    import flashspec_export.kernels as package

    names = [f"flashspec_export.kernels.{name}" for name in RELOADED]
    kept = {name: sys.modules[name] for name in names if name in sys.modules}
    attributes = {name: getattr(package, name, None) for name in RELOADED}
    module = None
    try:
        for name, full in zip(RELOADED, names, strict=True):
            spec = importlib.util.spec_from_file_location(
                f"flashspec_export.kernels._before_{name}", pathlib.Path(folder) / f"{name}.py"
            )
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module
            spec.loader.exec_module(module)
            sys.modules[full] = module
            setattr(package, name, module)
    finally:
        sys.modules.update(kept)
        for name, value in attributes.items():
            setattr(package, name, value)
    return module


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--before", required=True)
    parser.add_argument("--heads", nargs="+", default=["llama3-8b"])
    parser.add_argument("--rows", nargs="+", type=int, default=[4, 16, 64, 128, 512])
    parser.add_argument("--calls", nargs="+", default=list(CALLS))
    parser.add_argument("--warps", nargs="*", type=int, default=[],
                        help="also the walk with stage 2 at these warps")  # fmt: skip
    args = parser.parse_args()
    before = load_before(args.before)
    versions = {"before": before.verify_resample, "after": after.verify_resample}
    versions.update({f"after_w{w}": with_warps(w) for w in args.warps})
    print(f"# {torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for head in args.heads:
        for rows, n, _, call_args in cases(head, args.rows):
            fns = {"verify": functools.partial(after.verify_resample, *call_args)}
            for name in args.calls:
                k, p = CALLS[name]
                truncation = {}
                if k is not None:
                    truncation["top_k"] = torch.full((n,), k, device="cuda")
                if p is not None:
                    truncation["top_p"] = torch.full((n,), p, device="cuda")
                outs = {}
                for tag, verify in versions.items():
                    fn = functools.partial(verify, *call_args, settle_only=True, **truncation)
                    fns[f"{name}/{tag}"] = fn
                    outs[tag] = tensors(fn())
                for tag in versions:
                    if not all(map(torch.equal, outs["before"], outs[tag])):
                        raise SystemExit(f"{head} R={rows} {name} {tag}: the outputs differ")
                unsettled = int(outs["after"][-1].sum())
                print(f"{head} R={rows} {name}: {unsettled} of {rows} rows unsettled")
            times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
            plain = times["verify"]
            cells = "; ".join(cell(times, plain, name, versions) for name in args.calls)
            print(f"{head} R={rows} verify {plain:.1f} µs, x verify, before -> after: {cells}",
                  flush=True)  # fmt: skip


def with_warps(warps: int):
    """``verify_resample`` whose stage 2 launches with ``warps`` warps."""
    shipped = after.settle_shape

    def shape(*args, **kwargs):
        kept, constexprs, _ = shipped(*args, **kwargs)
        return kept, constexprs, warps

    def call(*args, **kwargs):
        after.settle_shape = shape
        try:
            return after.verify_resample(*args, **kwargs)
        finally:
            after.settle_shape = shipped

    return call


def cell(times: dict[str, float], plain: float, name: str, versions) -> str:
    """Call ``name``'s ratios to plain verify, before -> after (-> the other warps), and the µs
    saved."""
    ratios = " -> ".join(f"{times[f'{name}/{tag}'] / plain:.3f}" for tag in versions)
    saved = times[f"{name}/before"] - times[f"{name}/after"]
    return f"{name} {ratios} ({saved:+.1f} µs)"


if __name__ == "__main__":
    main()
