"""Which part of the Hopper verify kernel sets its time: copies of the kernel with parts of the
work removed (by text edits), timed side by side on the heads asked for (default Llama-3; bf16,
γ = 3, T = 1) with the launch table's configuration for each row count. The timings only: the
edited kernels' summaries are wrong by design.

    OUT=. python docs/bench/hopper_epilogue_variants.py                 # 256 and 512 rows
    OUT=. python docs/bench/hopper_epilogue_variants.py --rows 64 128 256 \
        --heads llama3-8b qwen3-8b --variants as_is no_epilogue_work one_k_chunk
    git show 38a0f5c:kernels/hopper_tiles.py > /tmp/hopper_tiles_settle.py
    OUT=. python docs/bench/hopper_epilogue_variants.py --source /tmp/hopper_tiles_settle.py

Variants: ``as_is``; ``no_epilogue_work`` (the epilogue only waits and hands the buffer back:
the GEMM pipeline alone); ``no_hash`` / ``no_gumbel`` (the ranking without the integer hash /
without the approximate Gumbel); ``one_k_chunk`` (one 64-wide K chunk per tile instead of H / 64:
almost no tensor-core work, so the epilogue alone).
Output: the printed lines (docs/bench/hopper_epilogue_variants_*.log) and
``$OUT/hopper_epilogue_variants.json``.
"""

import argparse
import importlib.util
import json
import os
import pathlib
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, "scripts")
from kernel_bench import time_graph

from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiles import hopper_row

SHIPPED = pathlib.Path(__file__).resolve().parents[2] / "kernels" / "hopper_tiles.py"
ONE_K = [("for kk in range(k_iters):", "for kk in range(1):")]
# The chunk loop's first line: the shipped kernel's, then earlier kernels' (38a0f5c's per-row
# pass after the loop is also skipped).
NO_CHUNKS = [
    ("for chunk in range(live_chunks):", "for chunk in range(live_chunks * 0):"),
    (
        "        for chunk in range(NUM_CHUNKS):\n            rows",
        "        for chunk in range(num_rows * 0):\n            rows",
    ),
    (
        "        for chunk in range(NUM_CHUNKS):\n            in_chunk",
        "        for chunk in range(num_rows * 0):\n            in_chunk",
    ),
    (
        "            if any_sampled:\n                # One row per thread",
        "            if num_rows < 0:\n                # One row per thread",
    ),
]
NO_HASH = [
    (  # the finite-difference kernel (64cc352 on)
        "    bits = gl.convert_layout(gl.reshape(run_bits, acc.shape), acc.type.layout, "
        "assert_trivial=True)\n",
        "    bits = (ids * 40503 + gl.expand_dims(key_a, 1).to(gl.int32)).to(gl.uint32)\n"
        "    bits = bits & 0x3FFFFFFF\n",
    ),
    (
        "    bits = token_bits(gl.expand_dims(key_a, 1), gl.expand_dims(key_b, 1), ids)\n"
        "    noise = gumbel_approx",
        "    bits = (ids * 40503 + gl.expand_dims(key_a, 1).to(gl.int32)).to(gl.uint32)\n"
        "    bits = bits & 0x3FFFFFFF\n"
        "    noise = gumbel_approx",
    ),
]
NO_GUMBEL = [
    (
        "    noise = gumbel_approx_from_bits(bits, True)\n",
        "    noise = bits.to(gl.float32) * 1e-9\n",
    )
]
VARIANTS = {
    "as_is": [],
    "no_epilogue_work": NO_CHUNKS,
    "no_hash": NO_HASH,
    "no_gumbel": NO_GUMBEL,
    "no_hash_no_gumbel": NO_HASH + NO_GUMBEL,
    "one_k_chunk": ONE_K,
    "one_k_chunk_no_hash": ONE_K + NO_HASH,
    "one_k_chunk_no_gumbel": ONE_K + NO_GUMBEL,
}


def load(name, edits, source=SHIPPED):
    """The kernel module of ``source`` with ``edits`` applied, imported from a scratch file."""
    src = pathlib.Path(source).read_text()
    applied = 0
    for old, new in edits:
        applied += old in src
        src = src.replace(old, new)
    assert applied or not edits, f"{name}: no edit matches this kernel source"
    path = pathlib.Path(tempfile.mkdtemp()) / f"_hopper_tiles_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"_hopper_tiles_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def verify_call(module, rows: int, lm_head: torch.Tensor, vocab_size: int):
    """(hidden, a no-argument launch of ``module``'s verify kernel at ``rows`` rows with the
    launch table's configuration): random bf16 rows, N = rows / 4 sequences with γ = 3, T = 1."""
    config = hopper_row("verify_resample", rows)
    n = rows // 4
    hidden = torch.randn(rows, lm_head.shape[1], device="cuda").bfloat16()
    temps, seeds = torch.ones(n, device="cuda"), torch.arange(n, device="cuda")
    positions = torch.zeros(n, dtype=torch.int64, device="cuda")
    tiles = -(-vocab_size // config.block_v)
    summaries = [torch.empty(rows, tiles, device="cuda") for _ in range(5)]
    summaries[1] = torch.empty(rows, tiles, device="cuda", dtype=torch.int32)

    def call():
        module.launch(
            hidden,
            lm_head,
            vocab_size,
            tuple(summaries),
            verify=True,
            temperature=temps,
            seed=seeds,
            positions=positions,
            gamma=3,
            config=config,
        )

    return hidden, call


def time_variants(head: str, rows: int, names, source) -> list[dict]:
    """Median µs of the matmul and of each variant in ``names`` at ``rows`` rows of ``head``;
    prints one line."""
    shape = HeadShape.from_name(head)
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    calls = {
        name: verify_call(load(name, VARIANTS[name], source), rows, lm_head, shape.vocab_size)
        for name in names
    }
    hidden = next(iter(calls.values()))[0]
    matmul = statistics.median(time_graph(lambda: hidden @ lm_head.T, 20))
    config = hopper_row("verify_resample", rows)
    line = f"{head:11} R={rows:<4} {config.block_n, config.block_v} matmul {matmul:7.1f}"
    results = []
    for name, (_, call) in calls.items():
        us = statistics.median(time_graph(call, 20))
        line += f" | {name} {us:7.1f} ({us / matmul:.3f})"
        results.append(dict(head=head, rows=rows, variant=name, us=us, matmul=matmul))
    print(line, flush=True)
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", nargs="+", type=int, default=[256, 512])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b"])
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=list(VARIANTS))
    parser.add_argument("--source", default=str(SHIPPED), help="kernels/hopper_tiles.py to edit")
    args = parser.parse_args()
    print(torch.cuda.get_device_name(), flush=True)
    results = [
        r
        for head in args.heads
        for rows in args.rows
        for r in time_variants(head, rows, args.variants, args.source)
    ]
    out = pathlib.Path(os.environ.get("OUT", ".")) / "hopper_epilogue_variants.json"
    out.write_text(json.dumps(results, indent=1))
