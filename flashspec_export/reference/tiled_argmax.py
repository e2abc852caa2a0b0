"""Reference ``TiledArgmax``: greedy drafting as one pass over vocabulary tiles.

Mirrors the kernels: each vocabulary tile yields a (max, index) summary per row, computed from
logits that exist only for that tile; a final reduction keeps the largest value and, on ties,
the lowest index (the earliest tile wins ties because the comparison is strict).
"""

from __future__ import annotations

import torch

from flashspec_export.reference.verify_resample import no_nan

DEFAULT_BLOCK_V = 4096


def tiled_argmax(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    vocab_size: int,
    *,
    block_v: int = DEFAULT_BLOCK_V,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Argmax of ``hidden @ lm_head[:vocab_size].T`` without materialising the logits.

    Parameters
    ----------
    hidden : [N, H] float tensor
    lm_head : [V, H] float tensor (same dtype)
    vocab_size : rows ``>= vocab_size`` of ``lm_head`` are padding and never chosen
    block_v : vocabulary tile size (the result does not depend on it)

    Returns
    -------
    token : [N] int64, the lowest index among the maximal logits (NaN logits count as -inf)
    max_logit : [N] float32, the maximal logit (fp32 accumulation; -inf when none is above it)
    """
    hidden32 = hidden.float()  # [N, H]
    tile_max, tile_arg = [], []
    for start in range(0, vocab_size, block_v):
        stop = min(start + block_v, vocab_size)
        logits = no_nan(hidden32 @ lm_head[start:stop].float().T)  # [N, tile]: the only logits
        value, index = logits.max(dim=-1)  # first occurrence on ties
        tile_max.append(value)
        tile_arg.append(index + start)
    values = torch.stack(tile_max, dim=-1)  # [N, tiles]
    indices = torch.stack(tile_arg, dim=-1)  # [N, tiles]
    best_value, best_tile = values.max(dim=-1)  # first (lowest-index) tile on ties
    token = indices.gather(-1, best_tile[:, None]).squeeze(-1)
    return token, best_value
