"""What a two-level sample would cost the Hopper verify at 128-512 rows (issue 34).

Today every logit gets its own Gumbel noise (a hash of its id, two logs) and the sample is the
argmax of ``logit + noise``. The same law follows from two levels: a block of ids is chosen by a
Gumbel-max over the blocks' log-sum-exps (``max_v∈b (l_v + g_v)`` is Gumbel(LSE_b), independent
of the within-block argmax), then the id inside the chosen block by inverse CDF with one uniform.
Per logit that is an exp, a running sum and a compare; the hash and the logs are paid once per
(row, block). It is a different sampling rule — a noise-version change of the contract, with the
same coupled acceptance (a draft is accepted iff it equals its position's sample).

A copy of the Hopper kernel whose epilogue takes the two-level sample with a block = the tile's
ids of a row (``_block_sampled_chunk_best``; the u of a (row, tile) from ``token_bits`` of the tile
index, its block Gumbel from that of the tile index + 2**30) is timed against the shipped kernel,
the cuBLAS matmul and the two-pass baseline in one settled run (``scripts/kernel_bench``), and its
ids are checked against the same rule in torch (fp32: share of (row, tile) ids equal, largest
|score - torch's|). Sampled rows only (T = 1): greedy rows are unchanged by the rule.

    python docs/bench/block_sampling_ab.py 128,256,512 llama3-8b,qwen3-8b,gemma3-12b
"""

from __future__ import annotations

import importlib.util
import pathlib
import sys
import tempfile

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from cheap_hash_ab import stage1, timed, verify_case  # noqa: E402

from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import hopper_tiles  # noqa: E402
from flashspec_export.reference import noise  # noqa: E402

GUMBEL_TOKEN_OFFSET = 2**30

_HELPER = """

from flashspec_export.kernels.noise import uniform_from_bits  # noqa: E402

LOG2E: gl.constexpr = gl.constexpr(1.4426950408889634)


@gluon.jit
def _block_sampled_chunk_best(acc, ids, row_ok, scale, greedy, key_a, key_b, v_start,
                              RUN: gl.constexpr, run_layout: gl.constexpr):  # fmt: skip
    CHUNK: gl.constexpr = acc.shape[0]
    BLOCK_V: gl.constexpr = acc.shape[1]
    LANES: gl.constexpr = BLOCK_V // RUN
    row_layout: gl.constexpr = gl.SliceLayout(1, acc.type.layout)
    lanes_layout: gl.constexpr = gl.SliceLayout(2, run_layout)
    run_rows: gl.constexpr = gl.SliceLayout(1, lanes_layout)
    inv_scale = gl.div_rn(gl.full_like(scale, 1.0), scale)
    x = acc * gl.expand_dims(inv_scale, 1)
    m = gl.max(x, 1)
    m_ref = gl.where(m == float("-inf"), 0.0, m)
    e = gl.exp2((x - gl.expand_dims(m_ref, 1)) * LOG2E)
    e3 = gl.convert_layout(gl.reshape(e, [CHUNK, LANES, RUN]), run_layout, assert_trivial=True)
    run_cum = gl.associative_scan(e3, 2, _add_combine)
    lane_tot = gl.max(run_cum, 2)
    # the scan across lanes on a 2-d layout of the same threads (Triton scans no slice layout)
    lanes_2d: gl.constexpr = gl.BlockedLayout(
        [1, 1], [run_layout.threads_per_warp[0], run_layout.threads_per_warp[1]],
        [run_layout.warps_per_cta[0], run_layout.warps_per_cta[1]], [1, 0],
    )
    lane_tot_2d = gl.convert_layout(lane_tot, lanes_2d)
    lane_cum = gl.associative_scan(lane_tot_2d, 1, _add_combine)
    total = gl.convert_layout(gl.max(lane_cum, 1), run_rows)
    lane_start = gl.convert_layout(lane_cum - lane_tot_2d, lanes_layout)
    cum = run_cum + gl.expand_dims(lane_start, 2)
    tile = gl.full_like(key_a, 0) + (v_start // BLOCK_V).to(gl.uint32)
    u = uniform_from_bits(token_bits(key_a, key_b, tile))
    target = gl.convert_layout(u, run_rows, assert_trivial=True) * total
    below = (cum <= gl.expand_dims(gl.expand_dims(target, 1), 2)).to(gl.int32)
    k = gl.minimum(gl.sum(gl.sum(below, 2), 1), BLOCK_V - 1)
    best_id = v_start + gl.convert_layout(k, row_layout, assert_trivial=True)
    g = gumbel_from_bits(token_bits(key_a, key_b, tile + GUMBEL_TOKEN_OFFSET), True)
    log_total = gl.log(gl.convert_layout(total, row_layout, assert_trivial=True))
    best = m + log_total + g
    return best, best_id, m


GUMBEL_TOKEN_OFFSET: gl.constexpr = gl.constexpr(2**30)
"""


