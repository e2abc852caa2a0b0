"""How often a per-split hand-in of order keys settles the truncated kept set, for hand-in rules a
stage 1 could use, on the stdlib-tiny target's real logits (CPU, fp32, V 4096): the portable
kernel's and the ones a Hopper epilogue could afford (issue 35's top-k / top-p at 64-512 rows).

A split hands in some of its keys and a floor, the largest key it kept back; stage 2 settles a
row when the kept set lies above the largest floor (``kernels/verify_resample.py``,
``_truncated_summaries``). Rules, per split of ``block_v`` ids (one tile):

- ``exact top-C``: the C largest keys of the split;
- ``lanes``: each of ``lanes`` lanes keeps the two largest keys of its run (consecutive ids, or
  strided: ids ``lane + lanes · j``) and the largest it let go, and the split hands in the C
  largest of the lanes' keys (ceee57e's Hopper epilogue: C 4, consecutive runs).

Per rule and (T, top-k, top-p): the share of rows not settled, and for a refill (recompute only
the tiles whose floor is at or above a provisional cut — top-k's k-th handed-in key, or the key
where the handed-in mass reaches p — then settle again, exactly) the mean number of tiles a row
would recompute. Rows never settled by any rule here are wide nuclei (recomputed in full).

    python docs/bench/hand_in_settle.py      # log: docs/bench/hand_in_settle_cpu.log
"""

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).parent))
from truncation_speed import stdlib_tiny_states

EMPTY = -(2**40)
CASES = ((0.7, 20, 1.0), (1.0, 50, 1.0), (1.0, 100, 1.0), (0.7, 0, 0.9), (1.0, 0, 0.9),
         (1.0, 0, 0.95))  # fmt: skip
RULES = (  # (name, block_v, lanes (0: exact top-C), strided, C)
    ("portable kernel: exact top-32 of 64 ids", 64, 0, False, 32),
    ("exact top-32 of 128 ids", 128, 0, False, 32),
    ("exact top-16 of 128 ids", 128, 0, False, 16),
    ("ceee57e: 4 of 8 lanes x 16 consecutive ids", 128, 8, False, 4),
    ("ceee57e: 4 of 16 lanes x 16 consecutive ids", 256, 16, False, 4),
    ("8 of 8 lanes x 16 strided ids", 128, 8, True, 8),
    ("all 16 of 8 lanes x 16 strided ids", 128, 8, True, 16),
)


def hand_in(keys, block_v, lanes, strided, c):
    """[P, T, C] handed-in keys (descending) and [P, T] floors of ``keys [P, V]``."""
    p, v = keys.shape
    tiles = keys.view(p, v // block_v, block_v)
    if lanes == 0:
        ranked = tiles.sort(dim=2, descending=True).values
        return ranked[..., :c], ranked[..., c]
    run = block_v // lanes
    runs = (
        tiles.view(p, -1, run, lanes).transpose(2, 3) if strided else tiles.view(p, -1, lanes, run)
    )
    top = runs.topk(3, dim=3).values  # a lane's two largest and the largest it let go
    offered = top[..., :2].flatten(2).sort(dim=2, descending=True).values
    rest = offered[..., c] if c < offered.shape[2] else torch.full_like(offered[..., 0], EMPTY)
    return offered[..., :c], torch.maximum(rest, top[..., 2].amax(2))


def ranked(logits, temperature):
    """Per row at ``temperature``: the order keys ``[P, V]`` (a key is -(its rank), larger =
    earlier) and the probabilities by rank ``[P, V]``."""
    scaled = logits / temperature
    order = scaled.argsort(dim=1, descending=True, stable=True)
    ranks = -torch.arange(order.shape[1]).expand_as(order)
    return torch.empty_like(order).scatter_(1, order, ranks), torch.softmax(scaled, 1).gather(
        1, order
    )


def settle(keys, mass_by_rank, top_k, top_p, rule):
    """(share of rows not settled, mean tiles a refill recomputes)."""
    _, block_v, lanes, strided, c = rule
    handed, floors = hand_in(keys, block_v, lanes, strided, c)
    union = handed.flatten(1).sort(dim=1, descending=True).values
    union = torch.cat([union, torch.full_like(union[:, :1], EMPTY).expand(-1, 1024)], 1)
    above = union > floors.amax(1, keepdim=True)  # the exact prefix of the row's order
    if top_k:
        settled, cut = above.sum(1) >= top_k, union[:, top_k - 1]
    else:
        mass = mass_by_rank.gather(1, (-union).clamp(max=keys.shape[1] - 1))
        reached = (mass * (union > EMPTY)).cumsum(1) >= top_p
        settled = (reached & above).any(1)
        cut = union.gather(1, reached.float().argmax(1, keepdim=True))[:, 0]
        cut = torch.where(reached.any(1), cut, torch.full_like(cut, EMPTY))
    refill = (floors >= cut[:, None]).sum(1).float()
    return 1 - settled.float().mean().item(), refill.mean().item()


def main() -> None:
    hidden, lm_head = stdlib_tiny_states("cpu")
    with torch.no_grad():
        logits = hidden @ lm_head.T
    print(f"stdlib-tiny: {logits.shape[0]} positions, V {logits.shape[1]}; per case: unsettled "
          "rows, mean tiles a refill recomputes (of V / block_v)")  # fmt: skip
    by_temperature = {t: ranked(logits, t) for t in sorted({case[0] for case in CASES})}
    for rule in RULES:
        cells = []
        for temperature, top_k, top_p in CASES:
            left, refill = settle(*by_temperature[temperature], top_k, top_p, rule)
            cells.append(f"T {temperature} k {top_k} p {top_p}: {100 * left:.1f}% / {refill:.1f}")
        print(f"{rule[0]} (tiles of {rule[1]}): " + " | ".join(cells), flush=True)


if __name__ == "__main__":
    main()
