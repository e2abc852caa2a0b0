"""The import graph follows the data: export -> manifest -> engine / runtime. The reference
imports only torch; engine and runtime never import the exporter; engine never imports the
runtime. Checked on what an import really loads (a fresh interpreter), not on text."""

from __future__ import annotations

import ast
import pathlib
import subprocess
import sys

import pytest

PACKAGE = pathlib.Path(__file__).parents[1] / "flashspec_export"


def _loaded_after(module: str) -> set[str]:
    code = f"import sys, {module}; print('\\n'.join(sorted(sys.modules)))"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120
    )
    return set(result.stdout.split())


@pytest.mark.parametrize(
    "module",
    [
        "flashspec_export.engine.build",
        "flashspec_export.runtime.sessions",
        "flashspec_export.runtime.run",
        "flashspec_export.runtime.invariance",
    ],
)
def test_engine_and_runtime_never_import_the_exporter(module):
    loaded = _loaded_after(module)
    assert "flashspec_export.export.pipeline" not in loaded
    assert "flashspec_export.onnx.translation" not in loaded  # torch -> ONNX lives in export
    if module.startswith("flashspec_export.engine"):
        assert not {m for m in loaded if m.startswith("flashspec_export.runtime")}


def test_the_reference_imports_only_torch():
    """Direct imports of every reference module: the standard library, torch and the reference
    itself (it is the specification every backend is checked against)."""
    allowed_roots = {"__future__", "typing", "math", "dataclasses", "torch"}
    for path in sorted((PACKAGE / "reference").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            else:
                continue
            for name in names:
                ok = name.split(".")[0] in allowed_roots or name.startswith(
                    "flashspec_export.reference"
                )
                assert ok, f"{path.name} imports {name}"
    loaded = _loaded_after("flashspec_export.reference.verify_resample")
    ours = {m for m in loaded if m.startswith("flashspec_export.")}
    assert ours <= {"flashspec_export.reference", *(m for m in ours if ".reference." in m)}


def test_the_manifest_is_a_leaf_of_the_pipeline():
    """``export/manifest.py`` is the contract both sides read: it imports no layer above it."""
    loaded = _loaded_after("flashspec_export.export.manifest")
    ours = {m for m in loaded if m.startswith("flashspec_export.")}
    assert ours <= {
        "flashspec_export.config",
        "flashspec_export.export",
        *(m for m in ours if m.startswith("flashspec_export.export.manifest")),
    }
