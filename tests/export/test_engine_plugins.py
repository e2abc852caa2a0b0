"""Engine builds with the FlashSpec plugin library: TensorRT-RTX (CPU) resolves the exported
``flashspec`` nodes to the plugins' PLUGIN_V3 layers, and a node that falls back to its function
body fails the build. Each build runs in its own process (the plugin registry is global)."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

from flashspec_export.config import ConfigError
from flashspec_export.engine import build, plugins
from flashspec_export.export import manifest
from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig

ROOT = pathlib.Path(__file__).parents[2]
HOW = "cmake -S plugins -B plugins/build -DTENSORRT_INCLUDE_DIR=<TensorRT 10.16+>/include"


def _script(*args):
    command = [sys.executable, "scripts/build_engines.py", *map(str, args)]
    return subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def exported_mtp(tmp_path_factory):
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library: {HOW}")
    out = tmp_path_factory.mktemp("engine-plugins")
    export(ExportConfig(target="tiny-llama", draft="mtp", out=str(out), batch=2, max_len=32))
    return out


def test_flashspec_nodes_become_plugin_layers(exported_mtp):
    result = _script(exported_mtp, "--graphs", "target_step", "drafter_mtp")
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(": ", 1) for line in result.stdout.splitlines())
    assert "plugins: node_verify_resample" in lines["target_step"]
    assert "plugins: node_tiled_argmax" in lines["drafter_mtp"]
    bodies = _script(exported_mtp, "--graphs", "target_step", "--force", "--function-bodies")
    assert bodies.returncode == 0, bodies.stderr[-3000:]
    assert "plugins: none (function bodies inlined)" in bodies.stdout


def test_a_node_that_falls_back_to_its_body_fails_the_build(exported_mtp, tmp_path):
    """plugin_version "3" matches no registered creator: the parser inlines the body, and the
    build must say so instead of silently building the materialised path."""
    import shutil

    import onnx

    shutil.copytree(exported_mtp, tmp_path / "export", ignore=shutil.ignore_patterns("engines"))
    path = tmp_path / "export" / "target_step.onnx"
    model = onnx.load(str(path))
    node = next(n for n in model.graph.node if n.domain == plugins.PLUGIN_NAMESPACE)
    next(a for a in node.attribute if a.name == "plugin_version").s = b"3"
    onnx.save(model, str(path))
    entries = json.loads((path.parent / "manifest.json").read_text())  # an export made so
    entries["graphs"]["target_step"]["sha256"] = manifest.sha256(path)
    (path.parent / "manifest.json").write_text(json.dumps(entries))
    result = _script(tmp_path / "export", "--graphs", "target_step")
    assert result.returncode != 0
    assert "1 flashspec node(s) but 0 plugin layer(s)" in result.stderr


# One VerifyResample node without logprobs, parsed with the plugin library and built (its own
# process: the registry is global); prints the plugin layer's outputs and the network's.
_LEAN_VERIFY = """
import tensorrt_rtx as trt
from onnx import TensorProto
from flashspec_export.engine import plugins
from flashspec_export.onnx import functions

plugins.register(trt, plugins.library_path())
log = trt.Logger(trt.Logger.ERROR)
builder = trt.Builder(log)
network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
parser = trt.OnnxParser(network, log)
model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, 1000, outputs=())
assert parser.parse(model.SerializeToString()), parser.get_error(0)
layers = [network.get_layer(i) for i in range(network.num_layers)]
print("layers", *[f"{layer.type.name}:{layer.num_outputs}" for layer in layers])
print("outputs", *[network.get_output(i).name for i in range(network.num_outputs)])
config = builder.create_builder_config()
profile = builder.create_optimization_profile()
shapes = dict(hidden=(4, 4, 64), lm_head=(1024, 64), draft_tokens=(4, 3))
shapes |= dict(temperature=(4,), seed=(4,), positions=(4,))
for name, shape in shapes.items():
    profile.set_shape(name, shape, shape, shape)
config.add_optimization_profile(profile)
engine = builder.build_serialized_network(network, config)
print("engine", engine is not None and b"return_logprobs" in bytes(engine))
"""


def test_a_verify_node_without_logprobs_builds_a_two_output_plugin_engine():
    """The node's return_logprobs = 0 reaches the plugin (a plugin that ignored it reports three
    outputs, which the parser refuses for a node of two: "Node has more output tensors than TRT
    expected"), the engine builds on the CPU and serializes the field. TensorRT-RTX engines do
    not run here (no RTX GPU): the kernels' skipped LSE is tested through the C ABI."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library: {HOW}")
    command = [sys.executable, "-c", _LEAN_VERIFY]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines())
    assert lines["layers"] == "PLUGIN_V3:2"
    assert lines["outputs"] == "tokens num_emitted"
    assert lines["engine"] == "True"