def _variant():
    source = pathlib.Path(hopper_tiles.__file__).read_text()
    call = "best, best_id, best_logit = _sampled_chunk_best("
    assert source.count(call) == 1
    source = source.replace(call, call.replace("_sampled", "_block_sampled"))
    path = pathlib.Path(tempfile.mkdtemp()) / "hopper_tiles_block.py"
    path.write_text(source + _HELPER)  # Triton reads a jit function's source from its file
    spec = importlib.util.spec_from_file_location("hopper_tiles_block", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def torch_block_sample(hidden, lm, vocab_size, block_v, temperature, seed, positions, gamma):
    """The two-level rule in torch (fp32): per (row, tile) the inverse-CDF id and the score."""
    rows = hidden.shape[0]
    logits = (hidden.float() @ lm[:vocab_size].float().T) * (1.0 / temperature[0].item())
    splits = -(-vocab_size // block_v)
    padded = torch.full((rows, splits * block_v), float("-inf"), device=hidden.device)
    padded[:, :vocab_size] = logits
    tiles = padded.view(rows, splits, block_v)
    m = tiles.amax(2, keepdim=True)
    e = torch.exp(tiles - m)
    cum = e.cumsum(2)
    seq = torch.arange(rows, device=hidden.device) // (gamma + 1)
    pos = positions[seq] + torch.arange(rows, device=hidden.device) - seq * (gamma + 1)
    a, b = noise.row_keys(seed[seq], pos, noise.STREAM_GUMBEL)
    tile = torch.arange(splits, device=hidden.device)
    u = noise.uniform_from_bits(noise.token_bits(a[:, None], b[:, None], tile[None]))
    k = (cum <= (u * cum[:, :, -1])[:, :, None]).sum(2).clamp(max=block_v - 1)
    g = noise.gumbel_from_bits(
        noise.token_bits(a[:, None], b[:, None], tile[None] + GUMBEL_TOKEN_OFFSET)
    )
    score = m[:, :, 0] + torch.log(cum[:, :, -1]) + g
    return (tile[None] * block_v + k).int(), score


def main(rows_list, heads):
    block = _variant()
    print(torch.cuda.get_device_name(), flush=True)
    for head in heads:
        shape = HeadShape.from_name(head)
        lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
        lm *= shape.hidden_size**-0.5
        for rows in rows_list:
            case = verify_case(shape, rows)
            hidden, temperature, seed, positions, _, gamma, config, _ = case
            fns, outs = {}, {}
            for name, module in (("shipped", hopper_tiles), ("block", block)):
                fns[name], outs[name] = stage1(module, lm, shape, case)
            torch.cuda.synchronize()
            ids, score = torch_block_sample(
                hidden, lm, shape.vocab_size, config.block_v, temperature, seed, positions, gamma
            )
            same_ids = (outs["block"][1] == ids).float().mean().item()
            score_err = (outs["block"][0] - score).abs().max().item()
            print(
                f"{head:11} R={rows:<4} {tuple(config)[:2]} {timed(fns, lm, shape, case)} |"
                f" block ids = torch's {same_ids:.5f}, max |score - torch's| {score_err:.2e}",
                flush=True,
            )


if __name__ == "__main__":
    main([int(r) for r in sys.argv[1].split(",")], sys.argv[2].split(","))
