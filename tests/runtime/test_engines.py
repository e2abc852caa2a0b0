"""The loop on TensorRT engines (``sessions.from_engines``): the tokens of onnxruntime on the same
export, with the FlashSpec plugins resolving the custom nodes. Needs full TensorRT and a GPU
(TensorRT-RTX engines do not run on data-centre GPUs); without them the refusal is checked.

The engines' record (``engines/engines.json``) and its verification run on CPU: TensorRT-RTX's
builder runs without a GPU, and ``engine_record.verify`` is what ``from_engines`` checks before
loading an engine."""

from __future__ import annotations

import collections
import dataclasses
import importlib.util
import json
import pathlib
import re
import shutil

import pytest
import torch

from flashspec_export.config import ConfigError
from flashspec_export.engine import build, plugins
from flashspec_export.export import engine_record
from flashspec_export.export import manifest as export_manifest
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate


@pytest.mark.skipif(
    importlib.util.find_spec("tensorrt") is not None, reason="TensorRT is installed"
)
def test_without_tensorrt_running_engines_is_refused_by_name(tiny_ngram_export):
    with pytest.raises(ConfigError, match="engines: running engines needs TensorRT"):
        sessions.from_engines(tiny_ngram_export, export_manifest.read(tiny_ngram_export))


@pytest.mark.trt
@pytest.mark.gpu
@pytest.mark.parametrize("draft", ["mtp", "ngram"])
def test_engines_emit_the_onnxruntime_tokens(tmp_path, draft):
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library {plugins.DEFAULT_LIBRARY}")
    export(ExportConfig(target="tiny-llama", draft=draft, out=str(tmp_path), batch=2, max_len=48))
    reports = build.build_engines(tmp_path)
    assert all(r.plugin_layers for n, r in reports.items() if n != "target_prefill")
    g = torch.Generator().manual_seed(0)
    prompt = torch.randint(0, 512, (2, 6), generator=g)
    args = (prompt, 12, 3, torch.tensor([0.0, 0.9]), torch.tensor([3, 4]))
    written = export_manifest.read(tmp_path)
    engines = generate(*sessions.from_engines(tmp_path, written), *args)
    onnx = generate(*sessions.from_export(tmp_path, written), *args)
    assert engines.tokens == onnx.tokens and engines.steps == onnx.steps


@pytest.fixture(scope="module")
def built(tmp_path_factory, tiny_ngram_export):
    """A copy of the tiny n-gram export with both engines built by TensorRT-RTX (CPU, function
    bodies)."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    out = tmp_path_factory.mktemp("engines") / "export"
    shutil.copytree(tiny_ngram_export, out)
    build.build_engines(out, function_bodies=True)
    return out


def _rtx() -> tuple[str, str]:
    import tensorrt_rtx

    return "tensorrt_rtx", tensorrt_rtx.__version__


def test_the_build_records_each_engine_with_its_source_and_tensorrt(built, monkeypatch):
    """engines.json names each engine with its SHA-256, the SHA-256 of the graph and weights it
    was built from, the TensorRT that built it and the plugins' use; a rebuild of one graph
    keeps the other's entry. Verifying hashes the engines, not the ONNX files the runtime never
    loads."""
    written = export_manifest.read(built)
    flavour, version = _rtx()

    def expected():
        engines = built / "engines"
        return {
            name: {
                "file": f"{name}.engine",
                "sha256": export_manifest.sha256(engines / f"{name}.engine"),
                "graph_sha256": graph.sha256,
                "data_sha256": graph.data_sha256,
                "flavour": flavour,
                "version": version,
                "plugins": False,
            }
            for name, graph in written.graphs.items()
        }

    def recorded():
        return json.loads((built / "engines" / engine_record.FILE_NAME).read_text())["engines"]

    assert recorded() == expected()
    prefill = recorded()["target_prefill"]
    build.build_engines(built, ["target_step"], force=True, function_bodies=True)
    assert recorded() == expected() and recorded()["target_prefill"] == prefill
    assert sorted(p.name for p in (built / "engines").iterdir()) == [
        "engines.json",
        "target_prefill.engine",
        "target_step.engine",
    ]

    hashed = collections.Counter()
    sha256 = export_manifest.sha256

    def counting_sha256(path):
        hashed[pathlib.Path(path).name] += 1
        return sha256(path)

    monkeypatch.setattr(export_manifest, "sha256", counting_sha256)
    paths = engine_record.verify(built, written, flavour, version)
    assert paths == {name: built / "engines" / f"{name}.engine" for name in written.graphs}
    assert hashed == {"target_prefill.engine": 1, "target_step.engine": 1}


def _refusal(directory, manifest, flavour, version) -> str:
    with pytest.raises(ConfigError) as error:
        engine_record.verify(directory, manifest, flavour, version)
    return str(error.value)


def test_stale_replaced_or_foreign_engines_are_refused_by_name(built, tmp_path):
    """Each refusal names the engine and says to rebuild: engine bytes changed since the build,
    an engine built from an earlier export's graph (the manifest's hash moved on), another
    TensorRT version or flavour than the runtime's, and an engines directory without a record
    (built before engines were recorded)."""
    out = tmp_path / "export"
    shutil.copytree(built, out)
    written = export_manifest.read(out)
    flavour, version = _rtx()
    rebuild = re.escape(engine_record.REBUILD)
    step = re.escape(str(out / "engines" / "target_step.engine"))

    engine = out / "engines" / "target_step.engine"
    intact = engine.read_bytes()
    engine.write_bytes(intact[:-1] + bytes([intact[-1] ^ 1]))
    message = _refusal(out, written, flavour, version)
    assert re.fullmatch(
        rf"engines: {step} does not match its record \(SHA-256\).*{rebuild}", message
    )
    engine.write_bytes(intact)
    engine_record.verify(out, written, flavour, version)  # as built: accepted

    for changed in ("sha256", "data_sha256"):  # a re-export: new graph, or new weights only
        graphs = dict(written.graphs)
        graphs["target_step"] = dataclasses.replace(graphs["target_step"], **{changed: "0" * 64})
        reexported = dataclasses.replace(written, graphs=graphs)
        message = _refusal(out, reexported, flavour, version)
        assert re.fullmatch(
            rf"engines: {step} was built from another export's target_step.onnx.*{rebuild}",
            message,
        )

    message = _refusal(out, written, flavour, "0.0.1")
    assert f"built by {flavour} {version}, this runtime has {flavour} 0.0.1" in message
    assert re.search(rebuild, message)
    message = _refusal(out, written, "tensorrt", version)
    assert f"this runtime has tensorrt {version}" in message

    (out / "engines" / engine_record.FILE_NAME).unlink()
    message = _refusal(out, written, flavour, version)
    assert re.fullmatch(
        rf"engines: .*engines\.json not found \(engines built before .*{rebuild}", message
    )
