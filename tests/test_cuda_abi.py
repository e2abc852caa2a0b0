"""The ctypes mirror of the CUDA kernels' C ABI (flashspec_export/ops/cuda.py) matches the
library's own layout, and the host-side entry points agree with the kernels' contract. Runs on
CPU: loading the library and these calls need no GPU."""

from __future__ import annotations

import ctypes

import pytest
import torch

from flashspec_export.ops import cuda

pytestmark = pytest.mark.skipif(
    not cuda.library_path().is_file(),
    reason=f"needs {cuda.library_path()} (cmake -S plugins -B plugins/build && cmake --build "
    "plugins/build -j)",
)


@pytest.mark.parametrize(
    ("op", "structure"),
    [
        (cuda.OPS["tiled_argmax"], cuda._TiledArgmaxParams),
        (cuda.OPS["verify_resample"], cuda._VerifyResampleParams),
        (cuda.OPS["noise"], cuda._NoiseParams),
    ],
)
def test_params_layout_matches_the_library(op, structure):
    offsets = (ctypes.c_size_t * 32)()
    count = cuda.library().flashspecParamsLayout(op, offsets, 32)
    fields = [getattr(structure, name).offset for name, _ in structure._fields_]
    assert list(offsets[:count]) == [*fields, ctypes.sizeof(structure)]


def test_abi_version_and_workspace_sizes():
    lib = cuda.library()
    assert lib.flashspecAbiVersion() == cuda.ABI_VERSION
    for op in (cuda.OPS["tiled_argmax"], cuda.OPS["verify_resample"]):
        assert lib.flashspecResolveNumSplits(op, 20, 4096, 128256, 2, 7) == 7  # requested is kept
    # Both end with a whole row block of the Hopper kernel: 128 rows of H 16-bit elements
    # (plugins/common/tritonAot.h wholeBlockBytes), here H = 64.
    block = 128 * 64 * 2
    # per (row, split): max + index for the argmax (16-byte aligned)
    assert lib.flashspecTiledArgmaxWorkspaceSize(20, 7, 64) == 20 * 7 * 8 + block
    assert lib.flashspecTiledArgmaxWorkspaceSize(3, 7, 64) == 176 + block  # 168 aligned
    # 4 floats + 1 int, 16-byte aligned, then the Hopper kernel's row scratch: 256 CTAs x 9 x 128
    # int32 (kRowScratchBytes)
    scratch = 256 * 9 * 128 * 4
    assert lib.flashspecVerifyResampleWorkspaceSize(20, 7, 64) == 2800 + scratch + block
    assert lib.flashspecVerifyResampleWorkspaceSize(3, 7, 64) == 432 + scratch + block
    assert lib.flashspecParamsLayout(5, (ctypes.c_size_t * 32)(), 32) == -1
    assert lib.flashspecErrorString(1) == b"invalid argument"


def test_one_dtype_enum_and_abi_version():
    """The codes and the version come from plugins/common/flashspecAbi.h, the one definition
    (parsed here), through the library; the Python mirror states the version it was written for."""
    import re

    header = (cuda.DEFAULT_LIBRARY.parents[1] / "common" / "flashspecAbi.h").read_text()
    version = int(re.search(r"#define FLASHSPEC_ABI_VERSION (\d+)", header).group(1))

    def enum(name: str) -> dict[str, int]:
        body = re.search(rf"enum {name}\s*{{(.*?)}};", header, re.S).group(1)
        return {m[0]: int(m[1]) for m in re.findall(r"FLASHSPEC_(\w+) = (\d+)", body)}

    assert version == cuda.ABI_VERSION == cuda.library().flashspecAbiVersion()
    names = {"FLOAT32": torch.float32, "FLOAT16": torch.float16, "BFLOAT16": torch.bfloat16}
    assert {names[k]: v for k, v in enum("FlashspecDtype").items()} == cuda.dtype_codes()
    assert {f"OP_{k.upper()}": v for k, v in cuda.OPS.items()} == enum("FlashspecOp")
    assert {f"PATH_{v.upper()}": k for k, v in cuda.PATHS.items()} == enum("FlashspecKernelPath")
    assert cuda.library().flashspecDtypeCode(b"int8") == -1


def test_kernel_path_query():
    """flashspecKernelPath refuses an unknown op; without a GPU every call is the native path;
    the library reports the architecture of the Triton kernels compiled into it (0: none)."""
    lib = cuda.library()
    assert lib.flashspecKernelPath(cuda.OPS["noise"], None) == -1
    assert lib.flashspecTritonAotArch() in (0, 90)
    if not torch.cuda.is_available():
        params = cuda._TiledArgmaxParams(16, 16, 16, 16, 16, 4, 4096, 128256, 2, 0)
        assert lib.flashspecKernelPath(cuda.OPS["tiled_argmax"], ctypes.byref(params)) == 0


