"""Why the Hopper verify kernel's epilogue hides poorly behind its GEMM at 256-512 rows: the SM
clock and power under each variant of `hopper_epilogue_variants.py`, and single launches for
Nsight Compute (Llama-3 head, bf16, γ = 3, T = 1).

    OUT=... python docs/bench/hopper_profile.py clocks [ROWS]
        each variant (and the matmul) replayed back to back in a CUDA graph for a few seconds
        while `nvidia-smi` samples the SM clock, power and throttle reasons every 20 ms;
        prints per variant µs per call, median clock and power, and the throttle reasons seen
    python docs/bench/hopper_profile.py once VARIANT [ROWS]
        three launches of one variant; profile the last:
        ncu --set full -k regex:hopper_tiles --launch-skip 2 --launch-count 1 -o ncu_VARIANT \
            python docs/bench/hopper_profile.py once VARIANT 512

Results: docs/bench/hopper_clocks_{h100,h200}.log and the
section "Kernel ops — what bounds them" of docs/BENCHMARKS.md.
"""

import datetime
import json
import os
import pathlib
import statistics
import subprocess
import sys
import time

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from hopper_epilogue_variants import VARIANTS, load, verify_call

from flashspec_export.config import HeadShape

OUT = pathlib.Path(os.environ.get("OUT", "."))
SMI_FIELDS = "timestamp,clocks.sm,clocks.mem,power.draw,temperature.gpu,clocks_event_reasons.active"


def variant_call(name: str, rows: int):
    """A no-argument call of variant ``name`` (or ``matmul``) at ``rows`` rows."""
    shape = HeadShape.from_name("llama3-8b")
    torch.manual_seed(0)
    lm_head = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda")
    lm_head = (lm_head * shape.hidden_size**-0.5).bfloat16()
    module = load("as_is" if name == "matmul" else name, VARIANTS.get(name, []))
    hidden, call = verify_call(module, rows, lm_head, shape.vocab_size)
    return (lambda: hidden @ lm_head.T) if name == "matmul" else call


def sustained(call, seconds: float) -> tuple[float, float, float]:
    """Replay a 20-call CUDA graph of ``call`` for about ``seconds``: (start, stop) wall times of
    the timed part and µs per call."""
    call()
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for _ in range(20):
            call()
    graph.replay()
    torch.cuda.synchronize()
    t0 = time.time()
    graph.replay()
    torch.cuda.synchronize()
    per_replay = time.time() - t0
    replays = max(1, int(seconds / per_replay))
    time.sleep(0.5)  # idle gap between phases in the clock log
    graph.replay()  # warm the clocks for half a second before timing
    for _ in range(max(1, int(0.5 / per_replay))):
        graph.replay()
    torch.cuda.synchronize()
    start = time.time()
    for _ in range(replays):
        graph.replay()
    torch.cuda.synchronize()
    stop = time.time()
    return start, stop, 1e6 * (stop - start) / (20 * replays)


def smi_samples(path: pathlib.Path) -> list[dict]:
    """The `nvidia-smi` log as dicts (timestamp as a Unix time)."""
    samples = []
    for line in path.read_text().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) != 6:
            continue
        try:
            stamp = datetime.datetime.strptime(parts[0], "%Y/%m/%d %H:%M:%S.%f").timestamp()
            samples.append(
                dict(
                    t=stamp,
                    sm_mhz=float(parts[1]),
                    mem_mhz=float(parts[2]),
                    watts=float(parts[3]),
                    celsius=float(parts[4]),
                    reasons=parts[5],
                )
            )
        except ValueError:
            continue
    return samples


def clocks(rows: int) -> None:
    names = ["matmul", *VARIANTS]
    calls = {name: variant_call(name, rows) for name in names}
    log = OUT / f"smi_{rows}.csv"
    with log.open("w") as sink:
        smi = subprocess.Popen(
            [
                "nvidia-smi",
                f"--query-gpu={SMI_FIELDS}",
                "--format=csv,noheader,nounits",
                "-lms",
                "20",
            ],
            stdout=sink,
        )
        time.sleep(1.0)
        windows = {name: sustained(call, 3.0) for name, call in calls.items()}
        time.sleep(0.5)
        smi.terminate()
        smi.wait()
    samples = smi_samples(log)
    results = []
    for name, (start, stop, us) in windows.items():
        inside = [s for s in samples if start <= s["t"] <= stop]
        reasons = sorted({s["reasons"] for s in inside})
        row = dict(
            rows=rows,
            variant=name,
            us=us,
            samples=len(inside),
            sm_mhz=statistics.median(s["sm_mhz"] for s in inside) if inside else None,
            watts=statistics.median(s["watts"] for s in inside) if inside else None,
            celsius=max(s["celsius"] for s in inside) if inside else None,
            reasons=reasons,
        )
        results.append(row)
        print(
            f"R={rows} {name:24s} {us:8.1f} us  {row['sm_mhz']} MHz  {row['watts']} W  "
            f"{row['celsius']} C  samples {len(inside)}  reasons {reasons}",
            flush=True,
        )
    (OUT / f"hopper_clocks_{rows}.json").write_text(json.dumps(results, indent=1))


def once(name: str, rows: int) -> None:
    call = variant_call(name, rows)
    for _ in range(3):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    mode = sys.argv[1]
    if mode == "clocks":
        clocks(int(sys.argv[2]) if len(sys.argv) > 2 else 512)
    elif mode == "once":
        once(sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 512)
    else:
        raise SystemExit(f"mode must be 'clocks' or 'once', got {mode!r}")
