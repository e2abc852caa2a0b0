"""How much of the verify epilogue an exact lazy two-level sample could skip (issue 34's "lazy
noise"), replayed on the CPU with the reference's noise (``reference.verify_resample``). A 64-id
block can be skipped when ``M_b + log 64 + g_b`` (its score's bound: ``S_b <= 64``) is below a
score the row already reached; the Hopper epilogue could only skip a whole chunk (16 rows x 128
ids) at once, and only from a bound other CTAs wrote before (a tile of wave w of the 132
persistent CTAs sees the tiles of waves before it). Per case: the share of (row, block) pairs
below the row's final best (any bound's ceiling), below the bound the schedule would have, and
the share of chunks the epilogue would skip.

    python docs/bench/lazy_noise_skip.py      # docs/bench/lazy_noise_skip_cpu.log
"""

from __future__ import annotations

import pathlib
import sys

import torch

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
from truncation_speed import stdlib_tiny_states

from flashspec_export.config import HeadShape
from flashspec_export.reference import noise
from flashspec_export.reference import verify_resample as reference

BLOCK_V, BLOCK_N, CHUNK, CTAS = 128, 128, 16, 132
LOG_BLOCK = 4.2  # >= log(64), the largest log S_b


def skip_shares(logits: torch.Tensor) -> tuple[float, float, float]:
    """(pairs below the final best, pairs below the schedule's bound, chunks skipped) for
    ``logits [R, V]`` (R a multiple of CHUNK, V of BLOCK_V), T = 1, seeds 1.., positions 0.."""
    rows, vocab = logits.shape
    seed = torch.arange(rows) + 1
    position = torch.zeros(rows, dtype=torch.int64)
    keys_g = noise.row_keys(seed, position, noise.STREAM_GUMBEL)
    keys_u = noise.row_keys(seed, position, noise.STREAM_PICK)
    score, _ = reference.block_samples(logits, 0, keys_g, keys_u)  # [R, nb]
    blocks = torch.arange(vocab // reference.SAMPLE_BLOCK)
    g = noise.gumbel_from_bits(noise.token_bits(keys_g[0][:, None], keys_g[1][:, None], blocks))
    bound = logits.unflatten(1, (-1, reference.SAMPLE_BLOCK)).amax(2) + LOG_BLOCK + g
    per_tile = BLOCK_V // reference.SAMPLE_BLOCK
    tiles = vocab // BLOCK_V
    row_blocks = -(-rows // BLOCK_N)
    best = score.amax(1, keepdim=True)
    below_best = (bound < best).float().mean().item()
    tile_best = score.view(rows, tiles, per_tile).amax(2)  # [R, tiles]
    tile_bound = bound.view(rows, tiles, per_tile)
    pairs = chunks = skipped_pairs = skipped_chunks = 0
    for rb in range(row_blocks):
        here = slice(rb * BLOCK_N, min(rows, (rb + 1) * BLOCK_N))
        # the persistent CTAs walk row blocks innermost: tile v of this row block is in wave
        # (v · row_blocks + rb) // CTAS and sees the best of the waves before it (a prefix)
        wave = (torch.arange(tiles) * row_blocks + rb) // CTAS
        first = torch.searchsorted(wave, wave)  # each tile's wave's first tile
        prefix = torch.cummax(tile_best[here], 1).values
        before = prefix[:, (first - 1).clamp(min=0)]
        known = torch.where(first > 0, before, float("-inf"))  # [rows, tiles]
        skip = tile_bound[here] < known[..., None]  # [rows, tiles, per_tile]
        skipped_pairs += int(skip.sum())
        pairs += skip.numel()
        by_chunk = skip.unflatten(0, (-1, CHUNK)) if skip.shape[0] % CHUNK == 0 else None
        assert by_chunk is not None, "rows: a multiple of CHUNK"
        whole = by_chunk.all(dim=3).all(dim=1)  # [chunks, tiles]
        skipped_chunks += int(whole.sum())
        chunks += whole.numel()
    return below_best, skipped_pairs / pairs, skipped_chunks / chunks


def main() -> None:
    torch.set_grad_enabled(False)
    head = HeadShape.from_name("llama3-8b")
    g = torch.Generator().manual_seed(0)
    lm = torch.randn(head.vocab_size, head.hidden_size, generator=g) * head.hidden_size**-0.5
    lm = lm.to(torch.bfloat16).float()
    vocab = head.vocab_size // BLOCK_V * BLOCK_V  # whole tiles (the last partial tile left out)
    for rows in (128, 512):
        hidden = (4 * torch.randn(rows, head.hidden_size, generator=g)).to(torch.bfloat16).float()
        shares = skip_shares((hidden @ lm[:vocab].T).contiguous())
        print(f"llama3-8b head, std-4 logits, R={rows}: pairs below the final best "
              f"{shares[0]:.3f}, below the schedule's bound {shares[1]:.3f}, chunks skipped "
              f"{shares[2]:.3f}", flush=True)  # fmt: skip
    states, head_weights = stdlib_tiny_states("cpu", files=2, tokens=256)
    for rows in (128, 512):
        shares = skip_shares((states[:rows] @ head_weights.T).contiguous())
        print(f"stdlib-tiny target (V {head_weights.shape[0]}), real logits, R={rows}: pairs "
              f"below the final best {shares[0]:.3f}, below the schedule's bound {shares[1]:.3f}, "
              f"chunks skipped {shares[2]:.3f}", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