def test_truncated_calls_resolve_their_own_split_count():
    """FLASHSPEC_OP_VERIFY_TRUNCATED (a call with top_k / top_p) is taken by
    flashspecResolveNumSplits: without a GPU (or without compiled kernels for the shape) both ops
    give the native count; a requested count is kept."""
    lib = cuda.library()
    bf16 = cuda.dtype_codes()[torch.bfloat16]
    args = (512, 4096, 128_256, bf16)
    plain = lib.flashspecResolveNumSplits(cuda.OPS["verify_resample"], *args, 0)
    truncated = lib.flashspecResolveNumSplits(cuda.OPS["verify_truncated"], *args, 0)
    assert truncated > 0 and plain > 0
    if not torch.cuda.is_available():
        assert truncated == plain
    assert lib.flashspecResolveNumSplits(cuda.OPS["verify_truncated"], *args, 7) == 7


# cudaError_t codes flashspecPrepareKernels returns without a usable driver (flashspecCApi.h).
NO_DEVICE = 100  # cudaErrorNoDevice: no libcuda.so.1
INSUFFICIENT_DRIVER = 35  # cudaErrorInsufficientDriver: a driver older than CUDA 12.0


def test_prepare_kernels_status():
    """flashspecPrepareKernels (load the compiled kernels into the current context, outside
    capture) is exported and says what happened: 0 with a GPU (twice: once per context), and also
    where nothing is compiled in; without a GPU a named status, not a crash or "unknown error"."""
    lib = cuda.library()
    status = lib.flashspecPrepareKernels()
    if torch.cuda.is_available():
        assert status == 0, lib.flashspecErrorString(status)
        assert lib.flashspecPrepareKernels() == 0
    elif lib.flashspecTritonAotArch() == 0:
        assert status == 0  # nothing to load
    else:
        assert status in (NO_DEVICE, INSUFFICIENT_DRIVER)
        assert lib.flashspecErrorString(status) in (
            b"no CUDA-capable device is detected",
            b"CUDA driver version is insufficient for CUDA runtime version",
        )


VOCABS = (111, 32000, 32001, 128256, 151936, 262144)


def test_the_split_bound_holds_for_every_table_row():
    """``maxNumSplits`` bounds every split count the library can choose, on any GPU: each row of
    the compiled Triton table (any row count, any SM count) and the native kernels' count. A
    plugin serializes its count, ``createPlugin`` refuses one above the bound and the workspace
    of an unresolved plugin is sized with it. The bound once counted only the native kernels
    (V / 512), below the table's 64-id tiles' cdiv(V, 64): an H200 engine at V = 32001 then
    serialized 501 splits that it could not deserialize (issue 32)."""
    lib = cuda.library()
    table_rows = 0
    while lib.flashspecTableSplits(table_rows, 1, 32000, 132) >= 0:
        table_rows += 1
    for vocab in VOCABS:
        bound = lib.flashspecMaxNumSplits(vocab)
        assert bound >= 1
        chosen = [
            lib.flashspecTableSplits(row, rows, vocab, sms)
            for row in range(table_rows)
            for rows in (1, 4, 16, 17, 64, 128, 512)
            for sms in (46, 78, 108, 132, 170, 1024)
        ]
        assert max(chosen, default=0) <= bound, (vocab, max(chosen), bound)
        for op in (cuda.OPS["tiled_argmax"], cuda.OPS["verify_resample"]):
            assert lib.flashspecResolveNumSplits(op, 4, 4096, vocab, 2, 0) <= bound
    assert lib.flashspecTableSplits(-1, 1, 32000, 132) == -1
    if table_rows == 0:
        pytest.skip("the library has no compiled Triton kernels: only the native bound checked")


def _check_shapes(op: str, shapes: list[list[int]], vocab: int = 1000) -> tuple[int, str]:
    """``flashspecCheckShapes``: what every plugin runs in configurePlugin and enqueue."""
    nb_dims = (ctypes.c_int32 * len(shapes))(*map(len, shapes))
    dims = (ctypes.c_int64 * (8 * len(shapes)))()
    for i, shape in enumerate(shapes):
        dims[8 * i : 8 * i + len(shape)] = shape
    message = ctypes.create_string_buffer(256)
    status = cuda.library().flashspecCheckShapes(
        cuda.OPS[op], nb_dims, dims, len(shapes), vocab, message, len(message)
    )
    return status, message.value.decode()


