"""The FlashSpec ops as ``torch.library`` custom ops, defined from their specs (``ops/specs.py``),
so models that call them trace, compile and export (``torch.onnx.export`` turns them into
``flashspec`` nodes, see ``onnx/translation.py``).

``torch.ops.flashspec.<name>`` takes canonical tensors (as the backends do) and runs the Triton
kernels on CUDA, the reference elsewhere; ``verify_resample`` always returns log-probabilities.
Optional inputs (``Tensor? top_k=None`` ...) follow the required ones, and the int attributes
are keyword-only (``vocab_size=``). ``verify_resample`` with any of ``top_k`` / ``top_p`` /
``allowed_tokens`` runs a backend of ``ops.TRUNCATING_BACKENDS`` (the Triton kernels on CUDA;
"standard" wherever the backend it would run does not take them).
"""

from __future__ import annotations

import functools
import importlib.util

import torch

from flashspec_export.ops import registry
from flashspec_export.ops.specs import SPECS, OpSpec, has_optional, output_shapes, required

_DTYPES = {"int64": torch.int64, "int32": torch.int32, "float32": torch.float32}


def _backend(t: torch.Tensor, truncating: bool) -> str:
    from flashspec_export.ops import TRUNCATING_BACKENDS  # ops/__init__ imports this module

    backend = "triton" if t.is_cuda and importlib.util.find_spec("triton") else "reference"
    if truncating and backend not in TRUNCATING_BACKENDS:
        return "standard"
    return backend


def schema(spec: OpSpec) -> str:
    """The torch schema of ``spec``: its tensors (the optional ones ``Tensor? name=None``), then
    its int attributes (keyword-only after optional tensors, as a schema requires)."""
    args = [f"Tensor{'?' if a.optional else ''} {a.name}" for a in spec.inputs]
    args = [f"{arg}=None" if a.optional else arg for arg, a in zip(args, spec.inputs, strict=True)]
    args += ["*"] if has_optional(spec) else []
    args += [f"int {a}" for a in spec.attributes]
    return f"({', '.join(args)}) -> ({', '.join('Tensor' for _ in spec.outputs)})"


def _bind(spec: OpSpec, args, kwargs) -> tuple[list, dict]:
    """(every input, None for an absent optional one; the attributes) of a call."""
    names = [a.name for a in spec.inputs] + list(spec.attributes)
    bound = dict(zip(names, args, strict=False)) | kwargs
    return [bound.get(a.name) for a in spec.inputs], {a: bound[a] for a in spec.attributes}


def _run(spec: OpSpec, *args, **kwargs):
    tensors, attributes = _bind(spec, args, kwargs)
    count = len(required(spec))
    optional = zip(spec.inputs[count:], tensors[count:], strict=True)
    given = {a.name: t for a, t in optional if t is not None}  # absent ones: not passed at all
    implementation = registry.resolve(spec.name, _backend(tensors[0], truncating=bool(given)))
    result = implementation(*tensors[:count], *attributes.values(), **spec.torch_kwargs, **given)
    return tuple(result)


def _fake(spec: OpSpec, *args, **kwargs):
    tensors, _ = _bind(spec, args, kwargs)
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
