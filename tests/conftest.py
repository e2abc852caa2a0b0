"""Markers skip by capability, never by catching an error.

- ``gpu``: needs a CUDA device.
- ``cuda_kernels``: needs a CUDA device and the built kernel library (``plugins/build``).
- ``trt``: needs TensorRT (``import tensorrt``); TensorRT-RTX does not count.
- ``slow``: opt-in with ``--runslow``.

Without a GPU the Triton kernels run under the Triton interpreter (NumPy, on CPU). The switch
must be set before any ``@triton.jit`` function is decorated, i.e. before the kernel modules are
imported, so it lives here, before every test module. An explicit ``TRITON_INTERPRET`` wins.

Under pytest-xdist each worker gets its share of the cores for its thread pools (OpenMP: torch;
OpenBLAS: NumPy, the interpreter's dots), set before NumPy and torch load: every worker's pools
sized to the whole machine spin against each other (2 workers on 2 cores: test_stdlib_tiny and
test_dtypes took 141 s, 65 s with one thread each). An explicit setting wins.
"""

from __future__ import annotations

import importlib.util
import os

if os.environ.get("PYTEST_XDIST_WORKER_COUNT"):
    _share = len(os.sched_getaffinity(0)) // int(os.environ["PYTEST_XDIST_WORKER_COUNT"])
    for _name in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(_name, str(max(1, _share)))

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_addoption(parser):
    parser.addoption("--runslow", action="store_true", help="also run tests marked slow")


def pytest_collection_modifyitems(config, items):
    reasons = {}
    if not torch.cuda.is_available():
        reasons["gpu"] = "needs a CUDA device (torch.cuda.is_available() is False)"
    from flashspec_export.ops import cuda

    if not cuda.available():
        reasons["cuda_kernels"] = (
            f"needs a CUDA device and {cuda.library_path()} "
            "(cmake -S plugins -B plugins/build && cmake --build plugins/build -j)"
        )
    if importlib.util.find_spec("tensorrt") is None:
        reasons["trt"] = "needs TensorRT (the tensorrt module is not installed)"
    if not config.getoption("--runslow"):
        reasons["slow"] = "slow test: pass --runslow to run it"
    for item in items:
        for marker, reason in reasons.items():
            if marker in item.keywords:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture(scope="session")
def tiny_ngram_export(tmp_path_factory):
    """One tiny-llama + n-gram export (max_len 16) for the tests that only read it or start from
    a copy (``shutil.copytree``): exporting costs seconds, copying milliseconds."""
    pytest.importorskip("transformers")
    pytest.importorskip("onnxscript")
    from flashspec_export.export.pipeline import export
    from flashspec_export.models.build import ExportConfig

    out = tmp_path_factory.mktemp("tiny-ngram") / "export"
    export(ExportConfig(target="tiny-llama", draft="ngram", out=str(out), max_len=16))
    return out
