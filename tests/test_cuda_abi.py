"""The ctypes mirror of the CUDA kernels' C ABI (flashspec_export/ops/cuda.py) matches the
library's own layout, and the host-side entry points agree with the kernels' contract. Runs on
CPU: loading the library and these calls need no GPU."""

from __future__ import annotations

import ctypes

import pytest

from flashspec_export.ops import cuda

pytestmark = pytest.mark.skipif(
    not cuda.library_path().is_file(),
    reason=f"needs {cuda.library_path()} (cmake -S plugins -B plugins/build && cmake --build "
    "plugins/build -j)",
)


@pytest.mark.parametrize(
    ("op", "structure"), [(0, cuda._TiledArgmaxParams), (1, cuda._VerifyResampleParams)]
)
def test_params_layout_matches_the_library(op, structure):
    offsets = (ctypes.c_size_t * 32)()
    count = cuda.library().flashspecParamsLayout(op, offsets, 32)
    fields = [getattr(structure, name).offset for name, _ in structure._fields_]
    assert list(offsets[:count]) == [*fields, ctypes.sizeof(structure)]


def test_abi_version_and_workspace_sizes():
    lib = cuda.library()
    assert lib.flashspecAbiVersion() == cuda.ABI_VERSION
    assert lib.flashspecResolveNumSplits(20, 4096, 128256, 2, 7) == 7  # requested is kept
    # per (row, split): max + index for the argmax, five floats + an index for the verify
    assert lib.flashspecTiledArgmaxWorkspaceSize(20, 7) == 20 * 7 * 8
    assert lib.flashspecVerifyResampleWorkspaceSize(20, 7) == 20 * 7 * 20  # 4 floats + 1 int
    assert lib.flashspecParamsLayout(5, (ctypes.c_size_t * 32)(), 32) == -1
    assert lib.flashspecErrorString(1) == b"invalid argument"
