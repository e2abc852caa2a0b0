"""The export's one weights file, shared by its graphs.

Every initializer of at least ``INLINE_BYTES`` is written once to ``weights.data`` beside the
graphs and referenced from each graph as ONNX external data (location, offset, length), so the
prefill and step graphs and the drafter's shared tensors (embeddings, LM head) cost their bytes
once on disk, and no graph proto comes near protobuf's 2 GB limit whatever the model's size.

A tensor is recognised as already written by its identity when it is a live PyTorch tensor (the
modules' parameters outlive the export), otherwise by its dtype, shape and SHA-256 (the
exporter's folded constants, such as a transposed weight, are new arrays in each graph).
"""

from __future__ import annotations

import hashlib
import pathlib

import onnx_ir as ir
import torch

FILE_NAME = "weights.data"
INLINE_BYTES = 1024  # smaller initializers (scalars, shapes, norms of tiny models) stay inline
ALIGNMENT = 4096  # offsets are page-aligned, so a runtime can map each tensor directly


class WeightsFile:
    """``weights.data`` in ``directory``, written tensor by tensor as graphs are externalised (a
    context manager: the file is complete when the ``with`` block ends)."""

    def __init__(self, directory: pathlib.Path):
        self.directory = pathlib.Path(directory)
        self.path = self.directory / FILE_NAME
        self._file = open(self.path, "wb")  # noqa: SIM115  (closed on leaving the with block)
        self._written: dict[tuple, tuple[int, int]] = {}  # key -> (offset, length)

    def externalize(self, model: ir.Model) -> None:
        """Point every large initializer of ``model`` at this file, writing the new ones."""
        for value in model.graph.initializers.values():
            tensor = value.const_value
            if tensor is None or tensor.nbytes < INLINE_BYTES:
                continue
            raw = getattr(tensor, "raw", None)
            if isinstance(raw, torch.Tensor):  # from the tensor's memory, no bytes copy
                data = raw.detach().cpu().contiguous().reshape(-1).view(torch.uint8).numpy()
                key = (raw.untyped_storage().data_ptr(), raw.storage_offset(), raw.stride())
            else:
                data = tensor.tobytes()
                key = (hashlib.sha256(data).hexdigest(),)
            key = (*key, tensor.dtype, tuple(tensor.shape))
            if key not in self._written:
                self._written[key] = self._append(data)
            offset, length = self._written[key]
            value.const_value = ir.ExternalTensor(
                FILE_NAME,
                offset,
                length,
                tensor.dtype,
                shape=tensor.shape,
                name=value.name,
                base_dir=self.directory,
            )

    def __enter__(self) -> WeightsFile:
        return self

    def __exit__(self, *exc) -> None:
        self._file.close()

    @property
    def size(self) -> int:
        """Bytes written so far."""
        return self.path.stat().st_size if self._file.closed else self._file.tell()

    @property
    def tensors(self) -> int:
        """Distinct tensors written."""
        return len(self._written)

    def _append(self, data) -> tuple[int, int]:
        """Write ``data`` (bytes or a uint8 array) at the next aligned offset; (offset, length)."""
        offset = -self._file.tell() % ALIGNMENT + self._file.tell()
        self._file.seek(offset)
        self._file.write(data)
        return offset, len(data)
