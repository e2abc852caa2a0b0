"""Why the real export's time between target steps grows while the loop's own work does not
(issue 33): the same replayed tokens, loop, TextStream and n-gram drafter, with a target step
that does nothing but read a buffer growing with the position (~8 KB per position, like the
stdlib-tiny export's attention over its live KV cache). The host code after it is unchanged,
yet slows as the read evicts the CPU caches it runs from.

python docs/bench/cache_pollution.py   # 2-core CPU: docs/bench/cache_pollution.log
"""

import dataclasses
import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
import long_run as lr
from transformers import AutoTokenizer

from flashspec_export.models.build import ExportConfig, resolve_trained
from flashspec_export.models.ngram import NgramDrafter

cfg = resolve_trained(ExportConfig(target="stdlib-tiny"))
tok = AutoTokenizer.from_pretrained(cfg.target)
src = "\n".join(p.read_text() for p in sorted(pathlib.Path("flashspec_export").rglob("*.py")))
ids = tok(src)["input_ids"]
while len(ids) < 17000:
    ids = ids + ids
prompt = [ids[:20]]
n = 16384
script = ids[: 20 + n + 8]
base = lr.replayed_target(script, len(script))
cache = torch.randn(len(script) * 2048)  # ~8 KB per position, like 4 layers of k and v


def step(tokens, positions, k, v, t, s):
    p = int(positions[0])
    cache[: p * 2048].sum()  # read the live "cache", as attention does
    return base.step(tokens, positions, k, v, t, s)


for name, target in (("plain", base), ("thrash", dataclasses.replace(base, step=step))):
    res, w = lr.timed_run(target, NgramDrafter(), tok, prompt, n, 3, 0.8, 0)
    print(
        name,
        round(w["first_1000"]["host_ms_per_step"], 3),
        round(w["last_1000"]["host_ms_per_step"], 3),
        round(w["host_ratio_last_to_first"], 2),
        "target",
        round(w["first_1000"]["target_ms_per_step"], 2),
        round(w["last_1000"]["target_ms_per_step"], 2),
    )
