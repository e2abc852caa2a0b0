"""One registry: op -> backend -> implementation, derived from the op specs (``ops/specs.py``).

Implementations are named by import path and loaded on first use, so a backend whose toolkit is
missing (Triton, CUDA) costs nothing until it is asked for.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from flashspec_export.ops.specs import SPECS

OPS = tuple(SPECS)
IMPLEMENTATIONS: dict[str, dict[str, str]] = {name: dict(s.backends) for name, s in SPECS.items()}


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