# hidden [N, R, H], lm_head [V, H], draft_tokens [N, R - 1], temperature, seed, positions [N]
VERIFY = [[4, 4, 64], [1024, 64], [4, 3], [4], [4], [4]]


@pytest.mark.parametrize(
    ("input_index", "shape", "named"),
    [
        (0, [4, 64], "hidden must be [N, R, H]"),
        (0, [4, 0, 64], "hidden must be [N, R, H] with R >= 1"),
        (1, [1024, 32], "lm_head must be [>= vocab_size 1000, H 64], got [1024, 32]"),
        (1, [999, 64], "lm_head must be [>= vocab_size 1000, H 64], got [999, 64]"),
        (2, [3, 3], "draft_tokens must be [N 4, R - 1 3], got [3, 3]"),
        (2, [4, 4], "draft_tokens must be [N 4, R - 1 3], got [4, 4]"),
        (3, [3], "temperature must be [N 4], got [3]"),
        (4, [4, 1], "seed must be [N 4], got [4, 1]"),
        (5, [5], "positions must be [N 4], got [5]"),
    ],
)
def test_every_verify_input_dimension_is_checked(input_index, shape, named):
    """TensorRT's shape inference cannot catch these (no output depends on lm_head's H or the
    per-sequence lengths): the plugin checks them before the kernel reads out of bounds, and
    says which input and what shape it expected (issue 32)."""
    assert _check_shapes("verify_resample", VERIFY) == (0, "")
    shapes = [list(s) for s in VERIFY]
    shapes[input_index] = shape
    status, message = _check_shapes("verify_resample", shapes)
    assert status == -1 and message.startswith("VerifyResample: ") and named in message, message


@pytest.mark.parametrize(
    ("optional", "named"),
    [
        ([[4]], None),  # top_k (or top_p: the plugin tells them apart by type)
        ([[4], [4]], None),  # top_k, top_p
        ([[4], [4], [4, 4, 32]], None),  # and allowed_tokens [N, R, ceil(1000 / 32)]
        ([[4, 4, 32]], None),  # a mask alone
        ([[-1], [-1], [-1, -1, 32]], None),  # dynamic N and R
        ([[3]], "top_k / top_p must be [N 4], got [3]"),
        ([[4], [4, 1]], "allowed_tokens [N 4, R 4, ceil(vocab_size / 32) 32], got [4, 1]"),
        ([[4], [4], [4]], "then allowed_tokens [N 4, R 4, ceil(vocab_size / 32) 32], got [4]"),
        ([[4, 4, 31]], "allowed_tokens [N 4, R 4, ceil(vocab_size / 32) 32], got [4, 4, 31]"),
        ([[4, 3, 32]], "allowed_tokens [N 4, R 4, ceil(vocab_size / 32) 32], got [4, 3, 32]"),
        (
            [[4, 4, 32], [4]],
            "then allowed_tokens [N 4, R 4, ceil(vocab_size / 32) 32], got [4, 4, 32]",
        ),
        ([[4], [4], [4, 4, 32], [4]], "expected 6 to 9 inputs, got 10"),
    ],
)
def test_the_optional_verify_inputs_are_checked(optional, named):
    """top_k and top_p [N] (either may be left out), then allowed_tokens [N, R, ceil(V / 32)]:
    the plugin checks them with the other inputs before the kernels read them (issue 35)."""
    status, message = _check_shapes("verify_resample", VERIFY + optional)
    if named is None:
        assert (status, message) == (0, "")
    else:
        assert status == -1 and message.startswith("VerifyResample: ") and named in message, message


