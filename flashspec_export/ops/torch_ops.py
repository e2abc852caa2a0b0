"""The FlashSpec ops as ``torch.library`` custom ops, defined from their specs (``ops/specs.py``),
so models that call them trace, compile and export (``torch.onnx.export`` turns them into
``flashspec`` nodes, see ``onnx/translation.py``).

``torch.ops.flashspec.<name>`` takes canonical tensors (as the backends do) and runs the Triton
kernels on CUDA, the reference elsewhere; ``verify_resample`` always returns log-probabilities.
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from flashspec_export.ops import registry
from flashspec_export.ops.specs import SPECS, OpSpec, output_shapes

_DTYPES = {"int64": torch.int64, "float32": torch.float32}


def _backend(t: torch.Tensor) -> str:
    return "triton" if t.is_cuda and importlib.util.find_spec("triton") else "reference"


def schema(spec: OpSpec) -> str:
    """The torch schema of ``spec``: its tensors, then its int attributes."""
    args = [f"Tensor {a.name}" for a in spec.inputs] + [f"int {a}" for a in spec.attributes]
    return f"({', '.join(args)}) -> ({', '.join('Tensor' for _ in spec.outputs)})"


def _run(spec: OpSpec, *args):
    tensors = args[: len(spec.inputs)]
    result = registry.resolve(spec.name, _backend(tensors[0]))(*args, **spec.torch_kwargs)
    return tuple(result)


def _fake(spec: OpSpec, *args):
    tensors = args[: len(spec.inputs)]
    shapes = output_shapes(spec, tensors)
    return tuple(
        tensors[0].new_empty(shape, dtype=_DTYPES[out.dtype])
        for shape, out in zip(shapes, spec.outputs, strict=True)
    )


def _define(spec: OpSpec) -> None:
    qualname = f"flashspec::{spec.name}"
    torch.library.define(qualname, schema(spec))
    torch.library.impl(qualname, "default")(functools.partial(_run, spec))
    torch.library.register_fake(qualname)(functools.partial(_fake, spec))


for _spec in SPECS.values():
    _define(_spec)
