"""Workspaces (``flashspec_export/ops/workspace.py``): one buffer per (device, stream, tag), grown
to the largest size asked and reused outside CUDA-graph capture, a fresh one during capture.

The rule is checked through ``stream_workspace`` with explicit stream handles and capture
states, on the CPU; then through the Triton kernels' own default workspaces (interpreted without
a GPU): many batch sizes on one stream keep one buffer, and the reused buffer changes no token.
What needs a GPU (real streams, graph capture, concurrent launches) is in
``tests/parity/test_streams_and_graphs_gpu.py``.
"""

from __future__ import annotations

import pytest
import torch

from flashspec_export import ops
from flashspec_export.ops import workspace
from flashspec_export.ops.workspace import layout, stream_workspace
from tests.cases import make_case

CPU = torch.device("cpu")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _summaries(rows: int, splits: int = 5):
    """The argmax's workspace parts: max [rows, S] float32, index [rows, S] int32."""
    return (((rows, splits), torch.float32), ((rows, splits), torch.int32))


def test_one_buffer_per_stream_whatever_the_batch():
    """A serving loop's batch sizes, up and down: one buffer, as large as the largest ask."""
    cache = {}
    for rows in [1, 7, 64, 3, 33, 2]:
        ws_max, ws_index = stream_workspace(
            CPU, 11, "t", _summaries(rows), capturing=False, cache=cache
        )
        assert ws_max.shape == ws_index.shape == (rows, 5)
        assert (ws_max.dtype, ws_index.dtype) == (torch.float32, torch.int32)
    assert list(cache) == [(CPU, 11, "t")]
    assert cache[(CPU, 11, "t")].numel() == layout(_summaries(64))[1]


def test_streams_and_tags_never_share_a_buffer():
    """Two streams (or two tags on one stream) get different memory; a stream gets its own
    buffer back, also for a smaller ask."""
    cache = {}

    def first(stream, tag, rows):
        return stream_workspace(CPU, stream, tag, _summaries(rows), capturing=False, cache=cache)[0]

    on_1, on_2, other_tag = first(1, "t", 8), first(2, "t", 8), first(1, "u", 8)
    assert len({on_1.data_ptr(), on_2.data_ptr(), other_tag.data_ptr()}) == 3
    assert first(1, "t", 4).data_ptr() == on_1.data_ptr()
    assert len(cache) == 3


def test_capture_gets_a_fresh_buffer_and_caches_nothing():
    """During capture every call allocates (from the graph's pool, on a GPU); the cached eager
    buffer is neither used nor replaced."""
    cache = {}
    eager = stream_workspace(CPU, 1, "t", _summaries(8), capturing=False, cache=cache)[0]
    captured = [
        stream_workspace(CPU, 1, "t", _summaries(rows), capturing=True, cache=cache)[0]
        for rows in (8, 64)
    ]
    assert len({eager.data_ptr(), *(t.data_ptr() for t in captured)}) == 3
    assert list(cache) == [(CPU, 1, "t")]
    assert cache[(CPU, 1, "t")].data_ptr() == eager.data_ptr()
    assert cache[(CPU, 1, "t")].numel() == layout(_summaries(8))[1]


def test_parts_are_aligned_and_disjoint():
    """Each part starts 16 bytes past a 16-byte boundary of the buffer and no two overlap:
    values written to each survive the writes to the others."""
    parts = (
        ((3,), torch.int8),
        ((5, 3), torch.float32),
        ((2,), torch.int64),
        ((0, 4), torch.int32),
    )
    tensors = stream_workspace(CPU, 0, "t", parts, capturing=False, cache={})
    base = tensors[0].data_ptr()
    assert [t.shape for t in tensors] == [torch.Size(shape) for shape, _ in parts]
    assert all((t.data_ptr() - base) % 16 == 0 for t in tensors)
    for value, t in enumerate(tensors):
        t.fill_(value + 1)
    for value, t in enumerate(tensors):
        assert bool((t == value + 1).all())
    offsets, nbytes = layout(parts)
    assert offsets == [0, 16, 80, 96] and nbytes == 96


@pytest.fixture
def fresh_buffers(monkeypatch):
    """The module's cache, emptied for this test (and restored after)."""
    buffers = {}
    monkeypatch.setattr(workspace, "_BUFFERS", buffers)
    return buffers


def _tags(buffers, tag):
    return [key for key in buffers if key[2] == tag]


def test_triton_argmax_keeps_one_workspace_over_batch_sizes(fresh_buffers):
    """Batch sizes 5, 1, 3 on one stream: one cached workspace (not one per N), and the tokens of
    each call — a smaller call reuses a larger call's buffer — are the reference's."""
    pytest.importorskip("triton")
    g = torch.Generator().manual_seed(0)
    lm_head = (torch.randn(1000, 40, generator=g) * 0.5).to(DEVICE)
    for n in (5, 1, 3):
        hidden = torch.randn(n, 40, generator=g).to(DEVICE)
        token, _ = ops.tiled_argmax(hidden, lm_head, 1000, backend="triton")
        expected, _ = ops.tiled_argmax(hidden, lm_head, 1000, backend="reference")
        assert torch.equal(token, expected)
    assert len(_tags(fresh_buffers, "tiled_argmax")) == 1


def test_triton_verify_keeps_one_workspace_over_batch_sizes(fresh_buffers):
    """As for the argmax: N = 4, 1, 3 (γ = 2) share one buffer and emit the reference's tokens."""
    pytest.importorskip("triton")
    for n in (4, 1, 3):
        *tensors, vocab = make_case(n, 2, 40, 1000, torch.float32, seed=n)
        case = (*(t.to(DEVICE) for t in tensors), vocab)
        tokens, emitted = ops.verify_resample(*case, backend="triton")
        r_tokens, r_emitted = ops.verify_resample(*case, backend="reference")
        assert torch.equal(tokens, r_tokens) and torch.equal(emitted, r_emitted)
    assert len(_tags(fresh_buffers, "verify_resample")) == 1