def test_the_truncated_workspace_holds_the_candidates_the_exact_recompute_and_the_hand_in():
    """With top_k / top_p a call's workspace adds, after the plain one, 32 candidate keys and a
    floor per (row, split), two flags per row (unsettled; truncated, the compiled kernels'
    flags) and the exact recompute's [rows, V] fp32 logits, each part 256-byte aligned
    (plugins/verifyResample/truncation.cuh); then the compiled kernels' hand-in
    (plugins/common/tritonAot.h handInBytes): up to 8 partial sums of every 128th logit, a
    threshold and a count per row, 4096 handed-in keys and 2048 keys of stage-2 scratch a row,
    each part 16-byte aligned."""
    lib = cuda.library()

    def up(x, to=256):
        return -(-x // to) * to

    for rows, splits, hidden, vocab in (
        (20, 7, 64, 1000),
        (3, 1, 64, 128_256),
        (512, 132, 4096, 32),
    ):
        plain = lib.flashspecVerifyResampleWorkspaceSize(rows, splits, hidden)
        extra = up(rows * splits * 32 * 8) + up(rows * splits * 8) + 2 * up(rows * 4)
        extra += up(rows * vocab * 4)
        hand_in = up(8 * rows * -(-vocab // 128) * 4, 16) + 2 * up(rows * 4, 16)
        hand_in += rows * 4096 * 8 + rows * 2048 * 8
        got = lib.flashspecVerifyResampleTruncatedWorkspaceSize(rows, splits, hidden, vocab)
        assert got == up(plain) + extra + hand_in


def test_dynamic_dimensions_match_and_argmax_inputs_are_checked():
    """At build time a dynamic dimension is -1 and matches any size; the argmax's hidden and
    lm_head are checked the same way."""
    dynamic = [[-1, -1, 64], [1024, 64], [-1, -1], [-1], [-1], [-1]]
    assert _check_shapes("verify_resample", dynamic) == (0, "")
    assert _check_shapes("tiled_argmax", [[-1, 64], [1024, 64]]) == (0, "")
    status, message = _check_shapes("tiled_argmax", [[8, 64], [1024, 128]])
    assert status == -1 and "TiledArgmax: lm_head must be [>= vocab_size 1000, H 64]" in message
    status, message = _check_shapes("tiled_argmax", [[8, 64]])
    assert status == -1 and "expected 2 inputs, got 1" in message


# cudaDevAttrMaxSharedMemoryPerBlockOptin: sm_86 / 89 / 120 (RTX, L4, L40S), A100, H100 / H200
OPTIN_BYTES = {"sm_86/89/120": 99 * 1024, "sm_80": 163 * 1024, "sm_90": 227 * 1024}
STATIC_SMEM = 5 * 1024  # the tile kernels' warp summaries (8 warps x 32 x 20 bytes)


@pytest.mark.parametrize("device", list(OPTIN_BYTES))
def test_the_staged_hidden_block_fits_the_devices_shared_memory(device):
    """The native FMA kernels stage ROWS hidden rows in shared memory; ROWS is chosen from the
    running device's opt-in limit, not Hopper's: with a fixed 160 KB budget, fp32 at H = 4096
    staged 8 rows (128 KB) on a 99 KB GPU and every launch failed (issue 32). A hidden size no
    row of which fits is refused (-1), never launched."""
    lib = cuda.library()
    lib.flashspecStagedSmemBytes.restype = ctypes.c_int64
    optin = OPTIN_BYTES[device]
    for dtype, size in ((0, 4), (1, 2), (2, 2)):
        for hidden in (64, 2048, 4096, 5120, 8192, 16384, 32768):
            for rows in (1, 2, 5, 8, 16, 64):
                staged = lib.flashspecStagedSmemBytes(rows, hidden, dtype, optin)
                if staged == -1:  # not even one row fits the budget: min(160 KB, opt-in - 8 KB)
                    assert hidden * size > min(160 * 1024, optin - 8 * 1024), (hidden, dtype)
                    continue
                covering = min(16, 1 << (rows - 1).bit_length())  # ROWS: a power of two
                assert hidden * size <= staged <= covering * hidden * size
                assert staged + STATIC_SMEM <= optin, (device, dtype, hidden, rows, staged)
    # fp32, H 4096, 5 rows: 4 rows (64 KB) on a 99 KB GPU, 8 rows (128 KB) on Hopper
    assert lib.flashspecStagedSmemBytes(5, 4096, 0, OPTIN_BYTES["sm_86/89/120"]) == 64 * 1024
    assert lib.flashspecStagedSmemBytes(5, 4096, 0, OPTIN_BYTES["sm_90"]) == 128 * 1024


@pytest.mark.cuda_kernels
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_the_native_path_is_never_silent(capfd):
    """A (dtype, H) without compiled-in kernels on sm_90 (the table's architecture, or the
    default build's where the library has none) runs the native kernels and says so on stderr,
    once per (op, dtype, H) and process. fp32 at H = 88 is never compiled in nor used elsewhere
    in the suite."""
    from flashspec_export import ops

    hidden = torch.randn(4, 88, device="cuda")
    lm_head = torch.randn(1000, 88, device="cuda")
    assert cuda.kernel_path("tiled_argmax", hidden, lm_head, 1000) == "native"
    for _ in range(2):
        ops.tiled_argmax(hidden, lm_head, 1000, backend="cuda")
    torch.cuda.synchronize()
    said = capfd.readouterr().err.count("TiledArgmax (float32, H 88) runs the native CUDA kernels")
    assert said == (1 if torch.cuda.get_device_capability() == (9, 0) else 0)
