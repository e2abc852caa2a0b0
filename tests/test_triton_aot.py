"""The ahead-of-time generator of the CUDA library's Triton kernels (``kernels/aot.py``), on CPU:
its tables follow the Triton launch table, the kernels' signatures still match the argument
order the library's launcher passes, and one kernel compiles for sm_90 without a driver. (The
compiled kernels themselves run in ``tests/parity/test_triton_aot_gpu.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("triton", reason="needs triton (pip install -e '.[triton]')")

from flashspec_export.kernels import aot, verify_resample
from flashspec_export.kernels.tiles import (
    HAND_IN_TUNED,
    HOPPER_TUNED,
    TUNED,
    TUNED_BY_DEVICE,
    hand_in_row,
    hopper_row,
    tuned_row,
)

VARIANT_FLAGS = ("RETURN_LOGPROBS", "MASKED")  # what tells a verify row's four kernels apart


def test_tile_table_is_the_triton_launch_table():
    """Per (op, dtype, H) one row per bound of either launch table, each with the kernel the
    Triton backend runs there on an sm_90 GPU: the Hopper kernel where HOPPER_TUNED names one,
    else the portable kernel of the TUNED row, with its warps and stages."""
    specs, rows = aot.tile_kernels(["bfloat16", "float16"], [3840, 4096])
    by_symbol = {s.symbol: s for s in specs}
    for op in TUNED:
        bounds = sorted({lim for t in (TUNED, HOPPER_TUNED) for lim, _ in t[op]} - {None})
        for dtype in ("bfloat16", "float16"):
            for hidden in (3840, 4096):
                mine = [
                    r
                    for r in rows
                    if (r.op, r.dtype, r.hidden_size, r.device) == (op, dtype, hidden, "")
                ]
                assert [r.max_rows for r in mine] == [*bounds, -1]
                for r in mine:
                    at = r.max_rows if r.max_rows > 0 else 1 << 20
                    spec = by_symbol[r.kernel]
                    hopper = hopper_row(op, at)
                    if hopper is not None:
                        assert spec.kind == "hopper_tiles" and r.waves == 0
                        assert (r.block_n, r.block_v, r.block_k) == hopper[:3]
                        assert spec.descriptor_blocks == (
                            (hopper.block_n, hopper.block_k),
                            (hopper.block_v, hopper.block_k),
                        )
                        assert spec.num_warps == hopper.block_n // 16
                        continue
                    block_n, block_v, warps, waves, stages = tuned_row(op, at)
                    assert (r.block_n, r.block_v, r.waves, r.block_k) == (
                        block_n,
                        block_v,
                        waves,
                        0,
                    )
                    assert (spec.num_warps, spec.num_stages) == (warps, stages)
                for r in mine:
                    variants = (r.logprobs_kernel, r.masked_kernel, r.masked_logprobs_kernel)
                    if op != "verify_resample":
                        assert variants == (None, None, None)
                        continue
                    # plain, log-probabilities, mask, both: the same launch, the two flags set
                    wanted = ((False, False), (True, False), (False, True), (True, True))
                    for symbol, (logprobs, masked) in zip(
                        (r.kernel, *variants), wanted, strict=True
                    ):
                        constexprs = dict(by_symbol[symbol].constexprs)
                        assert (constexprs["RETURN_LOGPROBS"], constexprs["MASKED"]) == (
                            logprobs,
                            masked,
                        )
                        rest = {k: v for k, v in constexprs.items() if k not in VARIANT_FLAGS}
                        plain = dict(by_symbol[r.kernel].constexprs)
                        assert rest == {k: v for k, v in plain.items() if k not in VARIANT_FLAGS}
    assert any(by_symbol[r.kernel].kind == "hopper_tiles" for r in rows)


def test_a_gpus_own_rows_come_first():
    """TUNED_BY_DEVICE rows (portable kernels where no Hopper kernel serves those rows) precede
    the rows for any GPU of the same (op, dtype, H), which the launcher reads in order."""
    specs, rows = aot.tile_kernels(["bfloat16"], [4096])
    by_symbol = {s.symbol: s for s in specs}
    assert TUNED_BY_DEVICE, "no GPU has rows of its own: nothing to check"
    for device, table in TUNED_BY_DEVICE.items():
        for op, entries in table.items():
            mine = [r for r in rows if r.op == op]
            own = [r for r in mine if r.device == device]
            assert [r.max_rows for r in own] == [-1 if b is None else b for b, _ in entries]
            assert mine[: len(own)] == own
            for r, (bound, config) in zip(own, entries, strict=True):
                block_n, block_v, warps, waves, stages = config
                assert tuned_row(op, bound, f"NVIDIA {device}") == config
                assert (r.block_n, r.block_v, r.waves, r.block_k) == (block_n, block_v, waves, 0)
                spec = by_symbol[r.kernel]
                assert (spec.num_warps, spec.num_stages) == (warps, stages)
                # past the GPU's own rows, and on other GPUs, TUNED's
                assert tuned_row(op, bound, "NVIDIA H100 80GB HBM3") == tuned_row(op, bound)
    assert tuned_row("tiled_argmax", 17, "NVIDIA H200") == tuned_row("tiled_argmax", 17)


def test_other_architectures_get_only_the_portable_kernels():
    specs, rows = aot.tile_kernels(["bfloat16"], [4096], arch=80)
    assert {s.kind for s in specs} == {"verify_tiles", "argmax_tiles", "verify_hand_in_tiles"}
    assert all(r.block_k == 0 for r in rows)
    truncated = [r for r in rows if r.op == "verify_truncated"]
    assert [r.max_rows for r in truncated if not r.device][-1] == -1  # every R served


def _launch_at(rows_list, rows: int, device: str = ""):
    """The first row of ``rows_list`` serving ``rows`` on the GPU named ``device``: the
    launcher's findTile."""
    return next(
        r
        for r in rows_list
        if (r.max_rows < 0 or rows <= r.max_rows) and (not r.device or r.device in device)
    )


