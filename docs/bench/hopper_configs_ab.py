"""A/B of the Hopper verify stage 1 on one GPU: a baseline kernel source (``old``, on the launch
table's configuration) against the working tree's kernel (``new``, the same configuration) and
against the working tree's kernel on named configurations; side by side with the cuBLAS matmul,
settled timing (``scripts/kernel_bench.time_graphs``). Each variant's per-row best score and id
(the max over its tiles) must equal the baseline's; with the same tiles, every summary must.

    git show HEAD:kernels/hopper_tiles.py > /tmp/hopper_tiles_head.py
    python docs/bench/hopper_configs_ab.py --baseline /tmp/hopper_tiles_head.py --rows 128 \
        --heads llama3-8b qwen3-8b --config t128w8=128,128,64,4,16,8,112

``--config NAME=block_n,block_v,block_k,stages,chunk,epi_warps,epi_regs`` (``HopperConfig``).
"""

import argparse
import importlib.util
import statistics
import sys

import torch

sys.path.insert(0, "scripts")
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.tiles import hopper_row


def module_from(path: str):
    """The kernel module of the source file ``path``."""
    spec = importlib.util.spec_from_file_location("hopper_tiles_baseline", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def per_row_best(summaries):
    """(best score, its id) per row: the max over the tiles' summaries."""
    score, index = summaries[0], summaries[1]
    best, tile = score.max(1)
    return best, index.gather(1, tile[:, None])[:, 0]


def compare(head: str, rows: int, variants: dict) -> str:
    """One line: the matmul's µs, each variant's µs and ratio, and whether its results equal the
    baseline's."""
    shape = HeadShape.from_name(head)
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    vocab = shape.vocab_size
    gamma, n = 3, rows // 4
    generator = torch.Generator(device="cuda").manual_seed(rows)
    hidden = torch.randn(rows, shape.hidden_size, device="cuda", generator=generator).bfloat16()
    temperature = torch.ones(n, device="cuda")
    seed = torch.arange(n, device="cuda") * 7919 + 3
    positions = torch.arange(n, dtype=torch.int64, device="cuda") * 31
    outputs, calls = {}, {}
    for name, (module, config) in variants.items():
        splits = -(-vocab // config.block_v)
        summaries = [torch.empty(rows, splits, device="cuda") for _ in range(5)]
        summaries[1] = torch.empty(rows, splits, device="cuda", dtype=torch.int32)

        def call(module=module, config=config, summaries=tuple(summaries)):
            module.launch(
                hidden,
                lm_head,
                vocab,
                summaries,
                verify=True,
                temperature=temperature,
                seed=seed,
                positions=positions,
                gamma=gamma,
                config=module.HopperConfig(*config),
            )

        call()
        torch.cuda.synchronize()
        outputs[name], calls[name] = (summaries, config.block_v), call
    base, base_block_v = outputs["old"]
    equal = {}
    for name, (summaries, block_v) in outputs.items():
        same = all(map(torch.equal, per_row_best(summaries), per_row_best(base)))
        if block_v == base_block_v:
            same = same and all(map(torch.equal, summaries[:2], base[:2]))
        equal[name] = same
    calls["matmul"] = lambda: hidden @ lm_head.T
    medians = {k: statistics.median(v) for k, v in time_graphs(calls, 20, 200).items()}
    matmul = medians.pop("matmul")
    config = variants["new"][1]
    return (
        f"{head:11} R={rows:<4} {config.block_n, config.block_v} matmul {matmul:7.1f} | "
        + " ".join(f"{k} {v:7.1f} ({v / matmul:.3f})" for k, v in medians.items())
        + f" | equal {equal}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", required=True, help="a kernels/hopper_tiles.py to compare")
    parser.add_argument("--rows", nargs="+", type=int, default=[64, 128, 256, 512])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b", "qwen3-8b", "gemma3-12b"])
    parser.add_argument(
        "--config", nargs="*", default=[], help="NAME=n,v,k,stages,chunk,warps,regs"
    )
    args = parser.parse_args()
    named = {}
    for spec in args.config:
        name, values = spec.split("=")
        named[name] = hopper_tiles.HopperConfig(*(int(x) for x in values.split(",")))
    baseline = module_from(args.baseline)
    print(torch.cuda.get_device_name(), flush=True)
    for head in args.heads:
        for rows in args.rows:
            table = hopper_row("verify_resample", rows)
            variants = {"old": (baseline, table), "new": (hopper_tiles, table)}
            variants.update({k: (hopper_tiles, c) for k, c in named.items()})
            print(compare(head, rows, variants), flush=True)


if __name__ == "__main__":
    main()
