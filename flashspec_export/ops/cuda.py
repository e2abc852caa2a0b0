"""CUDA backend: the ``plugins/`` kernels (the ones behind the TensorRT plugins) through their
C ABI (``plugins/common/flashspecCApi.h``), called with ctypes on torch tensors.

Where the library was built with the Triton kernels compiled in (CMake ``FLASHSPEC_TRITON_AOT``)
a call runs them on their GPU architecture for the compiled (dtype, H), else the native CUDA
kernels; ``kernel_path`` says which. The truncation runs there too: an ``allowed_tokens`` mask in
the compiled kernels' masked variants, ``top_k`` / ``top_p`` in the Triton backend's threshold
hand-in and stage 2 compiled in (its launches and split count); on the native path in
``plugins/verifyResample/truncation.cuh`` (per-split candidates). Either way the rows stage 2 does
not settle are recomputed exactly on the device (no host read: CUDA-graph safe).

The library is ``plugins/build/libflashspec_kernels.so`` (build: ``cmake -S plugins -B
plugins/build && cmake --build plugins/build -j``) or the path in ``$FLASHSPEC_KERNELS_LIB``.
Launches go to the current torch stream; nothing synchronises with the host. Workspaces are one
buffer per (device, stream), fresh during CUDA-graph capture (``ops/workspace.py``). The
compiled kernels are loaded into a CUDA context by ``prepare``, which every launch outside
capture calls; the library never loads them while a stream is being captured, so a first call
that is captured needs ``prepare()`` on its device beforehand.
"""

from __future__ import annotations

import ctypes
import functools
import os
import pathlib

import torch

from flashspec_export.ops.workspace import launch_workspace
from flashspec_export.reference.verify_resample import VerifyResult

# The ABI this mirror of the params structs is written for (FLASHSPEC_ABI_VERSION in
# plugins/common/flashspecAbi.h, checked when the library loads; the dtype codes are read from it).
ABI_VERSION = 7
# FlashspecOp and FlashspecKernelPath codes (plugins/common/flashspecAbi.h).
OPS = {"tiled_argmax": 0, "verify_resample": 1, "noise": 2, "verify_truncated": 3}
PATHS = {0: "native", 1: "triton_aot", 2: "triton_aot_hopper"}
# cudaErrorStreamCaptureUnsupported: a launch on a capturing stream before the compiled kernels
# were loaded into its CUDA context (prepare).
CAPTURE_UNSUPPORTED = 900
LIBRARY_ENV = "FLASHSPEC_KERNELS_LIB"
DEFAULT_LIBRARY = pathlib.Path(__file__).parents[2] / "plugins/build/libflashspec_kernels.so"