@pytest.mark.parametrize("device", ["NVIDIA H100 80GB HBM3", "NVIDIA H200"])
def test_truncation_rows_are_the_launches_the_triton_backend_takes(device):
    """Top-k / top-p (op ``verify_truncated``): at every row count the launch the Triton backend
    takes (``verify_resample``: ``HAND_IN_TUNED``'s row, else ``choose_config``'s on an sm_90
    GPU), compiled with the hand-in in the four variants, with its warps and stages."""
    specs, rows = aot.tile_kernels(["bfloat16"], [4096])
    by_symbol = {s.symbol: s for s in specs}
    mine = [r for r in rows if r.op == "verify_truncated"]
    assert {r.max_rows for r in mine} >= {b for b, c in HAND_IN_TUNED if c is not None}
    for at in (1, 2, 3, 4, 5, 8, 9, 16, 17, 32, 64, 65, 128, 129, 192, 256, 320, 448, 512, 2048):
        r = _launch_at(mine, at, device)
        spec = by_symbol[r.kernel]
        hand_in, hopper = hand_in_row(at), hopper_row("verify_resample", at)
        if hand_in is None and hopper is not None:
            assert spec.kind == "hopper_tiles" and dict(spec.constexprs)["HAND_IN"]
            assert (r.block_n, r.block_v, r.block_k) == hopper[:3]
            continue
        block_n, block_v, warps, waves, stages = hand_in or tuned_row("verify_resample", at, device)
        assert (r.block_n, r.block_v, r.waves, r.block_k) == (block_n, block_v, waves, 0)
        wanted = ((False, False), (True, False), (False, True), (True, True))
        symbols = (r.kernel, r.logprobs_kernel, r.masked_kernel, r.masked_logprobs_kernel)
        for symbol, flags in zip(symbols, wanted, strict=True):
            spec = by_symbol[symbol]
            constexprs = dict(spec.constexprs)
            assert spec.kind == "verify_hand_in_tiles"
            assert (spec.num_warps, spec.num_stages) == (warps, stages)
            assert (constexprs["RETURN_LOGPROBS"], constexprs["MASKED"]) == flags
            assert constexprs["HAND_IN"]
            assert (constexprs["BLOCK_N"], constexprs["BLOCK_V"]) == (block_n, block_v)
            # the rows it scores: at least the call's
            assert at <= constexprs["EPI_ROWS"] <= block_n or constexprs["EPI_ROWS"] == block_n


