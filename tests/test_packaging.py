"""pyproject.toml installs every subpackage (a non-editable install ships only those listed)."""

from __future__ import annotations

import pathlib

import pytest

tomllib = pytest.importorskip("tomllib", reason="Python >= 3.11")

ROOT = pathlib.Path(__file__).parents[1]


def test_every_subpackage_is_listed():
    listed = set(
        tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]
    )
    found = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for init in (ROOT / "flashspec_export").rglob("__init__.py")
    }
    assert found <= listed, sorted(found - listed)
    assert "flashspec_export.kernels" in listed  # mapped from the top-level kernels/ folder
