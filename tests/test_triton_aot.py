"""The ahead-of-time generator of the CUDA library's Triton kernels (``kernels/aot.py``), on CPU:
its tables follow the Triton launch table, the kernels' signatures still match the argument
order the library's launcher passes, and one kernel compiles for sm_90 without a driver. (The
compiled kernels themselves run in ``tests/parity/test_triton_aot_gpu.py``.)"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

pytest.importorskip("triton", reason="needs triton (pip install -e '.[triton]')")

from flashspec_export.kernels import aot
from flashspec_export.kernels.tiles import TUNED


def test_tile_table_is_the_triton_launch_table():
    specs, rows = aot.tile_kernels(["bfloat16", "float16"], [3840, 4096])
    for op, table in TUNED.items():
        for dtype in ("bfloat16", "float16"):
            for hidden in (3840, 4096):
                mine = [r for r in rows if (r.op, r.dtype, r.hidden_size) == (op, dtype, hidden)]
                expected = [
                    (-1 if limit is None else limit, block_n, block_v, waves)
                    for limit, (block_n, block_v, _warps, waves, _stages) in table
                ]
                assert [(r.max_rows, r.block_n, r.block_v, r.waves) for r in mine] == expected
    by_symbol = {s.symbol: s for s in specs}
    for r in rows:  # warps and stages of the compiled kernel are the table's too
        _, (_, _, warps, _, stages) = next(
            row for row in TUNED[r.op] if (-1 if row[0] is None else row[0]) == r.max_rows
        )
        assert (by_symbol[r.kernel].num_warps, by_symbol[r.kernel].num_stages) == (warps, stages)
        assert (r.logprobs_kernel is not None) == (r.op == "verify_resample")


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


def test_kernel_signatures_match_the_launcher():
    """RUNTIME_ARGS (the argument order tritonAot.cu passes) is each kernel's non-constexpr
    parameter list: a change to a kernel's parameters fails here, not on a GPU."""
    tiles, _ = aot.tile_kernels(["bfloat16"], [4096])
    finals, _ = aot.finalize_kernels()
    for spec in (*tiles, *finals):
        signature, constexprs, _ = aot._signature(spec)
        runtime = [name for name, ty in signature.items() if ty != "constexpr"]
        assert runtime == [name for name, _ in aot.RUNTIME_ARGS[spec.kind]]
        assert set(constexprs) == {name for name, ty in signature.items() if ty == "constexpr"}


def test_one_kernel_compiles_for_sm90_without_a_driver():
    """In a process of its own: the parity tests' conftest may have switched this one to the
    Triton interpreter, whose kernels cannot be compiled."""
    code = (
        "from flashspec_export.kernels import aot\n"
        "finals, _ = aot.finalize_kernels()\n"
        "spec = next(s for s in finals if s.kind == 'argmax_finalize')\n"
        "cubin, name, shared, warps = aot.compile_kernel(spec, 90)\n"
        "assert cubin[:4] == b'\\x7fELF' and name == '_argmax_finalize_kernel' and warps == 4\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    result = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-2000:]
