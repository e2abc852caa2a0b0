"""The Hopper verify's stage 1 with the two-level epilogue's exact arithmetic swapped for faster
forms (a reciprocal multiply for the IEEE division, ``exp2`` for libdevice's ``expf``), timed
against the shipped kernel, the cuBLAS matmul and two-pass (stage 1 alone; not the contract).

    python docs/bench/two_level_variants.py
"""

import functools
import importlib.util
import pathlib
import statistics
import sys
import tempfile

import torch

sys.path.insert(0, "scripts")
from kernel_bench import time_graphs
from two_pass_sampler import two_pass_verify

from flashspec_export.config import HeadShape
from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.tiles import hopper_row

DIV = "    logits = gl.div_rn(acc, gl.expand_dims(scale, 1))  # IEEE, as the reference's l / T\n"
EXP = "    e = math_exp(x - gl.expand_dims(shift, 2), True) * gl.expand_dims(on, 2)\n"
RECIP = "    logits = acc * gl.expand_dims(gl.div_rn(gl.full_like(scale, 1.0), scale), 1)\n"
EXP2 = (
    "    e = gl.exp2((x - gl.expand_dims(shift, 2)) * 1.4426950408889634) * gl.expand_dims(on, 2)\n"
)
VARIANTS = {
    "shipped": [],
    "recip": [(DIV, RECIP)],
    "exp2": [(EXP, EXP2)],
    "both": [(DIV, RECIP), (EXP, EXP2)],
}


def variant(name):
    src = pathlib.Path(hopper_tiles.__file__).read_text()
    for a, b in VARIANTS[name]:
        assert src.count(a) == 1, a
        src = src.replace(a, b)
    path = pathlib.Path(tempfile.mkdtemp()) / f"ht_{name}.py"
    path.write_text(src)
    spec = importlib.util.spec_from_file_location(f"ht_{name}", path)
    m = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(m)
    return m


mods = {k: variant(k) for k in VARIANTS}
print(torch.cuda.get_device_name(), flush=True)
for head in ("llama3-8b", "qwen3-8b", "gemma3-12b"):
    shape = HeadShape.from_name(head)
    lm = (
        torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda") * shape.hidden_size**-0.5
    ).to(torch.bfloat16)
    for rows in (128, 256, 512):
        gamma, n = 3, rows // 4
        hidden = torch.randn(rows, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
        t, seed = torch.ones(n, device="cuda"), torch.arange(n, device="cuda") * 7 + 3
        pos = torch.arange(n, dtype=torch.int64, device="cuda") * 31
        drafts = torch.zeros(n, gamma, dtype=torch.int64, device="cuda")
        config = hopper_row("verify_resample", rows)
        splits = -(-shape.vocab_size // config.block_v)
        fns, outs = {}, {}
        for k, m in mods.items():
            o = (
                torch.empty(rows, splits, device="cuda"),
                torch.empty(rows, splits, device="cuda", dtype=torch.int32),
            )
            fns[k] = functools.partial(
                m.launch,
                hidden,
                lm,
                shape.vocab_size,
                o,
                verify=True,
                temperature=t,
                seed=seed,
                positions=pos,
                gamma=gamma,
                config=m.HopperConfig(*config),
            )
            fns[k]()
            outs[k] = o
        torch.cuda.synchronize()
        same = {
            k: round((o[1] == outs["shipped"][1]).float().mean().item(), 6) for k, o in outs.items()
        }
        fns["matmul"] = functools.partial(torch.matmul, hidden, lm.T)
        fns["two_pass"] = functools.partial(
            two_pass_verify, hidden.view(n, gamma + 1, -1), lm, drafts, t, shape.vocab_size
        )
        med = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        mm = med.pop("matmul")
        print(
            f"{head:11} R={rows:<4} matmul {mm:7.1f} | "
            + " ".join(f"{k} {v:7.1f} ({v / mm:.3f})" for k, v in med.items())
            + f" | tile ids equal to shipped {same}",
            flush=True,
        )