class _TiledArgmaxParams(ctypes.Structure):  # flashspec::TiledArgmaxParams
    _fields_ = [
        ("hidden", ctypes.c_void_p),
        ("lm_head", ctypes.c_void_p),
        ("tokens", ctypes.c_void_p),
        ("max_logit", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("num_rows", ctypes.c_int32),
        ("hidden_size", ctypes.c_int32),
        ("vocab_size", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
    ]


class _VerifyResampleParams(ctypes.Structure):  # flashspec::VerifyResampleParams
    _fields_ = [
        ("hidden", ctypes.c_void_p),
        ("lm_head", ctypes.c_void_p),
        ("draft_tokens", ctypes.c_void_p),
        ("temperature", ctypes.c_void_p),
        ("seed", ctypes.c_void_p),
        ("positions", ctypes.c_void_p),
        ("tokens", ctypes.c_void_p),
        ("num_emitted", ctypes.c_void_p),
        ("logprobs", ctypes.c_void_p),
        ("workspace", ctypes.c_void_p),
        ("batch", ctypes.c_int32),
        ("gamma", ctypes.c_int32),
        ("hidden_size", ctypes.c_int32),
        ("vocab_size", ctypes.c_int32),
        ("dtype", ctypes.c_int32),
        ("num_splits", ctypes.c_int32),
        ("top_k", ctypes.c_void_p),
        ("top_p", ctypes.c_void_p),
        ("allowed_tokens", ctypes.c_void_p),
        ("unsettled", ctypes.c_void_p),
    ]


class _NoiseParams(ctypes.Structure):  # flashspec::NoiseParams
    _fields_ = [
        ("seed", ctypes.c_void_p),
        ("position", ctypes.c_void_p),
        ("token", ctypes.c_void_p),
        ("bits", ctypes.c_void_p),
        ("uniform", ctypes.c_void_p),
        ("gumbel", ctypes.c_void_p),
        ("count", ctypes.c_int32),
        ("stream", ctypes.c_int32),
    ]


def library_path() -> pathlib.Path:
    return pathlib.Path(os.environ.get(LIBRARY_ENV, DEFAULT_LIBRARY))


@functools.cache
def library() -> ctypes.CDLL:
    """The kernel library, loaded once; a clear error when it is not built."""
    path = library_path()
    if not path.is_file():
        raise RuntimeError(
            f"cuda backend: {path} not found; build it with `cmake -S plugins -B plugins/build "
            f"&& cmake --build plugins/build -j` or set ${LIBRARY_ENV}"
        )
    lib = ctypes.CDLL(str(path))
    lib.flashspecErrorString.restype = ctypes.c_char_p
    for name in (
        "flashspecTiledArgmaxWorkspaceSize",
        "flashspecVerifyResampleWorkspaceSize",
        "flashspecVerifyResampleTruncatedWorkspaceSize",
    ):
        getattr(lib, name).restype = ctypes.c_size_t
    lib.flashspecKernelPath.argtypes = [ctypes.c_int32, ctypes.c_void_p]
    if lib.flashspecAbiVersion() != ABI_VERSION:
        raise RuntimeError(
            f"cuda backend: {path} has ABI {lib.flashspecAbiVersion()}, this package needs "
            f"{ABI_VERSION}: rebuild it (cmake --build plugins/build -j)"
        )
    return lib


@functools.cache
def dtype_codes() -> dict[torch.dtype, int]:
    """torch dtype -> the library's FlashspecDtype code (plugins/common/flashspecAbi.h)."""
    lib = library()
    names = {torch.float32: b"float32", torch.float16: b"float16", torch.bfloat16: b"bfloat16"}
    return {dtype: lib.flashspecDtypeCode(name) for dtype, name in names.items()}


def available() -> bool:
    """A CUDA device and the built library are present."""
    return torch.cuda.is_available() and library_path().is_file()


def _check(status: int, op: str) -> None:
    if status != 0:
        message = library().flashspecErrorString(status).decode()
        if status == CAPTURE_UNSUPPORTED:
            message += (
                ": the library's compiled kernels are not loaded in this CUDA context and are "
                "never loaded during CUDA-graph capture; call flashspec_export.ops.cuda.prepare() "
                "(or run the op once) on this device before capturing"
            )
        raise RuntimeError(f"{op} (cuda): {message} (status {status})")


def prepare(device: torch.device | int | None = None) -> None:
    """Load the Triton kernels compiled into the library into the CUDA context of ``device``
    (default: the current device), once per context; nothing to do where none are compiled in
    for its GPU. Outside CUDA-graph capture only: every launch outside capture calls it, and a
    launch on a capturing stream before it ran in that context raises (the library does not load
    modules during capture)."""
    with torch.cuda.device(device):
        _check(library().flashspecPrepareKernels(), "prepare")


def _prepare_outside_capture() -> None:
    """``prepare`` for the current device unless its current stream is being captured."""
    if not torch.cuda.is_current_stream_capturing():
        _check(library().flashspecPrepareKernels(), "prepare")


def _device_and_stream(hidden: torch.Tensor) -> int:
    if hidden.device.type != "cuda":
        raise ValueError(f"hidden: the cuda backend needs CUDA tensors, got {hidden.device}")
    return torch.cuda.current_stream(hidden.device).cuda_stream


def _workspace(device: torch.device, nbytes: int) -> torch.Tensor:
    """[nbytes] uint8 for a launch on the current stream (``ops/workspace.py``)."""
    return launch_workspace(device, "cuda", ((max(nbytes, 16),), torch.uint8))[0]


def _argmax_call(hidden, lm_head, vocab_size, num_splits):
    """The params of a TiledArgmax call, its outputs (token, max_logit), and the contiguous
    inputs the params point into (kept alive until the launch), on hidden's device."""
    hidden, lm_head = hidden.contiguous(), lm_head.contiguous()
    n, hidden_size = hidden.shape
    dtype = dtype_codes()[hidden.dtype]
    lib = library()
    op = OPS["tiled_argmax"]
    splits = lib.flashspecResolveNumSplits(op, n, hidden_size, vocab_size, dtype, num_splits)
    nbytes = lib.flashspecTiledArgmaxWorkspaceSize(n, splits, hidden_size)
    workspace = _workspace(hidden.device, nbytes)
    token = torch.empty(n, dtype=torch.int64, device=hidden.device)
    max_logit = torch.empty(n, dtype=torch.float32, device=hidden.device)
    params = _TiledArgmaxParams(
        hidden.data_ptr(),
        lm_head.data_ptr(),
        token.data_ptr(),
        max_logit.data_ptr(),
        workspace.data_ptr(),
        n,
        hidden_size,
        vocab_size,
        dtype,
        splits,
    )
    return params, (token, max_logit), (hidden, lm_head)


def tiled_argmax(hidden: torch.Tensor, lm_head: torch.Tensor, vocab_size: int, *, num_splits=0):
    """Argmax of ``hidden @ lm_head[:vocab_size].T`` (CUDA). Shapes as ``ops.tiled_argmax``:
    hidden [N, H], lm_head [V, H] → token [N] int64, max_logit [N] float32."""
    stream = _device_and_stream(hidden)
    with torch.cuda.device(hidden.device):
        _prepare_outside_capture()
        params, outputs, _inputs = _argmax_call(hidden, lm_head, vocab_size, num_splits)
        status = library().flashspecTiledArgmax(ctypes.byref(params), ctypes.c_void_p(stream))
        _check(status, "tiled_argmax")
    return outputs


def verify_resample(
    hidden: torch.Tensor,
    lm_head: torch.Tensor,
    draft_tokens: torch.Tensor,
    temperature: torch.Tensor,
    seed: torch.Tensor,
    positions: torch.Tensor,
    vocab_size: int,
    *,
    return_logprobs: bool = False,
    num_splits: int = 0,
    top_k: int | torch.Tensor | None = None,
    top_p: float | torch.Tensor | None = None,
    allowed_tokens: torch.Tensor | None = None,
    unsettled: torch.Tensor | None = None,
) -> VerifyResult:
    """Verify γ greedy drafts and emit the next tokens (CUDA). Shapes as the reference: hidden
    [N, γ + 1, H], lm_head [V, H], draft_tokens [N, γ], temperature / seed / positions [N].

    The truncation (``reference/truncation.py``; validated by ``ops.verify_resample``), each None
    for off: ``top_k`` int or [N] int64 (0: off), ``top_p`` float or [N] float32 in (0, 1] (1:
    off), ``allowed_tokens`` [N, γ + 1, ceil(vocab_size / 32)] int32. The mask is read in the
    tile pass; top-k / top-p are settled in a second stage from the keys the tile pass hands in
    (the compiled kernels' threshold hand-in where they serve the call, else the native kernels'
    per-split candidates), and the rows those do not settle recomputed exactly
    (``plugins/verifyResample/truncation.cuh``). ``unsettled``: an [N · (γ + 1)] int32 CUDA
    tensor that receives 1 for the rows so recomputed (for tests), or None."""
    stream = _device_and_stream(hidden)
    with torch.cuda.device(hidden.device):
        _prepare_outside_capture()
        args = (hidden, lm_head, draft_tokens, temperature, seed, positions, vocab_size)
        truncation = (top_k, top_p, allowed_tokens, unsettled)
        params, result, _inputs = _verify_call(*args, return_logprobs, num_splits, *truncation)
        status = library().flashspecVerifyResample(ctypes.byref(params), ctypes.c_void_p(stream))
        _check(status, "verify_resample")
    return result


def _per_sequence(value, n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor | None:
    """A scalar or [N] tensor as a contiguous [N] tensor of ``dtype`` on ``device`` (None: None)."""
    if value is None:
        return None
    if not isinstance(value, torch.Tensor):
        return torch.full((n,), value, dtype=dtype, device=device)
    return value.to(device=device, dtype=dtype).expand(n).contiguous()


def _verify_call(
    hidden,
    lm_head,
    draft_tokens,
    temperature,
    seed,
    positions,
    vocab_size,
    return_logprobs,
    num_splits,
    top_k=None,
    top_p=None,
    allowed_tokens=None,
    unsettled=None,
):
    """The params of a VerifyResample call, its outputs, and the converted inputs the params
    point into (kept alive until the launch), on hidden's device."""
    hidden, lm_head = hidden.contiguous(), lm_head.contiguous()
    n, width, hidden_size = hidden.shape
    rows = n * width
    dtype = dtype_codes()[hidden.dtype]
    device = hidden.device
    lib = library()
    drafts = draft_tokens.to(torch.int64).contiguous()
    temps = temperature.to(torch.float32).contiguous()
    seeds, starts = seed.to(torch.int64).contiguous(), positions.to(torch.int64).contiguous()
    top_k = _per_sequence(top_k, n, torch.int64, device)
    top_p = _per_sequence(top_p, n, torch.float32, device)
    # top-k / top-p run launch-table rows of their own (kernels/aot.py _hand_in_rows)
    op = OPS["verify_truncated" if top_k is not None or top_p is not None else "verify_resample"]
    splits = lib.flashspecResolveNumSplits(op, rows, hidden_size, vocab_size, dtype, num_splits)
    if allowed_tokens is not None:
        allowed_tokens = allowed_tokens.to(device=device, dtype=torch.int32).contiguous()
        words = -(-vocab_size // 32)
        if allowed_tokens.shape != (n, width, words):
            got = list(allowed_tokens.shape)
            raise ValueError(f"allowed_tokens: expected [{n}, {width}, {words}], got {got}")
    if unsettled is not None and (
        unsettled.dtype != torch.int32 or unsettled.numel() != rows or not unsettled.is_contiguous()
    ):
        raise ValueError(f"unsettled: expected a contiguous int32 tensor of {rows} elements")
    if top_k is not None or top_p is not None:  # the hand-ins and the exact recompute's logits
        nbytes = lib.flashspecVerifyResampleTruncatedWorkspaceSize(
            rows, splits, hidden_size, vocab_size
        )
    else:
        nbytes = lib.flashspecVerifyResampleWorkspaceSize(rows, splits, hidden_size)
    workspace = _workspace(device, nbytes)
    tokens = torch.empty(n, width, dtype=torch.int64, device=device)
    num_emitted = torch.empty(n, dtype=torch.int64, device=device)
    logprobs = (
        torch.empty(n, width, dtype=torch.float32, device=device) if return_logprobs else None
    )
    params = _VerifyResampleParams(
        hidden.data_ptr(),
        lm_head.data_ptr(),
        drafts.data_ptr(),
        temps.data_ptr(),
        seeds.data_ptr(),
        starts.data_ptr(),
        tokens.data_ptr(),
        num_emitted.data_ptr(),
        logprobs.data_ptr() if logprobs is not None else None,
        workspace.data_ptr(),
        n,
        width - 1,
        hidden_size,
        vocab_size,
        dtype,
        splits,
        *(t.data_ptr() if t is not None else None for t in (top_k, top_p, allowed_tokens)),
        unsettled.data_ptr() if unsettled is not None else None,
    )
    inputs = (hidden, lm_head, drafts, temps, seeds, starts, top_k, top_p, allowed_tokens)
    return params, VerifyResult(tokens, num_emitted, logprobs), inputs


def kernel_path(
    op: str, *args, return_logprobs: bool = False, num_splits: int = 0, **truncation
) -> str:
    """Which kernels ``op``'s call with these arguments (those of ``tiled_argmax`` /
    ``verify_resample`` here, ``truncation`` its top_k / top_p / allowed_tokens) runs on the
    current device: ``"triton_aot"`` (the portable Triton kernels compiled into the library),
    ``"triton_aot_hopper"`` (their Hopper kernel) or ``"native"`` (the CUDA kernels of
    ``plugins/``). Launches nothing."""
    if op not in ("tiled_argmax", "verify_resample"):
        raise ValueError(f"op: expected 'tiled_argmax' or 'verify_resample', got {op!r}")
    takes = {"top_k", "top_p", "allowed_tokens"} if op == "verify_resample" else set()
    unknown = set(truncation) - takes
    if unknown:
        raise ValueError(f"kernel_path: {op} takes no {', '.join(sorted(unknown))}")
    hidden = args[0]
    _device_and_stream(hidden)
    with torch.cuda.device(hidden.device):
        if op == "tiled_argmax":
            params, _, _inputs = _argmax_call(*args, num_splits)
        else:
            truncating = (truncation.get(k) for k in ("top_k", "top_p", "allowed_tokens"))
            params, _, _inputs = _verify_call(*args, return_logprobs, num_splits, *truncating)
        code = library().flashspecKernelPath(OPS[op], ctypes.byref(params))
    return PATHS[code]


def triton_aot_arch() -> int:
    """Compute capability (e.g. 90) of the Triton kernels compiled into the library; 0 if none."""
    return library().flashspecTritonAotArch()


def evaluate_noise(seed: torch.Tensor, position: torch.Tensor, token: torch.Tensor, stream: int):
    """The CUDA kernels' noise (``flashspecNoise.cuh``) of int64 triples, all [M] on one CUDA
    device: ``bits`` [M] int64, ``uniform`` and ``gumbel`` [M] float32, as
    ``reference.noise.bits`` / ``uniform_from_bits`` / ``gumbel_from_bits``."""
    cuda_stream = _device_and_stream(seed)
    seed, position, token = (t.to(torch.int64).contiguous() for t in (seed, position, token))
    bits = torch.empty_like(seed)
    uniform = torch.empty(seed.shape, dtype=torch.float32, device=seed.device)
    gumbel = torch.empty_like(uniform)
    params = _NoiseParams(
        seed.data_ptr(),
        position.data_ptr(),
        token.data_ptr(),
        bits.data_ptr(),
        uniform.data_ptr(),
        gumbel.data_ptr(),
        seed.numel(),
        stream,
    )
    with torch.cuda.device(seed.device):
        status = library().flashspecNoise(ctypes.byref(params), ctypes.c_void_p(cuda_stream))
        _check(status, "noise")
    return bits, uniform, gumbel
