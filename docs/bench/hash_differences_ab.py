"""The Hopper verify stage 1 with the first hash round by finite differences (``_run_bits``,
commit 64cc352) against the kernel before it (commit 609569c, loaded from git), with the cuBLAS
matmul, timed in one settled run (``scripts/kernel_bench.time_graphs``). Extra epilogue shapes
(``CHUNK:REGS``) run the new kernel with that chunk and register count. Every variant's
per-(row, tile) summaries are checked equal to the old kernel's, bit for bit.

    python docs/bench/hash_differences_ab.py 64,128,256,512 llama3-8b,qwen3-8b,gemma3-12b 16:192

Logs: docs/bench/hash_differences_ab_{h100,h200}.log.
"""

from __future__ import annotations

import functools
import importlib.util
import pathlib
import statistics
import subprocess
import sys
import tempfile

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[2] / "scripts"))
from kernel_bench import time_graphs

from flashspec_export.config import HeadShape
from flashspec_export.kernels import hopper_tiles as new
from flashspec_export.kernels.tiles import hopper_row

ROOT = pathlib.Path(__file__).resolve().parents[2]
BEFORE = "609569c"


def _kernel_before():
    source = subprocess.run(
        ["git", "show", f"{BEFORE}:kernels/hopper_tiles.py"],
        cwd=ROOT,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    path = pathlib.Path(tempfile.mkdtemp()) / "hopper_tiles_before.py"
    path.write_text(source)  # Triton reads a jit function's source from its file
    spec = importlib.util.spec_from_file_location("hopper_tiles_before", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(rows_list, heads, shapes):
    old = _kernel_before()
    print(torch.cuda.get_device_name(), flush=True)
    for head in heads:
        shape = HeadShape.from_name(head)
        lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
        lm *= shape.hidden_size**-0.5
        for rows in rows_list:
            gamma = 3
            n = rows // (gamma + 1)
            g = torch.Generator(device="cuda").manual_seed(rows)
            hidden = torch.randn(
                rows, shape.hidden_size, device="cuda", dtype=torch.bfloat16, generator=g
            )
            temperature = torch.ones(n, device="cuda")
            seed = torch.arange(n, device="cuda") * 7919 + 3
            positions = torch.arange(n, dtype=torch.int64, device="cuda") * 31
            config = hopper_row("verify_resample", rows)
            splits = -(-shape.vocab_size // config.block_v)
            variants = {"old": (old, old.HopperConfig(*config)), "new": (new, config)}
            for chunk, regs in shapes:
                variants[f"new_c{chunk}r{regs}"] = (
                    new,
                    config._replace(chunk=chunk, epi_regs=regs),
                )
            fns, summaries = {}, {}
            for name, (module, cfg) in variants.items():
                out = tuple(torch.empty(rows, splits, device="cuda") for _ in range(5))
                out = (out[0], out[1].int(), *out[2:])

                call = functools.partial(
                    module.launch, hidden, lm, shape.vocab_size, out, verify=True,
                    temperature=temperature, seed=seed, positions=positions, gamma=gamma,
                    config=cfg,
                )  # fmt: skip
                call()
                fns[name], summaries[name] = call, out
            torch.cuda.synchronize()
            first = summaries["old"]
            equal = {
                k: torch.equal(s[0], first[0]) and torch.equal(s[1], first[1])
                for k, s in summaries.items()
            }
            fns["matmul"] = functools.partial(torch.matmul, hidden, lm.T)
            medians = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
            mm = medians.pop("matmul")
            timings = " ".join(f"{k} {v:7.1f} ({v / mm:.3f})" for k, v in medians.items())
            print(
                f"{head:11} R={rows:<4} {tuple(config)[:2]} chunk {config.chunk} matmul {mm:7.1f}"
                f" | {timings} | equal {equal}",
                flush=True,
            )


if __name__ == "__main__":
    main(
        [int(r) for r in sys.argv[1].split(",")],
        sys.argv[2].split(","),
        [tuple(int(x) for x in s.split(":")) for s in sys.argv[3].split(",")]
        if sys.argv[3:]
        else [],
    )
