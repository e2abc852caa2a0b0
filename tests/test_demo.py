"""The README's main command runs and its backends agree."""

from __future__ import annotations

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).parents[1]


def test_demo_script_runs_and_backends_agree():
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--batch", "3", "--gamma", "3", "--dtype", "bfloat16"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "backends agree on every token: True" in result.stdout
    assert "seq 2: emitted" in result.stdout


def test_demo_rejects_unknown_head():
    result = subprocess.run(
        [sys.executable, "scripts/demo.py", "--head", "gpt-9"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert result.returncode == 2 and "invalid choice: 'gpt-9'" in result.stderr
