"""Triton prototypes of the FlashSpec ops, one file per op.

Installed as ``flashspec_export.kernels`` (see pyproject.toml): the top-level import name
``kernels`` belongs to another, widely used package.
"""
