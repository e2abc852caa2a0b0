"""A/B of the padded row block at 32 rows (as shipped now) against the raw rows, three heads."""
import statistics, sys
import torch
sys.path.insert(0, "scripts"); sys.path.insert(0, "docs/bench")
from kernel_bench import time_graph
from small_rows_verify import operands, HEADS
from flashspec_export.kernels import hopper_tiles
from flashspec_export.kernels.verify_resample import verify_resample

def us(fn): return statistics.median(time_graph(fn, 20))
shipped = hopper_tiles._whole_row_block
for head in HEADS:
    for rep in range(2):
        args, flat, lm_head = operands(head, 32)
        t = {"mm32": us(lambda: flat @ lm_head.T)}
        t["pad"] = us(lambda: verify_resample(*args))
        a = verify_resample(*args)
        hopper_tiles._whole_row_block = lambda h, b: h
        t["raw"] = us(lambda: verify_resample(*args))
        b = verify_resample(*args)
        hopper_tiles._whole_row_block = shipped
        same = torch.equal(a.tokens, b.tokens) and torch.equal(a.num_emitted, b.num_emitted)
        cells = "  ".join(f"{k} {v:.1f} ({v/t['mm32']:.3f})" for k, v in t.items())
        print(f"{head} rep{rep} {cells} same={same}", flush=True)
