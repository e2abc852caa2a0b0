"""Every op of ``ops/specs.py`` has every face: a backend per implementation that resolves, the
reference, the torch custom op, the ONNX schema, function body and translation, the C ABI symbol
of its CUDA kernel, and its TensorRT plugin creator. (The CUDA noise behind the kernels is held
to the frozen vectors in tests/parity/test_noise_kernels.py.)"""

from __future__ import annotations

import ctypes
import importlib
import pathlib
import re
import subprocess
import sys

import pytest
import torch

from flashspec_export import ops
from flashspec_export.ops import cuda, registry
from flashspec_export.ops.specs import SPECS
from flashspec_export.ops.specs import required as spec_required

ROOT = pathlib.Path(__file__).parents[1]
BACKENDS = ("reference", "standard", "triton", "cuda")
FACES = list(SPECS.values())


@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_every_backend_is_registered_and_resolves(spec):
    assert set(ops.backends(spec.name)) == set(BACKENDS)
    for backend in BACKENDS:
        if backend == "triton":
            pytest.importorskip("triton")
        assert callable(registry.resolve(spec.name, backend))


@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_the_reference_lives_in_the_package(spec):
    module = importlib.import_module(f"flashspec_export.reference.{spec.name}")
    assert getattr(module, spec.name) is registry.resolve(spec.name, "reference")


@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_torch_op_has_the_spec_signature(spec):
    schema = getattr(torch.ops.flashspec, spec.name).default._schema
    assert [a.name for a in schema.arguments] == [
        *(a.name for a in spec.inputs),
        *spec.attributes,
    ]
    assert len(schema.returns) == len(spec.outputs)


@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_onnx_schema_body_and_translation(spec):
    pytest.importorskip("onnxscript")
    import onnx

    from flashspec_export.onnx import functions, schemas, translation

    schema = onnx.defs.get_schema(spec.op_type, schemas.DOMAIN_VERSION, schemas.DOMAIN)
    assert [i.name for i in schema.inputs] == [a.name for a in spec.inputs]
    optional = [a.name for a in spec.inputs if a.optional]
    assert [i.name for i in schema.inputs if i.option.name == "Optional"] == optional
    assert [o.name for o in schema.outputs] == [a.name for a in spec.outputs]
    assert set(spec.attributes) <= set(schema.attributes)
    # the body without optional inputs takes the required ones; with all, every input
    for present, names in (((), spec_required(spec)), (optional, spec.inputs)):
        body = functions.FUNCTIONS[spec.op_type](present)
        assert (body.name, body.domain) == (spec.op_type, schemas.DOMAIN)
        assert list(body.input) == [a.name for a in names]
        assert list(body.output) == [a.name for a in spec.outputs]
        assert set(spec.attributes) <= set(body.attribute)
    assert getattr(torch.ops.flashspec, spec.name).default in translation.TRANSLATIONS


def test_no_face_names_an_op_without_a_spec():
    """The derived tables hold exactly the specs' ops."""
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import functions, translation

    assert set(registry.OPS) == set(SPECS)
    assert set(functions.FUNCTIONS) == {s.op_type for s in FACES}
    assert len(translation.TRANSLATIONS) == len(SPECS)


@pytest.mark.skipif(
    not cuda.library_path().is_file(),
    reason=f"needs {cuda.library_path()} (cmake -S plugins -B plugins/build && cmake --build "
    "plugins/build -j)",
)
@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_the_cuda_kernel_library_exports_the_op(spec):
    """The built kernel library (CI builds it) exports each op's C ABI entry point."""
    lib = ctypes.CDLL(str(cuda.library_path()))
    assert hasattr(lib, spec.c_abi)


def _creator_classes() -> list[str]:
    """Plugin classes whose creators getCreators lists (plugins/api/flashspecCreators.cpp)."""
    source = (ROOT / "plugins/api/flashspecCreators.cpp").read_text()
    body = source[source.index("getCreators") :]
    return re.findall(r"FlashspecPluginCreator<flashspec::plugin::(\w+)>", body)


@pytest.mark.parametrize("spec", FACES, ids=lambda s: s.name)
def test_getcreators_lists_the_plugin(spec):
    """The creator list names the op's plugin class, whose kName is the op_type, and CMake builds
    its source. (Checked on the source: the plugins build only where TensorRT headers are; the
    next test checks the built library where it exists.)"""
    cls = f"{spec.op_type}Plugin"
    assert cls in _creator_classes()
    stem = spec.op_type[0].lower() + spec.op_type[1:]
    header = (ROOT / f"plugins/{stem}/{stem}Plugin.h").read_text()
    assert f'kName = "{spec.op_type}"' in header
    assert f"{stem}/{stem}Plugin.cpp" in (ROOT / "plugins/CMakeLists.txt").read_text()
    assert len(_creator_classes()) == len(SPECS)


def test_the_built_plugin_library_registers_every_op():
    """Loaded into TensorRT-RTX's registry (in a process of its own), the library's creators are
    exactly the specs' op types."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    from flashspec_export.engine import plugins

    library = plugins.library_path()
    if library is None:
        pytest.skip(f"needs {plugins.DEFAULT_LIBRARY} (configure plugins/ with TensorRT headers)")
    code = (
        "import tensorrt_rtx as trt; from flashspec_export.engine import plugins; "
        "print(' '.join(sorted(plugins.register(trt, plugins.library_path()))))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.split() == sorted(s.op_type for s in FACES)


def test_an_unknown_op_or_backend_is_named():
    with pytest.raises(ValueError, match="op: unknown op 'softmax'; expected one of"):
        ops.backends("softmax")
    with pytest.raises(ValueError, match="backend: unknown backend 'numpy' for tiled_argmax"):
        registry.resolve("tiled_argmax", "numpy")
