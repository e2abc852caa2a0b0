"""Parity tests: every backend against the reference, token for token.

Without a GPU the Triton kernels run under the Triton interpreter (NumPy, on CPU). The switch
must be set before any ``@triton.jit`` function is decorated, i.e. before the kernel modules are
imported, so it lives here and not in the tests. An explicit ``TRITON_INTERPRET`` wins.
"""

from __future__ import annotations

import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def runnable(backend: str) -> str:
    """``backend`` if it can run here; otherwise the test skips with the reason."""
    import pytest

    from flashspec_export.ops import cuda

    if backend == "triton":
        pytest.importorskip("triton")
    if backend == "cuda" and not cuda.available():
        pytest.skip(f"cuda backend: needs a CUDA device and {cuda.library_path()}")
    return backend
