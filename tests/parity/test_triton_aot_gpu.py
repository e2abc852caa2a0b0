"""The CUDA library's compiled-in Triton kernels (CMake FLASHSPEC_TRITON_AOT, ``kernels/aot.py``)
against the Triton JIT and the reference, on a GPU of the compiled architecture.

The library runs the kernels the Triton backend runs, with the same launch tables and split
count: the portable kernels, and on sm_90 from 17 rows the Hopper kernel
(``kernels/hopper_tiles.py``) with its TMA descriptors encoded by the library (and, below one row
block, the rows copied into a whole block of the workspace). So its tokens,
counts, log-probabilities and max logits must equal the Triton backend's bit for bit; against the
reference the bf16 near-tie bound of ``test_llm_shapes_gpu`` applies. Every case asserts the path
taken (``flashspecKernelPath``), and the cases where the library must fall back to its native
kernels are checked too.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.config import HeadShape
from flashspec_export.kernels.tiled_argmax import tiled_argmax
from flashspec_export.kernels.tiles import (
    HAND_IN_TUNED,
    HOPPER_TUNED,
    TUNED,
    choose_config,
    hand_in_config,
)
from flashspec_export.kernels.verify_resample import verify_resample
from flashspec_export.ops import cuda
from tests.parity.test_hopper_tiles_gpu import _allowed
from tests.parity.test_llm_shapes_gpu import MAX_BF16_MISMATCH_RATE, _argmax_case, _case

pytestmark = pytest.mark.cuda_kernels


def _aot_arch() -> int:
    return cuda.triton_aot_arch() if cuda.library_path().is_file() else 0


def _device_arch() -> int:
    if not torch.cuda.is_available():
        return -1
    major, minor = torch.cuda.get_device_capability()
    return 10 * major + minor


def _skip_reason() -> str:
    if _device_arch() < 0:
        return "needs a CUDA device"
    if _aot_arch() == 0:
        return "needs the kernel library built with the Triton kernels (FLASHSPEC_TRITON_AOT)"
    return f"the library's Triton kernels are for sm_{_aot_arch()}, this GPU is sm_{_device_arch()}"


def _needs_compiled(shape: HeadShape, dtype: torch.dtype) -> None:
    """Skips where the library holds no compiled kernels for (dtype, H): a build with fewer
    ``FLASHSPEC_AOT_DTYPES`` / ``FLASHSPEC_AOT_HIDDEN_SIZES`` than the default (a library that
    compiled nothing is caught by ``test_native_fallback_where_nothing_is_compiled``)."""
    case = _case(shape, n=1, gamma=0, dtype=dtype, seed=0)
    if cuda.kernel_path("verify_resample", *case) == "native":
        pytest.skip(
            f"the library has no compiled kernels for {dtype} H {shape.hidden_size} (its build's "
            "FLASHSPEC_AOT_DTYPES / FLASHSPEC_AOT_HIDDEN_SIZES)"
        )


requires_aot = pytest.mark.skipif(
    _aot_arch() == 0 or _aot_arch() != _device_arch(), reason=_skip_reason()
)

# One row count per launch-table row of either op, 20 (the Hopper kernel from a whole row block
# of the workspace) and 512, with γ = 3 where it divides.
ROWS = sorted(
    {1, 20, 512}
    | {limit for table in (TUNED, HOPPER_TUNED) for op in table.values() for limit, _ in op}
    - {None}
)
HEADS = ["llama3-8b", "gemma3-12b"]  # H = 4096 and 3840: the default compiled hidden sizes


def _layout(rows: int) -> tuple[int, int]:
    return (rows // 4, 3) if rows % 4 == 0 else (1, rows - 1)


def _path_of(config) -> str:
    return "triton_aot_hopper" if config.hopper is not None else "triton_aot"


def _splits(op: str, rows: int, shape: HeadShape, dtype: torch.dtype) -> int:
    code = cuda.dtype_codes()[dtype]
    return cuda.library().flashspecResolveNumSplits(
        cuda.OPS[op], rows, shape.hidden_size, shape.vocab_size, code, 0
    )


@requires_aot
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("rows", ROWS)
def test_verify_equals_triton_through_the_compiled_kernels(rows, head, dtype):
    shape = HeadShape.from_name(head)
    _needs_compiled(shape, dtype)
    n, gamma = _layout(rows)
    case = _case(shape, n=n, gamma=gamma, dtype=dtype, seed=rows)
    config = choose_config(
        "verify_resample", rows, shape.hidden_size, shape.vocab_size, dtype, case[0].device
    )
    assert _splits("verify_resample", rows, shape, dtype) == config.num_splits
    for logprobs in (False, True):
        path = cuda.kernel_path("verify_resample", *case, return_logprobs=logprobs)
        assert path == _path_of(config), f"{head} {dtype} R={rows}: the library ran {path}"
        # (tokens, num_emitted[, logprobs]): the logprobs too, as the same kernels and splits ran
        triton = tuple(
            t
            for t in verify_resample(*case, return_logprobs=logprobs, config=config)
            if t is not None
        )
        library = ops.verify_resample(*case, return_logprobs=logprobs, backend="cuda")
        assert len(library) == len(triton) == (3 if logprobs else 2)
        for mine, theirs in zip(library, triton, strict=True):
            assert torch.equal(mine, theirs)


@requires_aot
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("rows", ROWS)
def test_masked_verify_equals_triton_through_the_compiled_kernels(rows, head, dtype):
    """An allowed-token mask runs the compiled kernels' MASKED variants (the mask read in the tile
    pass): the Triton backend's tokens, counts and log-probabilities, bit for bit. The mask
    allows half the ids and each draft in its own row, and forbids each sequence's last token
    of the unmasked call, so every sequence's tokens change."""
    shape = HeadShape.from_name(head)
    _needs_compiled(shape, dtype)
    n, gamma = _layout(rows)
    case = _case(shape, n=n, gamma=gamma, dtype=dtype, seed=rows)
    allowed = _allowed(case[2], shape.vocab_size, 0.5, seed=rows)
    plain_tokens, plain_num = ops.verify_resample(*case, backend="cuda")
    last = plain_num - 1  # the row of each sequence's last token: a sample, not an accepted draft
    forbidden = plain_tokens.gather(1, last[:, None])[:, 0]
    seqs = torch.arange(n, device=forbidden.device)
    words = allowed[seqs, last, forbidden // 32].to(torch.int64) & 0xFFFFFFFF
    words &= ~(1 << (forbidden % 32))
    allowed[seqs, last, forbidden // 32] = torch.where(words >= 2**31, words - 2**32, words).int()
    config = choose_config(
        "verify_resample", rows, shape.hidden_size, shape.vocab_size, dtype, case[0].device
    )
    for logprobs in (False, True):
        path = cuda.kernel_path(
            "verify_resample", *case, return_logprobs=logprobs, allowed_tokens=allowed
        )
        assert path == _path_of(config), f"{head} {dtype} R={rows}: the library ran {path}"
        triton = verify_resample(
            *case, return_logprobs=logprobs, config=config, allowed_tokens=allowed
        )
        library = ops.verify_resample(
            *case, return_logprobs=logprobs, backend="cuda", allowed_tokens=allowed
        )
        for mine, theirs in zip(library, (t for t in triton if t is not None), strict=True):
            assert torch.equal(mine, theirs)
    changed = (library[0] != plain_tokens).any(dim=1)
    assert bool(changed.all()), "the forbidden token came back: the mask was not read"


# Each bound of HAND_IN_TUNED on both sides, the Hopper kernel's (17 rows, from a whole row
# block) and 512.
TRUNCATION_ROWS = sorted({1, 17, 129, 512} | {b + d for b, _ in HAND_IN_TUNED for d in (0, 1)})
TRUNCATIONS = {  # per-sequence parameters, cycled: k 100000 is never settled (> MAX_KEPT keys)
    "top_k": dict(top_k=[50, 100_000, 0, 5]),
    "top_p": dict(top_p=[0.9, 1.0, 0.95, 0.5]),
    "all": dict(top_k=[50, 0, 1024, 20], top_p=[0.9, 0.95, 1.0, 0.8], allowed_tokens=0.5),
}


@requires_aot
@pytest.mark.parametrize("truncation", TRUNCATIONS)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("rows", TRUNCATION_ROWS)
def test_truncated_verify_equals_triton_through_the_compiled_kernels(rows, head, truncation):
    """Top-k / top-p run the Triton backend's launches compiled in: the sampled logits, the
    thresholds, the tile kernel with the hand-in (``HAND_IN_TUNED``, else the Hopper kernel or
    the ``TUNED`` row) and its stage 2: the Triton backend's split count, unsettled rows, and on
    the settled sequences its tokens, counts and log-probabilities bit for bit: the keys are
    handed in in the order the tiles' atomics take, but stage 2's sums over them are exact (in
    float32, in that order, a top-p boundary token of the 129-row case moved between runs). Stage
    2 is compiled for 16-divisible workspace pointers, as the JIT sees them (without it Triton
    3.6 laid the per-split loads out otherwise, and summed top-p's normaliser, then in float32,
    in another order: 64 ulp). The unsettled ones are recomputed by the library's native exact
    pass (the Triton backend's: the materialised one), so their tokens agree up to bf16
    near-ties."""
    shape = HeadShape.from_name(head)
    _needs_compiled(shape, torch.bfloat16)
    n, gamma = (rows // 4, 3) if rows % 4 == 0 else (rows, 0)
    case = _case(shape, n=n, gamma=gamma, dtype=torch.bfloat16, seed=rows)
    device = case[0].device
    truncate = {}
    for name, values in TRUNCATIONS[truncation].items():
        if name == "allowed_tokens":
            truncate[name] = _allowed(case[2], shape.vocab_size, values, seed=rows)
        else:
            dtype = torch.int64 if name == "top_k" else torch.float32
            truncate[name] = torch.tensor(values, dtype=dtype, device=device).repeat(n)[:n]
    config = hand_in_config(
        rows, shape.hidden_size, shape.vocab_size, torch.bfloat16, device
    ) or choose_config(
        "verify_resample", rows, shape.hidden_size, shape.vocab_size, torch.bfloat16, device
    )
    assert _splits("verify_truncated", rows, shape, torch.bfloat16) == config.num_splits
    plain_tokens, _ = ops.verify_resample(*case, backend="cuda")
    for logprobs in (False, True):
        path = cuda.kernel_path("verify_resample", *case, return_logprobs=logprobs, **truncate)
        assert path == _path_of(config), f"{head} R={rows}: the library ran {path}"
        settled_only, unsettled = verify_resample(
            *case, return_logprobs=logprobs, config=config, settle_only=True, **truncate
        )
        flags = torch.full((rows,), -1, dtype=torch.int32, device=device)
        library = cuda.verify_resample(*case, return_logprobs=logprobs, unsettled=flags, **truncate)
        assert torch.equal(flags.bool(), unsettled), "the library's stage 2 settled other rows"
        settled = ~unsettled.view(n, gamma + 1).any(dim=1)
        assert bool(settled.any())
        assert torch.equal(library.tokens[settled], settled_only.tokens[settled])
        assert torch.equal(library.num_emitted[settled], settled_only.num_emitted[settled])
        if logprobs:
            assert torch.equal(library.logprobs[settled], settled_only.logprobs[settled])
        if not settled.all():  # the recomputed sequences: the Triton backend's own recompute
            again = verify_resample(*case, return_logprobs=logprobs, config=config, **truncate)
            differ = (library.tokens != again.tokens).any(dim=1) & ~settled
            assert differ.sum().item() <= max(1, MAX_BF16_MISMATCH_RATE * n)
    if truncation == "top_k" and n > 1:
        assert bool(unsettled.any()), "k 100000 settled: the recompute was not taken"
    if rows >= 32:
        assert bool((library.tokens != plain_tokens).any()), "the truncation changed nothing"


@requires_aot
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("head", HEADS)
@pytest.mark.parametrize("rows", ROWS)
def test_argmax_equals_triton_through_the_compiled_kernels(rows, head, dtype):
    shape = HeadShape.from_name(head)
    _needs_compiled(shape, dtype)
    hidden, lm_head = _argmax_case(shape, rows, dtype)
    config = choose_config(
        "tiled_argmax", rows, shape.hidden_size, shape.vocab_size, dtype, hidden.device
    )
    path = cuda.kernel_path("tiled_argmax", hidden, lm_head, shape.vocab_size)
    assert path == _path_of(config), f"{head} {dtype} R={rows}: the library ran {path}"
    assert _splits("tiled_argmax", rows, shape, dtype) == config.num_splits
    t_tok, t_max = tiled_argmax(hidden, lm_head, shape.vocab_size, config=config)
    c_tok, c_max = ops.tiled_argmax(hidden, lm_head, shape.vocab_size, backend="cuda")
    assert torch.equal(c_tok, t_tok) and torch.equal(c_max, t_max)


@requires_aot
@pytest.mark.parametrize("head", HEADS)
def test_compiled_kernels_match_the_reference(head):
    """bf16, 128 sequences x γ = 3 (R = 512: the Hopper kernel) and 4 x 3 (R = 16: the portable
    one): tokens against the reference, up to fp32 accumulation-order near-ties."""
    shape = HeadShape.from_name(head)
    _needs_compiled(shape, torch.bfloat16)
    mismatched = total = 0
    for n, path in ((4, "triton_aot"), (128, "triton_aot_hopper")):
        case = _case(shape, n=n, gamma=3, dtype=torch.bfloat16, seed=n)
        assert cuda.kernel_path("verify_resample", *case) == path
        r_tokens, r_num = ops.verify_resample(*case, backend="reference")
        c_tokens, c_num = ops.verify_resample(*case, backend="cuda")
        differs = (r_tokens != c_tokens).any(dim=1) | (r_num != c_num)
        mismatched += int(differs.sum())
        total += differs.numel()
    assert set(r_num.tolist()) > {1}, "drafts never accepted: a vacuous case"
    assert mismatched / total <= MAX_BF16_MISMATCH_RATE


@requires_aot
# 8 rows: the portable kernel; 32: the Hopper kernel from a whole row block (the copy captured
# too); 256: the Hopper kernel
@pytest.mark.parametrize("n", [2, 8, 64])
def test_compiled_kernels_in_a_cuda_graph(n):
    """Loaded once (a first eager call), the compiled kernels replay from a captured graph (the
    Hopper kernel's TMA descriptors are launch arguments, captured by value)."""
    shape = HeadShape.from_name("llama3-8b")
    case = _case(shape, n=n, gamma=3, dtype=torch.bfloat16, seed=3)
    eager = ops.verify_resample(*case, return_logprobs=True, backend="cuda")
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        # check_values=False: the value checks read the inputs back to the host
        captured = ops.verify_resample(
            *case, return_logprobs=True, backend="cuda", check_values=False
        )
    graph.replay()
    torch.cuda.synchronize()
    for replayed, direct in zip(captured, eager, strict=True):  # tokens, counts, logprobs
        assert torch.equal(replayed, direct)


@requires_aot
def test_native_fallback_where_nothing_is_compiled():
    """The native kernels run, and the path query says so, for a hidden size not compiled in,
    fp32, γ + 1 above the finalize kernels' 8 positions, an unaligned hidden, and a split count
    the Hopper kernel cannot take."""
    shape = HeadShape.from_name("llama3-8b")
    case = _case(shape, n=4, gamma=3, dtype=torch.bfloat16, seed=5)
    assert cuda.kernel_path("verify_resample", *case) == "triton_aot"
    other_h = (case[0][..., :4032].contiguous(), case[1][:, :4032].contiguous(), *case[2:])
    assert cuda.kernel_path("verify_resample", *other_h) == "native"
    fp32 = (case[0].float(), case[1].float(), *case[2:])
    assert cuda.kernel_path("verify_resample", *fp32) == "native"
    wide = _case(shape, n=2, gamma=8, dtype=torch.bfloat16, seed=6)
    assert cuda.kernel_path("verify_resample", *wide) == "native"
    large = _case(shape, n=64, gamma=3, dtype=torch.bfloat16, seed=7)
    assert cuda.kernel_path("verify_resample", *large) == "triton_aot_hopper"
    assert cuda.kernel_path("verify_resample", *large, num_splits=7) == "native"
    hidden = case[0]
    storage = torch.empty(hidden.numel() + 1, dtype=hidden.dtype, device=hidden.device)
    unaligned = storage[1:].view(hidden.shape).copy_(hidden)  # 2 bytes off the allocation
    assert cuda.kernel_path("verify_resample", unaligned, *case[1:]) == "native"
    native_tokens, _ = ops.verify_resample(unaligned, *case[1:], backend="cuda")
    compiled_tokens, _ = ops.verify_resample(*case, backend="cuda")
    # Different kernels and splits: equal up to near-ties, which 4 sequences almost never hit.
    assert torch.equal(native_tokens, compiled_tokens)
