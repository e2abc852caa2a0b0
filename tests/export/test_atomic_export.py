"""An export is written whole or not at all: ``--force`` replaces the whole directory (no stale
graphs or engines of the previous export), and a real export killed midway leaves the previous
export intact and verifiable."""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import time

import pytest

pytest.importorskip("onnxscript")

from flashspec_export.export import manifest
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig

ROOT = pathlib.Path(__file__).parents[2]


def test_force_replaces_the_whole_directory(tmp_path, tiny_ngram_export):
    out = tmp_path / "x"
    shutil.copytree(tiny_ngram_export, out)
    (out / "drafter_mtp.onnx").write_bytes(b"a drafter graph of the previous export")
    (out / "engines").mkdir()
    (out / "engines" / "target_step.engine").write_bytes(b"old engine")
    export(ExportConfig(target="tiny-llama", draft="ngram", out=str(out), max_len=16, force=True))
    assert sorted(p.name for p in out.iterdir()) == [
        "manifest.json",
        "target_prefill.onnx",
        "target_step.onnx",
        "weights.data",
    ]  # the MTP graph and the engines of the previous export are gone
    manifest.verify(out, manifest.read(out))
    assert [p.name for p in tmp_path.iterdir()] == ["x"]  # no staging directory left


def test_an_export_killed_midway_leaves_the_previous_one_intact(tmp_path, tiny_ngram_export):
    out = tmp_path / "x"
    shutil.copytree(tiny_ngram_export, out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    command = [sys.executable, "scripts/export.py", "--target", "tiny-llama", "--draft", "mtp"]
    command += ["--max-len", "16"]
    process = subprocess.Popen(
        [*command, "--out", str(out), "--force"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    staged = []
    while time.monotonic() < deadline and process.poll() is None:
        staged = list(tmp_path.glob(".x.partial-*/*.onnx"))
        if staged:  # graphs are being written: kill it now
            break
        time.sleep(0.05)
    assert staged, "the export finished or never started writing before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    manifest.verify(out, manifest.read(out))
    assert manifest.read(out).drafter == "ngram"


def test_an_engine_build_killed_midway_leaves_the_engines_as_they_were(tmp_path):
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    from flashspec_export.engine.build import build_engines

    out = tmp_path / "x"
    export(ExportConfig(target="tiny-llama", draft="mtp", out=str(out), max_len=16))
    build_engines(out, ["target_prefill"], function_bodies=True)
    before = {p.name: p.read_bytes() for p in (out / "engines").iterdir()}
    assert sorted(before) == ["engines.json", "target_prefill.engine"]
    process = subprocess.Popen(
        [sys.executable, "scripts/build_engines.py", str(out), "--force", "--function-bodies"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None:
        if list(out.glob(".engines.partial-*/*.engine")):  # one engine built, more to come
            break
        time.sleep(0.01)
    assert process.poll() is None, "the build finished before it could be killed"
    process.send_signal(signal.SIGKILL)
    process.wait()
    assert {p.name: p.read_bytes() for p in (out / "engines").iterdir()} == before


def test_a_relative_checkpoint_path_is_recorded_absolute(tmp_path, monkeypatch):
    """The manifest's target must work from any directory (generate --check rebuilds the
    PyTorch modules from it)."""
    from flashspec_export.config import TargetConfig
    from flashspec_export.runtime import sessions

    TargetConfig.from_name("tiny-llama").build(seed=0).save_pretrained(tmp_path / "ckpt")
    monkeypatch.chdir(tmp_path)
    export(ExportConfig(target="ckpt", draft="ngram", out="o", max_len=16))
    recorded = manifest.read(tmp_path / "o").config["target"]
    assert recorded == str((tmp_path / "ckpt").resolve())
    monkeypatch.chdir(ROOT)
    target, _ = sessions.reference_of(manifest.read(tmp_path / "o"))
    assert target.max_len == 16
