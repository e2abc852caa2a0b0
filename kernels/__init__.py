"""Triton prototypes of the FlashSpec ops, one file per op.

Installed as ``flashspec_export.kernels`` (see pyproject.toml): the top-level import name
``kernels`` belongs to another, widely used package.

Needs Triton >= 3.6 (``MIN_TRITON``, the bound in pyproject.toml): the Hopper kernel is written
in Gluon, whose API first has every piece it uses in 3.6. Tried: 3.6, 3.7, 3.8, 3.9.
"""

import triton

MIN_TRITON = (3, 6)


def release(version: str) -> tuple[int, int]:
    """``(major, minor)`` of a version string such as ``"3.9.0"`` or ``"2.3.5"``."""
    major, minor = version.split(".")[:2]
    return int(major), int(minor)


if release(triton.__version__) < MIN_TRITON:
    raise ImportError(
        f"flashspec_export.kernels needs Triton >= {'.'.join(map(str, MIN_TRITON))} (its Hopper "
        f"kernel is written in Gluon); found triton {triton.__version__}: "
        "pip install 'triton>=3.6'"
    )
