"""Parity tests: every backend against the reference, token for token (the Triton kernels under
the interpreter without a GPU: ``tests/conftest.py``)."""

from __future__ import annotations


def runnable(backend: str) -> str:
    """``backend`` if it can run here; otherwise the test skips with the reason."""
    import pytest

    from flashspec_export.ops import cuda

    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cuda" and not cuda.available():
        pytest.skip(f"cuda backend: needs a CUDA device and {cuda.library_path()}")
    return backend