def test_hand_in_kernels_cover_the_sampled_table_and_the_vocabularies():
    """The hand-in's sampled logits: one kernel per SAMPLED_TUNED row and dtype with its
    launch; its thresholds: every (top-k, top-p, mask) and blocks for the sampled logits of
    vocabularies up to 262144 ids (Gemma-3's)."""
    specs, sampled, thresholds = aot.hand_in_kernels(["bfloat16", "float16"])
    by_symbol = {s.symbol: s for s in specs}
    for dtype in ("bfloat16", "float16"):
        mine = [r for r in sampled if r.dtype == dtype]
        assert len(mine) == len(verify_resample.SAMPLED_TUNED)
        for r, (bound, tune) in zip(mine, verify_resample.SAMPLED_TUNED, strict=True):
            assert r.max_rows == (-1 if bound is None else bound)
            assert (r.block_r, r.block_s, r.block_k, r.k_splits) == tune[:4]
            spec = by_symbol[r.kernel]
            assert (spec.num_warps, spec.num_stages) == tune[4:]
            assert r.k_splits <= 8  # tritonAot.h kMaxSampledSplits
    variants = {(r.top_k, r.top_p, r.masked) for r in thresholds}
    assert variants == {(k, p, m) for k, p in aot._TRUNCATION_VARIANTS for m in (False, True)}
    assert max(r.block for r in thresholds) * verify_resample.HAND_IN_STRIDE >= 262144


def test_settle_kernels_are_the_jits_for_every_split_count_they_take():
    """Stage 2 of top-k / top-p: per (top-k, top-p) and log-probabilities or not (as the call
    asks them: ``_truncated_summaries``' RETURN_LOGPROBS), one kernel whose constexprs and warps
    are those ``_truncated_summaries`` launches with on the threshold hand-in for every split
    count the launcher gives it (S <= blockS), so its sums are the JIT's."""
    specs, rows = aot.settle_kernels()
    by_symbol = {s.symbol: s for s in specs}
    assert len(rows) == 6
    assert {(r.top_k, r.top_p, r.logprobs) for r in rows} == {
        (k, p, lp) for k, p in ((True, False), (False, True), (True, True)) for lp in (False, True)
    }
    for r in rows:
        spec = by_symbol[r.kernel]
        constexprs = dict(spec.constexprs)
        assert (constexprs["TOP_K"], constexprs["TOP_P"]) == (r.top_k, r.top_p)
        assert constexprs["RETURN_LOGPROBS"] == r.logprobs
        assert not spec.enable_fp_fusion
        for splits in range(1, r.block_s + 1):
            _, shape, warps = verify_resample.settle_shape(splits)
            assert {k: constexprs[k] for k in shape} == shape and spec.num_warps == warps
    # the Hopper kernel's splits: one per 128 ids of Gemma-3's 262144
    assert max(r.block_s for r in rows) >= 262144 // 128
    # Compiled for 16-divisible workspace pointers, as the JIT specialises them: else Triton 3.6
    # lays the per-split loads out otherwise (its float sums then ran in another order).
    fn = aot._FUNCTIONS["truncated_summaries"]
    for spec in specs:
        _, _, attrs = aot._signature(spec)
        for name in ("ws_float_ptr", "ws_index_ptr", "keys_ptr", "truncated_ptr", "sel_ptr",
                     "count_ptr", "threshold_ptr"):  # fmt: skip
            assert attrs[(fn.arg_names.index(name),)] == [["tt.divisibility", 16]], name


def test_hidden_sizes_must_be_16_divisible():
    with pytest.raises(ValueError, match="hidden_sizes"):
        aot.tile_kernels(["bfloat16"], [4100])


def test_finalize_blocks_cover_the_table_and_stay_small():
    _, rows = aot.finalize_kernels()
    verify = [r for r in rows if r.op == "verify_resample"]
    assert {(r.logprobs, r.block_r) for r in verify} == {
        (lp, br) for lp in (False, True) for br in aot.VERIFY_FINALIZE_BLOCK_R
    }
    assert all(r.block_r * r.block_s <= aot.MAX_FINALIZE_ELEMENTS for r in verify)
    argmax = [r for r in rows if r.op == "tiled_argmax"]
    assert sorted(r.block_s for r in argmax) == sorted(aot.FINALIZE_BLOCK_S)
    # the library's verify finalize runs with the Triton backend's warps for its block
    specs, _ = aot.finalize_kernels()
    for spec in (s for s in specs if s.kind == "verify_finalize"):
        block = dict(spec.constexprs)
        warps = verify_resample.finalize_warps(block["BLOCK_R"], block["BLOCK_S"])
        assert spec.num_warps == warps, spec.symbol


def test_kernel_signatures_match_the_launcher():
    """RUNTIME_ARGS (the argument order tritonAot.cu passes) is each kernel's non-constexpr
    parameter list: a change to a kernel's parameters fails here, not on a GPU."""
    tiles, _ = aot.tile_kernels(["bfloat16"], [4096])
    finals, _ = aot.finalize_kernels()
    settles, _ = aot.settle_kernels()
    hand_ins, _, _ = aot.hand_in_kernels(["bfloat16"])
    for spec in (*tiles, *finals, *settles, *hand_ins):
        signature, constexprs, _ = aot._signature(spec)
        runtime = [name for name, ty in signature.items() if ty != "constexpr"]
        assert runtime == [name for name, _ in aot.RUNTIME_ARGS[spec.kind]]
        assert set(constexprs) == {name for name, ty in signature.items() if ty == "constexpr"}


