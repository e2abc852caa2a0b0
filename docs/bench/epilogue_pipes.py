"""Which instructions of the Hopper verify epilogue slow the fused kernel at 128-512 rows, timed
at steady state (Llama-3 head, bf16, γ = 3, T = 1).

    OUT=. python docs/bench/epilogue_pipes.py ROWS HEADS VARIANTS
    e.g. OUT=. python docs/bench/epilogue_pipes.py 128,512 llama3-8b \
             matmul,shipped,wide,nohash,alu21,imadlo28,imad14,ffma28,gemm_alone

Variants are text-edited copies of ``kernels/hopper_tiles.py`` / ``kernels/noise.py``:

- ``shipped``; ``wide``: the hash's multiply-mod through one 64-bit product (bit-exact);
  ``winner_patch``: ``docs/bench/winner_pass_series_top2.patch`` applied (bit-exact);
- ``nohash``: the ranking pass's 7-multiply-mod hash replaced by one multiply-add;
  ``alu21`` / ``ffma28`` / ``imadlo28`` / ``imad14``: by chains of one instruction class of
  about the hash's length: ~26 integer-ALU instructions, 28 FFMA, 28 32-bit IMAD, or 14 IMAD.HI
  + 14 IMAD (timing only: the winner is still scored with the real hash);
- ``gemm_alone``: the epilogue skips its chunks (the GEMM pipeline alone).

At the power limit the SM clock follows the power drawn, so each variant's graph is replayed
untimed for ``SETTLE`` s, then timed for ``TIME`` s; ``ROUNDS`` rounds in a shuffled order.
``nvidia-smi`` samples the SM clock and power. Bit-exact variants are checked against the
shipped kernel's summaries. Output: ``$OUT/epilogue_pipes.json``; log
docs/bench/epilogue_pipes_h200.log, docs/BENCHMARKS.md ("Kernel ops — what bounds them").
"""

import datetime
import importlib.util
import json
import os
import pathlib
import random
import statistics
import subprocess
import sys
import tempfile
import time

import torch

from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiles import hopper_row

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = pathlib.Path(os.environ.get("OUT", "."))
SETTLE, TIME, ROUNDS = (
    float(os.environ.get(k, d)) for k, d in (("SETTLE", "1.0"), ("TIME", "1.0"), ("ROUNDS", "2"))
)
MODULES = pathlib.Path(tempfile.mkdtemp(prefix="epilogue_pipes_"))
sys.path.insert(0, str(MODULES))

MUL = "    return _sub_p((lo & P) + ((hi << 1) | (lo >> 31)))\n"
HASH = "    bits = token_bits(gl.expand_dims(key_a, 1), gl.expand_dims(key_b, 1), ids)\n"
X0 = "    x = ids.to(gl.uint32) * gl.expand_dims(key_a, 1) + gl.expand_dims(key_b, 1)\n"
END = "    bits = x & 0x3FFFFFFF\n"


def chain(statement: str, count: int) -> str:
    return X0 + "".join(f"    {statement}\n" for _ in range(count)) + END


# name -> (edits of noise.py, edits of hopper_tiles.py)
VARIANTS = {
    "shipped": ([], []),
    "winner_patch": ([], []),
    "wide": (
        [
            (
                "    lo = x * y\n    hi = tl.umulhi(x, y)\n" + MUL,
                "    z = x.to(tl.uint64) * y.to(tl.uint64)\n"
                "    return _sub_p(((z & P) + (z >> 31)).to(tl.uint32))\n",
            )
        ],
        [],
    ),
    "nohash": ([], [(HASH, X0 + END)]),
    "alu21": ([], [(HASH, chain("x = ((x & 0x7FFFFFFF) + (x >> 7)) ^ (x << 3)", 7))]),
    "imadlo28": ([], [(HASH, chain("x = x * x + 1013904223", 28))]),
    "imad14": ([], [(HASH, chain("x = gl.umulhi(x, 1664525) + x * 22695477", 14))]),
    "ffma28": (
        [],
        [
            (
                HASH,
                X0
                + "    f = x.to(gl.float32)\n"
                + "".join("    f = f * 1.0001 + 0.37\n" for _ in range(28))
                + "    x = f.to(gl.uint32)\n"
                + END,
            )
        ],
    ),
    "gemm_alone": (
        [],
        [("for chunk in range(live_chunks):", "for chunk in range(live_chunks * 0):")],
    ),
}
EXACT = ("shipped", "wide", "winner_patch")


def sources(name: str) -> tuple[str, str]:
    """(noise.py, hopper_tiles.py) of ``name``'s starting point: the tree's, or with the winner
    patch applied."""
    if name != "winner_patch":
        return tuple((ROOT / "kernels" / f).read_text() for f in ("noise.py", "hopper_tiles.py"))
    work = pathlib.Path(tempfile.mkdtemp(prefix="winner_patch_"))
    (work / "kernels").mkdir()
    for file in ("noise.py", "hopper_tiles.py"):
        (work / "kernels" / file).write_text((ROOT / "kernels" / file).read_text())
    subprocess.run(["git", "init", "-q"], cwd=work, check=True)
    patch = ROOT / "docs/bench/winner_pass_series_top2.patch"
    subprocess.run(["git", "apply", str(patch)], cwd=work, check=True)
    return (work / "kernels/noise.py").read_text(), (work / "kernels/hopper_tiles.py").read_text()


