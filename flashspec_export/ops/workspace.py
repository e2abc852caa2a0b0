"""Scratch memory of the kernels' launches (workspaces), safe on several CUDA streams and under
CUDA-graph capture. Used by the Triton kernels (``kernels/``) and the cuda backend
(``ops/cuda.py``).

A launch's workspace is written and read by that launch's own kernels only. So:

- Outside capture, launches on one stream run in order and reuse one buffer per
  ``(device, stream, tag)``, grown to the largest size asked: a serving loop whose batch size
  changes keeps one buffer per stream, not one per batch size, and launches on two streams never
  share one. A buffer replaced by a larger one goes back to torch's caching allocator, which hands
  its memory out again only in order on the stream it was allocated on, i.e. after the launches
  that used it.
- During capture (``torch.cuda.is_current_stream_capturing()``) every call gets a fresh buffer:
  it comes from the graph's private memory pool and only that graph's kernels touch it, so two
  graphs never share a workspace, and no eager call overwrites a graph's between replays.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

# Every part starts on a 16-byte boundary (the kernels' pointer alignment; a fresh allocation is
# 512-byte aligned).
ALIGN = 16

Part = tuple[Sequence[int], torch.dtype]  # (shape, dtype) of one workspace tensor

_BUFFERS: dict[tuple, torch.Tensor] = {}


def layout(parts: Sequence[Part]) -> tuple[list[int], int]:
    """Byte offsets of ``parts`` (each 16-byte aligned) in one buffer, and the buffer's size."""
    offsets, end = [], 0
    for shape, dtype in parts:
        offsets.append(end)
        end += -(-_nbytes(shape, dtype) // ALIGN) * ALIGN
    return offsets, max(end, ALIGN)


def stream_workspace(
    device: torch.device,
    stream: int,
    tag: Hashable,
    parts: Sequence[Part],
    *,
    capturing: bool,
    cache: dict[tuple, torch.Tensor] | None = None,
) -> tuple[torch.Tensor, ...]:
    """``launch_workspace`` for an explicit stream: the rule above, with the stream's handle and its
    capture state given (testable without a GPU).

    Parameters
    ----------
    device : where the buffer lives
    stream : the launch stream's handle (``torch.cuda.Stream.cuda_stream``; 0 on the CPU)
    tag : which workspace of a launch (one per kernel family: the tensors one launch uses at the
        same time must come from different tags)
    parts : ``(shape, dtype)`` of each tensor
    capturing : the stream is being captured into a CUDA graph: a fresh buffer, never cached
    cache : the buffers kept per ``(device, stream, tag)`` (default: this module's)

    Returns
    -------
    one tensor per part, views of one byte buffer at 16-byte aligned offsets, uninitialised (a
    reused buffer holds the last launch's values)
    """
    offsets, nbytes = layout(parts)
    if capturing:
        buffer = torch.empty(nbytes, dtype=torch.uint8, device=device)
    else:
        cache = _BUFFERS if cache is None else cache
        key = (device, stream, tag)
        buffer = cache.get(key)
        if buffer is None or buffer.numel() < nbytes:
            buffer = cache[key] = torch.empty(nbytes, dtype=torch.uint8, device=device)
    return tuple(
        buffer[offset : offset + _nbytes(shape, dtype)].view(dtype).view(shape)
        for offset, (shape, dtype) in zip(offsets, parts, strict=True)
    )


def launch_workspace(device: torch.device, tag: Hashable, *parts: Part) -> tuple[torch.Tensor, ...]:
    """Workspace tensors ``parts`` (``(shape, dtype)`` each) for a launch on the current stream of
    ``device``: one reused buffer per ``(device, stream, tag)`` outside capture, a fresh one
    during CUDA-graph capture (module docstring). Allocates nothing on a repeated call with the
    same or smaller sizes outside capture."""
    if device.type == "cuda":
        with torch.cuda.device(device):
            device = torch.device("cuda", torch.cuda.current_device())
            stream = torch.cuda.current_stream().cuda_stream
            capturing = torch.cuda.is_current_stream_capturing()
    else:
        stream, capturing = 0, False
    return stream_workspace(device, stream, tag, parts, capturing=capturing)


def _nbytes(shape: Sequence[int], dtype: torch.dtype) -> int:
    numel = 1
    for size in shape:
        numel *= size
    return numel * dtype.itemsize
