"""Launches on several CUDA streams and inside CUDA graphs (a GPU): each stream and each captured
graph has its own workspace (``flashspec_export/ops/workspace.py``), and the cuda backend's
compiled kernels are loaded outside capture (``plugins/common/tritonAot.cu``, the capture rule).

Concurrent launches sharing one workspace would mix their summaries; the tests run two problems
of the same shape (the same workspace size) on two streams at once, many rounds, and compare
each result with the problem's own result on one stream: bit for bit, and for fp32 also with the
reference's tokens.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys
import textwrap

import pytest
import torch

from flashspec_export import ops
from flashspec_export.config import HeadShape
from flashspec_export.ops.workspace import launch_workspace

pytestmark = pytest.mark.gpu

ROUNDS = 8


@pytest.fixture(params=["triton", pytest.param("cuda", marks=pytest.mark.cuda_kernels)])
def backend(request):
    return request.param


def _verify_case(lm_head, vocab, n, gamma, seed):
    """hidden [n, γ + 1, H] and per-sequence inputs for ``lm_head`` [V, H] (drafts: the target's
    greedy tokens, mostly, so drafts are accepted)."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    h = lm_head.shape[1]
    hidden = torch.randn(n, gamma + 1, h, device="cuda", generator=g).to(lm_head.dtype)
    greedy, _ = ops.tiled_argmax(hidden.reshape(-1, h), lm_head, vocab, backend="reference")
    greedy = greedy.reshape(n, gamma + 1)[:, :gamma]
    random = torch.randint(0, vocab, (n, gamma), device="cuda", generator=g)
    drafts = torch.where(torch.rand(n, gamma, device="cuda", generator=g) < 0.8, greedy, random)
    temps = torch.tensor([0.0, 0.7, 1.0, 1.3], device="cuda").repeat(n // 4 + 1)[:n]
    seeds = torch.randint(0, 2**62, (n,), device="cuda", generator=g)
    positions = torch.randint(0, 100_000, (n,), device="cuda", generator=g)
    return hidden, lm_head, drafts, temps, seeds, positions, vocab


def _verify(case, backend):
    return ops.verify_resample(*case, return_logprobs=True, backend=backend, check_values=False)


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_launch_workspace_follows_the_stream_and_the_capture():
    """Two streams: two buffers, each reused on its stream; two captured graphs: a fresh buffer
    each, neither a stream's cached one."""
    device = torch.device("cuda", torch.cuda.current_device())
    parts = (((64, 8), torch.float32), ((64, 8), torch.int32))
    first, second = torch.cuda.Stream(), torch.cuda.Stream()
    with torch.cuda.stream(first):
        on_first = launch_workspace(device, "test", *parts)[0]
    with torch.cuda.stream(second):
        on_second = launch_workspace(device, "test", *parts)[0]
    with torch.cuda.stream(first):
        again = launch_workspace(device, "test", ((8, 8), torch.float32))[0]
    assert on_first.data_ptr() != on_second.data_ptr()
    assert again.data_ptr() == on_first.data_ptr()
    captured = []
    for _ in range(2):
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            (buffer,) = launch_workspace(device, "test", ((64, 8), torch.float32))
            buffer.zero_()
        captured.append((graph, buffer))
    pointers = {on_first.data_ptr(), on_second.data_ptr(), *(b.data_ptr() for _, b in captured)}
    assert len(pointers) == 4


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
# N · (γ + 1) = 8 rows: the portable kernels; 20: on sm_90 the Hopper kernel from a whole row
# block (its copy and row scratch per stream too); 128: the Hopper kernel
@pytest.mark.parametrize("n", [2, 5, 32])
def test_two_streams_verify_concurrently(backend, dtype, n):
    """Two problems of one shape verified at once on two streams, ROUNDS times: every result is
    the problem's own one-stream result (fp32: the reference's tokens too)."""
    shape = HeadShape.from_name("llama3-8b")
    g = torch.Generator(device="cuda").manual_seed(n)
    h = shape.hidden_size
    lm_head = torch.randn(shape.padded_vocab, h, device="cuda", generator=g) * (8.0 / h**0.5)
    lm_head = lm_head.to(dtype)
    cases = [_verify_case(lm_head, shape.vocab_size, n, 3, seed) for seed in (1, 2)]
    alone = [_verify(case, backend) for case in cases]  # compiles, loads; one stream
    if dtype == torch.float32:
        for case, result in zip(cases, alone, strict=True):
            reference = ops.verify_resample(*case, backend="reference")
            assert torch.equal(result[0], reference[0])  # tokens
            assert torch.equal(result[1], reference[1])  # num_emitted
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    results = [[], []]
    for _ in range(ROUNDS):
        for stream, case, out in zip(streams, cases, results, strict=True):
            with torch.cuda.stream(stream):
                out.append(_verify(case, backend))
    torch.cuda.synchronize()
    for expected, out in zip(alone, results, strict=True):
        assert all(_equal(result, expected) for result in out)


def test_two_graphs_replayed_at_once(backend):
    """Two graphs captured from calls of the same shape (so a shared cache would hand them one
    workspace), replayed concurrently on two streams: each replays its own eager result."""
    shape = HeadShape.from_name("llama3-8b")
    g = torch.Generator(device="cuda").manual_seed(0)
    h = shape.hidden_size
    lm_head = (torch.randn(shape.padded_vocab, h, device="cuda", generator=g) * (8.0 / h**0.5)).to(
        torch.bfloat16
    )
    cases = [_verify_case(lm_head, shape.vocab_size, 8, 3, seed) for seed in (3, 4)]
    eager = [_verify(case, backend) for case in cases]  # compiles and loads before capture
    graphs, captured = [], []
    for case in cases:
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            captured.append(_verify(case, backend))
        graphs.append(graph)
    streams = [torch.cuda.Stream(), torch.cuda.Stream()]
    for stream in streams:
        stream.wait_stream(torch.cuda.current_stream())
    for _ in range(ROUNDS):
        for stream, graph in zip(streams, graphs, strict=True):
            with torch.cuda.stream(stream):
                graph.replay()
        torch.cuda.synchronize()
        assert all(_equal(c, e) for c, e in zip(captured, eager, strict=True))


# A fresh process: no earlier call has loaded the library's kernels into its CUDA context.
_CAPTURE_FIRST = textwrap.dedent(
    """
    import json
    import torch
    from flashspec_export.config import HeadShape
    from flashspec_export.ops import cuda
    from tests.parity.test_streams_and_graphs_gpu import _verify_case

    shape = HeadShape.from_name("llama3-8b")
    g = torch.Generator(device="cuda").manual_seed(0)
    h = shape.hidden_size
    lm_head = (torch.randn(shape.padded_vocab, h, device="cuda", generator=g) / h**0.5).bfloat16()
    case = _verify_case(lm_head, shape.vocab_size, 4, 3, seed=5)
    report = {"path": cuda.kernel_path("verify_resample", *case)}

    def capture():
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            result = cuda.verify_resample(*case)
        graph.replay()
        torch.cuda.synchronize()
        return result.tokens.tolist()

    try:
        report["captured"] = capture()
    except RuntimeError as error:
        report["refused"] = str(error)
        cuda.prepare()
        report["captured"] = capture()
    report["eager"] = cuda.verify_resample(*case).tokens.tolist()
    print(json.dumps(report))
    """
)


@pytest.mark.cuda_kernels
def test_cuda_capture_without_warm_up():
    """The first cuda-backend call of a process, captured: it either works, or is refused with
    the error that says to call ``prepare()`` first — and after ``prepare()`` the capture works.
    Either way the replay gives the eager tokens. Where the compiled kernels serve the call
    (``kernel_path`` not native) it must be refused: the library loads no module in capture."""
    root = pathlib.Path(__file__).parents[2]
    run = subprocess.run(
        [sys.executable, "-c", _CAPTURE_FIRST],
        capture_output=True,
        text=True,
        timeout=600,
        cwd=root,
    )
    assert run.returncode == 0, run.stderr[-4000:]
    report = json.loads(run.stdout.strip().splitlines()[-1])
    if report["path"] != "native":
        assert "refused" in report
    if "refused" in report:
        assert "status 900" in report["refused"]
        assert "flashspec_export.ops.cuda.prepare()" in report["refused"]
    assert report["captured"] == report["eager"]