def load(name: str):
    """The kernel module of variant ``name``, imported from a scratch file."""
    noise, kernel = sources(name)
    noise_edits, kernel_edits = VARIANTS[name]
    for old, new in noise_edits:
        assert old in noise, (name, old)
        noise = noise.replace(old, new)
    (MODULES / f"_noise_{name}.py").write_text(noise)
    noise_import = "from flashspec_export.kernels.noise import"
    kernel = kernel.replace(noise_import, f"from _noise_{name} import")
    for old, new in kernel_edits:
        assert old in kernel, (name, old)
        kernel = kernel.replace(old, new)
    path = MODULES / f"_hopper_tiles_{name}.py"
    path.write_text(kernel)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def graph_of(fn, ms: float = 40.0):
    """(a CUDA graph of about ``ms`` of back-to-back calls of ``fn``, its call count)."""
    fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    calls = max(1, int(ms / 1e3 / max(time.perf_counter() - start, 1e-6)))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(calls):
            fn()
    graph.replay()
    torch.cuda.synchronize()
    return graph, calls


def sustain(graph, calls: int, seconds: float) -> tuple[float, float, float]:
    """Replay ``graph`` for about ``seconds``: (µs per call, start, stop)."""
    start, replays = time.time(), 0
    while time.time() - start < seconds:
        graph.replay()
        replays += 1
        if replays % 4 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    stop = time.time()
    return 1e6 * (stop - start) / (replays * calls), start, stop


def smi_samples(path: pathlib.Path) -> list[tuple[float, float, float]]:
    """(time, SM MHz, W) of the ``nvidia-smi`` log."""
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append((stamp, float(parts[1]), float(parts[2])))
        except (ValueError, IndexError):
            continue
    return samples


def verify_calls(modules: dict, shape: HeadShape, lm_head, rows: int) -> tuple[dict, dict]:
    """(no-argument calls of each module's verify stage 1 at ``rows`` rows, and of the matmul;
    each module's summaries) on random rows: N = rows / 4 sequences, γ = 3, T = 1."""
    n = rows // 4
    hidden = torch.randn(rows, shape.hidden_size, device="cuda").bfloat16()
    temperature = torch.ones(n, device="cuda")
    seed = torch.randint(0, 2**62, (n,), device="cuda")
    positions = torch.randint(0, 2**20, (n,), device="cuda")
    config = hopper_row("verify_resample", rows)
    splits = -(-shape.vocab_size // config.block_v)

    def launcher(module, out):
        return lambda: module.launch(
            hidden,
            lm_head,
            shape.vocab_size,
            tuple(out),
            verify=True,
            temperature=temperature,
            seed=seed,
            positions=positions,
            gamma=3,
            config=module.HopperConfig(*config),
        )

    calls, summaries = {"matmul": lambda: hidden @ lm_head.T}, {}
    for name, module in modules.items():
        summaries[name] = [torch.zeros(rows, splits, device="cuda") for _ in range(5)]
        summaries[name][1] = torch.zeros(rows, splits, device="cuda", dtype=torch.int32)
        calls[name] = launcher(module, summaries[name])
    return calls, summaries


def measure(modules: dict, names: list[str], shape: HeadShape, lm_head, rows: int) -> dict:
    """Steady-state µs per call of every variant in ``names`` at ``rows`` rows, and the time
    windows it was timed in."""
    calls, summaries = verify_calls(modules, shape, lm_head, rows)
    graphs = {name: graph_of(calls[name]) for name in names}
    for name in (n for n in EXACT if n in summaries and n != "shipped" and "shipped" in summaries):
        out, ref = summaries[name], summaries["shipped"]
        equal = torch.equal(out[0], ref[0]) and torch.equal(out[1], ref[1])
        print(f"  {shape.name} R={rows} {name} equal to shipped: {equal}", flush=True)
    times = {name: [] for name in names}
    windows = {name: [] for name in names}
    order = random.Random(rows)
    for _ in range(int(ROUNDS)):
        for name in order.sample(names, len(names)):
            sustain(*graphs[name], SETTLE)
            us, start, stop = sustain(*graphs[name], TIME)
            times[name].append(us)
            windows[name].append((start, stop))
    med = {name: statistics.median(t) for name, t in times.items()}
    matmul = med.get("matmul", 1.0)
    line = "  ".join(f"{name} {us:.1f} ({us / matmul:.3f})" for name, us in med.items())
    print(f"{shape.name} R={rows}: {line}", flush=True)
    return dict(head=shape.name, rows=rows, us=times, windows=windows)


def main(rows_list: list[int], heads: list[str], names: list[str]) -> None:
    modules = {name: load(name) for name in names if name != "matmul"}
    log = OUT / "epilogue_pipes_smi.csv"
    query = "--query-gpu=timestamp,clocks.sm,power.draw"
    smi = subprocess.Popen(
        ["nvidia-smi", query, "--format=csv,noheader,nounits", "-lms", "50"],
        stdout=log.open("w"),
    )
    results = []
    for head in heads:
        shape = HeadShape.from_name(head)
        lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
        lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
        results += [measure(modules, names, shape, lm_head, rows) for rows in rows_list]
    smi.terminate()
    smi.wait()
    samples = smi_samples(log)
    for result in results:
        line = []
        for name, spans in result["windows"].items():
            inside = [s for s in samples if any(a <= s[0] <= b for a, b in spans)]
            if inside:
                mhz = statistics.median(s[1] for s in inside)
                watts = statistics.median(s[2] for s in inside)
                line.append(f"{name} {mhz:.0f}MHz {watts:.0f}W")
        print(f"  R={result['rows']} {result['head']}: " + "  ".join(line), flush=True)
    (OUT / "epilogue_pipes.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1].split(",")], sys.argv[2].split(","), sys.argv[3].split(","))