# One VerifyResample node with the optional inputs argv[1] (comma-separated), parsed with the
# plugin library and built on the CPU (its own process: the registry is global); prints the
# plugin layer's inputs, whether the parse succeeded (and the error) and the engine's field.
_TRUNCATING_VERIFY = """
import sys
import tensorrt_rtx as trt
from onnx import TensorProto
from flashspec_export.engine import plugins
from flashspec_export.onnx import functions
from flashspec_export.reference import truncation

optional = tuple(a for a in sys.argv[1].split(",") if a)
plugins.register(trt, plugins.library_path())
log = trt.Logger(trt.Logger.ERROR)
builder = trt.Builder(log)
network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
parser = trt.OnnxParser(network, log)
model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, 1000, optional)
parsed = parser.parse(model.SerializeToString())
errors = [str(parser.get_error(i)).replace(chr(10), " ") for i in range(parser.num_errors)]
print("parsed", parsed, *errors)
print("takes", plugins.takes_optional_inputs(trt), *plugins.creator_fields(trt, "VerifyResample"))
if not parsed:
    sys.exit(0)
layers = [network.get_layer(i) for i in range(network.num_layers)]
print("layers", *[f"{layer.type.name}:{layer.num_inputs}" for layer in layers])
config = builder.create_builder_config()
profile = builder.create_optimization_profile()
shapes = dict(hidden=(4, 4, 64), lm_head=(1024, 64), draft_tokens=(4, 3))
shapes |= dict(temperature=(4,), seed=(4,), positions=(4,), top_k=(4,), top_p=(4,))
shapes |= dict(allowed_tokens=(4, 4, truncation.words_for(1000)))
for i in range(network.num_inputs):
    name = network.get_input(i).name
    profile.set_shape(name, shapes[name], shapes[name], shapes[name])
config.add_optimization_profile(profile)
engine = builder.build_serialized_network(network, config)
print("engine", engine is not None and b"optional_inputs" in bytes(engine))
"""


@pytest.mark.parametrize(
    "optional",
    [("top_k",), ("top_k", "top_p"), ("top_k", "top_p", "allowed_tokens")],
    ids=["top_k", "top_k+top_p", "all"],
)
def test_a_verify_node_with_truncation_builds_a_plugin_engine(optional):
    """A node with a prefix of its optional inputs (top_k, top_p, allowed_tokens) parses to one
    PLUGIN_V3 layer taking them (the plugin tells them apart by count and type), and the engine
    builds on the CPU with the plugin's optional_inputs field serialized (enqueue has no input
    count: the engine must remember it)."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library: {HOW}")
    command = [sys.executable, "-c", _TRUNCATING_VERIFY, ",".join(optional)]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in result.stdout.splitlines() if " " in line)
    assert lines["parsed"] == "True", result.stdout[-3000:]
    assert lines["layers"] == f"PLUGIN_V3:{6 + len(optional)}"
    assert lines["takes"] == "True vocab_size num_splits return_logprobs optional_inputs"
    assert lines["engine"] == "True"


# Parse an exported graph with the plugin library (its own process); print each plugin layer's
# type and its inputs' names.
_PARSE_EXPORT = """
import sys
import tensorrt_rtx as trt
from flashspec_export.engine import plugins

plugins.register(trt, plugins.library_path())
log = trt.Logger(trt.Logger.ERROR)
strongly_typed = 1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED)
network = trt.Builder(log).create_network(strongly_typed)
parser = trt.OnnxParser(network, log)
assert parser.parse_from_file(sys.argv[1]), parser.get_error(0)
for i in range(network.num_layers):
    layer = network.get_layer(i)
    if layer.type == trt.LayerType.PLUGIN_V3:
        print("plugin", *[layer.get_input(j).name for j in range(layer.num_inputs)])
"""


def test_an_exported_target_step_with_sampling_params_parses_to_the_plugin(tmp_path):
    """scripts/export.py --sampling-params: the target step's VerifyResample node with top_k and
    top_p becomes one PLUGIN_V3 layer of 8 inputs, the graph's top_k / top_p among them (not
    its function body, which would leave no plugin layer)."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library: {HOW}")
    config = ExportConfig(
        target="tiny-llama", draft="ngram", out=str(tmp_path), batch=2, max_len=32
    )
    export(dataclasses.replace(config, sampling_params=True))
    command = [sys.executable, "-c", _PARSE_EXPORT, str(tmp_path / "target_step.onnx")]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    layers = [line.split()[1:] for line in result.stdout.splitlines() if line.startswith("plugin ")]
    assert len(layers) == 1 and len(layers[0]) == 8, result.stdout
    assert layers[0][-2:] == ["top_k", "top_p"]


def test_a_skipped_optional_input_before_a_given_one_does_not_reach_the_plugin():
    """The TensorRT-RTX parser keeps an empty (skipped) optional input's place and hands the
    plugin a null tensor there (measured: typed float; were the plugin to take it, addPluginV3
    refuses it, "(input) != nullptr"): a node for TensorRT gives a prefix of top_k, top_p,
    allowed_tokens (top_k = 0 and top_p = 1 are off), as for the function body."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    if plugins.library_path() is None:
        pytest.skip(f"needs the plugin library: {HOW}")
    command = [sys.executable, "-c", _TRUNCATING_VERIFY, "top_p"]
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    parsed = next(line for line in result.stdout.splitlines() if line.startswith("parsed "))
    assert parsed.startswith("parsed False") and "VerifyResample" in parsed, parsed
    assert "inputs 7 to 9 must be some of top_k (int64), top_p (float)" in result.stdout


def test_full_tensorrt_without_the_library_is_refused(monkeypatch, tiny_ngram_export):
    """Full TensorRT would silently inline the bodies: without the library the build stops
    before anything is written, and says how to get the library or ask for the bodies."""
    monkeypatch.setattr(build, "tensorrt_flavour", lambda: "tensorrt")
    monkeypatch.setattr(plugins, "library_path", lambda: None)
    with pytest.raises(ConfigError, match=r"plugins: TensorRT needs the FlashSpec plugin library"):
        build.build_engines(tiny_ngram_export)
    assert not (tiny_ngram_export / "engines").exists()


def test_a_plugin_library_path_that_names_no_file_is_an_error(monkeypatch, tmp_path):
    monkeypatch.setenv(plugins.LIBRARY_ENV, str(tmp_path / "missing.so"))
    with pytest.raises(ConfigError, match=r"FLASHSPEC_PLUGINS_LIB: .*missing.so is not a file"):
        plugins.library_path()