def test_kernels_compile_for_sm90_without_a_driver():
    """A finalize kernel and the Hopper kernel (whose TMA descriptors must be the ones the
    launcher encodes: aot._check_descriptors), plain and masked, and one past the shared memory a
    block can have, which is refused, in a process of its own: the parity tests' conftest may have
    switched this one to the Triton interpreter, whose kernels cannot be compiled."""
    code = (
        "from flashspec_export.kernels import aot\n"
        "finals, _ = aot.finalize_kernels()\n"
        "spec = next(s for s in finals if s.kind == 'argmax_finalize')\n"
        "cubin, name, shared, warps = aot.compile_kernel(spec, 90)\n"
        "assert cubin[:4] == b'\\x7fELF' and name == '_argmax_finalize_kernel' and warps == 4\n"
        "tiles, _ = aot.tile_kernels(['bfloat16'], [4096])\n"
        "spec = next(s for s in tiles if s.kind == 'hopper_tiles')\n"
        "cubin, name, shared, warps = aot.compile_kernel(spec, 90)\n"
        "assert name == 'hopper_tiles_kernel' and shared > 96 * 1024\n"
        # the MMA warps, 4 epilogue warps and the loader's one warp in a warpgroup of its own
        "assert warps == spec.num_warps + 8, (warps, spec.num_warps)\n"
        # the masked epilogue (kernels/hopper_tiles.py _allowed), as the table compiles it
        "spec = next(s for s in tiles if s.symbol.startswith(spec.symbol) and "
        "dict(s.constexprs)['MASKED'])\n"
        "assert aot.compile_kernel(spec, 90)[1] == 'hopper_tiles_kernel'\n"
        # top-k / top-p: a hand-in tile kernel, the Hopper kernel's, the largest stage 2 (top-p:
        # 16 warps, no scratch) and the threshold kernel
        "spec = next(s for s in tiles if s.kind == 'verify_hand_in_tiles')\n"
        "assert aot.compile_kernel(spec, 90)[1] == '_verify_tiles_kernel'\n"
        "spec = next(s for s in tiles if s.kind == 'hopper_tiles' and "
        "dict(s.constexprs)['HAND_IN'])\n"
        "assert aot.compile_kernel(spec, 90)[1] == 'hopper_tiles_kernel'\n"
        "settles, _ = aot.settle_kernels()\n"
        "spec = settles[-1]\n"
        "cubin, name, shared, warps = aot.compile_kernel(spec, 90)\n"
        "assert name == '_truncated_summaries_kernel' and warps == 16, (name, warps)\n"
        "hand_ins, _, _ = aot.hand_in_kernels(['bfloat16'])\n"
        "spec = hand_ins[-1]\n"
        "assert aot.compile_kernel(spec, 90)[1] == '_hand_in_threshold_kernel'\n"
        # a ring of 6 slots on the 128 x 128 tile (6 x 32 KB and the 64 KB hand-over): compiled,
        # then refused by name, as it could not launch
        "from flashspec_export.kernels.hopper_tiles import HopperConfig\n"
        "specs = {}\n"
        "ring6 = HopperConfig(stages=6)\n"
        "aot._hopper_row(specs, 'verify_resample', 'bfloat16', 4096, None, ring6)\n"
        "spec = next(iter(specs.values()))\n"
        "try:\n"
        "    aot.compile_kernel(spec, 90)\n"
        "    raise SystemExit('a kernel past the shared memory limit was compiled')\n"
        "except RuntimeError as error:\n"
        "    assert spec.symbol in str(error) and '232448 a block of sm_90' in str(error), error\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_triton_older_than_the_bound_is_refused_by_name():
    """Triton < 3.6 lacks the Gluon API of the Hopper kernel: importing the kernels says so, with
    the bound pyproject.toml carries, instead of an AttributeError deep in the kernel."""
    code = "import triton\ntriton.__version__ = '3.5.1'\nimport flashspec_export.kernels\n"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    assert "needs Triton >= 3.6" in result.stderr and "found triton 3.5.1" in result.stderr
    assert '"triton>=3.6"' in Path("pyproject.toml").read_text()
