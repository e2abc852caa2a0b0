"""One registry: op -> backend -> implementation.

Implementations are named by import path and loaded on first use, so a backend whose toolkit is
missing (Triton, CUDA) costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

OPS = ("verify_resample", "tiled_argmax")

# The faces every op has today; later backends add rows here.
IMPLEMENTATIONS: dict[str, dict[str, str]] = {
    "verify_resample": {
        "reference": "flashspec_export.reference.verify_resample:verify_resample",
        "standard": "flashspec_export.ops.standard:verify_resample",
        "triton": "flashspec_export.kernels.verify_resample:verify_resample",
        "cuda": "flashspec_export.ops.cuda:verify_resample",
    },
    "tiled_argmax": {
        "reference": "flashspec_export.reference.tiled_argmax:tiled_argmax",
        "standard": "flashspec_export.ops.standard:tiled_argmax",
        "triton": "flashspec_export.kernels.tiled_argmax:tiled_argmax",
        "cuda": "flashspec_export.ops.cuda:tiled_argmax",
    },
}


def backends(op: str) -> tuple[str, ...]:
    """Names of the backends registered for ``op``."""
    if op not in IMPLEMENTATIONS:
        raise ValueError(f"op: unknown op {op!r}; expected one of {', '.join(OPS)}")
    return tuple(IMPLEMENTATIONS[op])


def resolve(op: str, backend: str) -> Callable:
    """The implementation of ``op`` for ``backend`` (imported on first use)."""
    if backend not in backends(op):
        raise ValueError(
            f"backend: unknown backend {backend!r} for {op}; expected one of "
            f"{', '.join(backends(op))}"
        )
    module, name = IMPLEMENTATIONS[op][backend].split(":")
    return getattr(importlib.import_module(module), name)
