"""Every op has every face: a registry entry per backend that resolves, and a reference module."""

from __future__ import annotations

import importlib

import pytest

from flashspec_export import ops
from flashspec_export.ops import registry

REQUIRED_BACKENDS = ("reference", "standard", "triton")


@pytest.mark.parametrize("op", registry.OPS)
def test_every_op_has_the_required_backends(op):
    assert set(REQUIRED_BACKENDS) <= set(ops.backends(op))


@pytest.mark.parametrize("op", registry.OPS)
def test_reference_lives_in_the_package(op):
    module = importlib.import_module(f"flashspec_export.reference.{op}")
    assert callable(getattr(module, op))


@pytest.mark.parametrize(
    ("op", "backend"), [(o, b) for o in registry.OPS for b in REQUIRED_BACKENDS]
)
def test_backends_resolve(op, backend):
    assert callable(registry.resolve(op, backend))


def test_unknown_op_is_named():
    with pytest.raises(ValueError, match="op: unknown op 'softmax'; expected one of"):
        ops.backends("softmax")


@pytest.mark.parametrize("op", registry.OPS)
def test_every_op_has_an_onnx_face(op):
    pytest.importorskip("onnx")
    from flashspec_export.onnx import functions
    from flashspec_export.ops.specs import SPECS

    op_type = SPECS[op].op_type
    assert functions.FUNCTIONS[op_type]().name == op_type
