"""scripts/export.py end to end on the tiny presets: graphs, manifest, checks and refusals."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.export import manifest as export_manifest  # noqa: E402
from flashspec_export.export.pipeline import export  # noqa: E402
from flashspec_export.models.build import ExportConfig  # noqa: E402

ROOT = pathlib.Path(__file__).parents[2]


def _script(*args):
    return _script_at("export.py", *args)


def _script_at(script, *args):
    return subprocess.run(
        [sys.executable, f"scripts/{script}", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("tiny-llama-mtp")
    result = _script("--target", "tiny-llama", "--draft", "mtp", "--out", str(out), "--force")
    assert result.returncode == 0, result.stderr
    return out


def test_main_command_writes_checked_graphs_and_a_manifest(exported):
    manifest = export_manifest.read(exported)
    assert set(manifest.graphs) == {"target_prefill", "target_step", "drafter_mtp"}
    assert manifest.vocab_size == 512 and manifest.gamma == 3 and manifest.drafter == "mtp"
    assert manifest.ops["VerifyResample"].plugin_version == "1"
    step_io = manifest.graphs["target_step"]
    assert [i.name for i in step_io.inputs][:2] == ["tokens", "positions"]
    assert step_io.outputs[0].shape == (1, "new_tokens")  # γ + 1: any γ (online selection)
    assert step_io.outputs[0].dtype == "INT64"
    for name, graph in manifest.graphs.items():
        model = onnx.load(exported / graph.file)
        onnx.checker.check_model(model, full_check=True)
        onnx.shape_inference.infer_shapes(model, check_type=True)
        custom = {n.op_type for n in model.graph.node if n.domain == "flashspec"}
        assert custom == (
            {"TiledArgmax"}
            if name == "drafter_mtp"
            else set()
            if name == "target_prefill"
            else {"VerifyResample"}
        )
        used = {name for node in model.graph.node for name in node.input}
        assert [i.name for i in model.graph.input if i.name not in used] == [], name
        ort.InferenceSession(str(exported / graph.file), providers=["CPUExecutionProvider"])


def test_existing_output_is_never_overwritten_silently(exported):
    before = {p.name: p.stat().st_mtime_ns for p in exported.iterdir()}
    result = _script("--target", "tiny-llama", "--out", str(exported))
    assert result.returncode == 2
    assert "exists and is not empty; pass --force" in result.stderr
    assert {p.name: p.stat().st_mtime_ns for p in exported.iterdir()} == before


def test_unknown_target_lists_the_presets(tmp_path):
    result = _script("--target", "gpt-9", "--out", str(tmp_path / "x"))
    assert result.returncode == 2
    assert "'gpt-9' is neither a preset (tiny-llama, tiny-qwen" in result.stderr


def test_checkpoint_directory_and_ngram(tmp_path):
    """A local HF checkpoint (tiny-qwen saved with save_pretrained) exports with --draft ngram:
    no drafter graph, and the manifest records the source."""
    from flashspec_export.config import TargetConfig

    checkpoint = tmp_path / "ckpt"
    TargetConfig.from_name("tiny-qwen").build(seed=3).save_pretrained(checkpoint)
    manifest = export(
        ExportConfig(
            target=str(checkpoint), draft="ngram", out=str(tmp_path / "o"), gamma=2, max_len=64
        )
    )
    assert set(manifest.graphs) == {"target_prefill", "target_step"}
    assert manifest.architecture == "qwen3" and manifest.source == str(checkpoint)


def test_unsupported_architecture_is_refused(tmp_path):
    import transformers

    checkpoint = tmp_path / "gpt2"
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    transformers.GPT2LMHeadModel(config).save_pretrained(checkpoint)
    with pytest.raises(ValueError, match="target: unsupported architecture 'gpt2'"):
        export(ExportConfig(target=str(checkpoint), out=str(tmp_path / "o")))
    assert not (tmp_path / "o").exists()


def _random_inputs(
    graph: export_manifest.Graph, vocab_size: int, new_tokens: int, seed: int
) -> dict:
    """Inputs for an exported graph from its manifest entry (dynamic axes = ``new_tokens``)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    values = {}
    for value in graph.inputs:
        shape = [d if isinstance(d, int) else new_tokens for d in value.shape]
        name = value.name
        if name == "tokens":
            values[name] = torch.randint(0, vocab_size, shape, generator=g)
        elif name == "positions":
            values[name] = torch.randint(0, 9, shape, generator=g)
        elif name == "last_row":
            values[name] = torch.randint(0, new_tokens, shape, generator=g)
        elif name == "seed":
            values[name] = torch.randint(0, 2**40, shape, generator=g)
        elif name == "temperature":
            values[name] = torch.full(shape, 0.9)
        else:  # hidden states and caches
            values[name] = torch.randn(shape, generator=g)
    return values


@pytest.mark.parametrize("graph", ["target_prefill", "target_step", "drafter_mtp"])
def test_polygraphy_onnxrt_matches_pytorch(exported, tmp_path, graph):
    """`polygraphy run --onnxrt` on each exported graph against outputs saved from the PyTorch
    modules it came from: tokens exactly (integers within 1e-5 are equal), floats within 1e-5
    absolute + 1e-5 relative. The prefill and drafter run at 5 new tokens (exported with 2)."""
    pytest.importorskip("polygraphy")
    import torch
    from polygraphy.comparator import RunResults
    from polygraphy.json import save_json

    from flashspec_export.models.build import build_modules

    manifest = export_manifest.read(exported)
    modules = build_modules(ExportConfig(**manifest.config))
    module = {
        "target_prefill": modules.target.step,
        "target_step": modules.target,
        "drafter_mtp": modules.drafter,
    }[graph]
    entry = manifest.graphs[graph]
    args = _random_inputs(entry, manifest.vocab_size, new_tokens=5, seed=5)
    with torch.no_grad():
        outputs = module(*args.values())
    names = [o.name for o in entry.outputs]
    save_json([{k: v.numpy() for k, v in args.items()}], tmp_path / "inputs.json")
    reference = RunResults()
    reference.add([dict(zip(names, (o.numpy() for o in outputs), strict=True))], "pytorch")
    reference.save(str(tmp_path / "pytorch.json"))
    command = ["polygraphy", "run", str(exported / entry.file), "--onnxrt"]
    command += ["--load-inputs", str(tmp_path / "inputs.json")]
    command += [
        "--load-outputs",
        str(tmp_path / "pytorch.json"),
        "--atol",
        "1e-5",
        "--rtol",
        "1e-5",
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False, timeout=300)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "PASSED" in result.stdout


def test_tensorrt_rtx_parses_every_graph_and_builds_engines(exported):
    """TensorRT-RTX (CPU) parses every exported graph (function bodies inlined where no plugin is
    registered), and scripts/build_engines.py (dynamic token axes profiled 1 .. max_len) builds
    an engine of each; a second run refuses to overwrite them."""
    trt = pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX")
    pytest.importorskip("polygraphy")
    manifest = export_manifest.read(exported)
    logger = trt.Logger(trt.Logger.ERROR)
    for graph in manifest.graphs.values():
        network = trt.Builder(logger).create_network(0)
        parser = trt.OnnxParser(network, logger)
        assert parser.parse_from_file(str(exported / graph.file)), [
            str(parser.get_error(i)) for i in range(parser.num_errors)
        ]
        assert network.num_layers > 10
    result = _script_at("build_engines.py", str(exported))
    assert result.returncode == 0, result.stderr[-3000:]
    for name in manifest.graphs:
        assert (exported / "engines" / f"{name}.engine").stat().st_size > 0
    again = _script_at("build_engines.py", str(exported), "--graphs", "target_step")
    assert again.returncode == 2 and "pass --force to rebuild" in again.stderr
    unknown = _script_at("build_engines.py", str(exported), "--graphs", "drafter_eagle")
    assert unknown.returncode == 2 and "drafter_eagle not in this export" in unknown.stderr


def test_tensorrt_rtx_builds_a_batched_target_step(tmp_path):
    """Batch 4: the shape at which an unfenced noise chain never finishes building."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX")
    pytest.importorskip("polygraphy")
    from flashspec_export.engine.build import build_engines

    export(
        ExportConfig(
            target="tiny-llama", draft="ngram", out=str(tmp_path), batch=4, max_len=64, gamma=4
        )
    )
    engines = build_engines(tmp_path, ["target_step"], function_bodies=True)
    assert engines["target_step"].path.stat().st_size > 0
    assert engines["target_step"].plugin_layers == ()  # the body, fenced, was built


def test_draft_weights_must_match_the_target(tmp_path):
    """MTP weights of another model (hidden size 96 instead of 64) are refused by name; matching
    weights are loaded."""
    import torch

    from flashspec_export.config import TargetConfig
    from flashspec_export.models.mtp import MtpDrafter

    other = TargetConfig("wide", "llama", 512, 96, 128, 1, 4, 2, 24).build(seed=0)
    torch.save(MtpDrafter(other).state_dict(), tmp_path / "wide.pt")
    with pytest.raises(ValueError, match=r"draft-weights: .* the drafter does not match"):
        export(
            ExportConfig(
                target="tiny-llama",
                out=str(tmp_path / "a"),
                draft_weights=str(tmp_path / "wide.pt"),
            )
        )
    own = MtpDrafter(TargetConfig.from_name("tiny-llama").build(seed=0), seed=9)
    weights = {k: v for k, v in own.state_dict().items() if k.startswith(("eh_proj", "layers"))}
    torch.save(weights, tmp_path / "own.pt")
    manifest = export(
        ExportConfig(
            target="tiny-llama", out=str(tmp_path / "b"), draft_weights=str(tmp_path / "own.pt")
        )
    )
    assert "drafter_mtp" in manifest.graphs


@pytest.mark.parametrize(
    ("draft", "extra", "graph"),
    [
        ("eagle", [], "drafter_eagle"),
        ("model", ["--draft-model", "tiny-draft-llama"], "drafter_model"),
    ],
)
def test_eagle_and_model_drafters_export(tmp_path, draft, extra, graph):
    result = _script("--target", "tiny-llama", "--draft", draft, *extra, "--out", str(tmp_path))
    assert result.returncode == 0, result.stderr
    manifest = export_manifest.read(tmp_path)
    assert set(manifest.graphs) == {"target_prefill", "target_step", graph}
    model = onnx.load(tmp_path / manifest.graphs[graph].file)
    onnx.checker.check_model(model, full_check=True)
    assert {n.op_type for n in model.graph.node if n.domain == "flashspec"} == {"TiledArgmax"}


def test_model_drafter_needs_a_draft_model(tmp_path):
    result = _script("--target", "tiny-llama", "--draft", "model", "--out", str(tmp_path / "o"))
    assert result.returncode == 2 and "--draft model needs --draft-model" in result.stderr


def test_large_graphs_go_to_external_data(tmp_path, monkeypatch):
    """Graphs over the protobuf limit are saved with external data (the limit is lowered here so
    that the tiny preset crosses it); onnxruntime loads them from the directory."""
    from flashspec_export.export import pipeline

    monkeypatch.setattr(pipeline, "EXTERNAL_DATA_BYTES", 100_000)
    manifest = export(
        ExportConfig(target="tiny-llama", draft="ngram", out=str(tmp_path), max_len=64)
    )
    step = manifest.graphs["target_step"]
    assert step.external_data and (tmp_path / "target_step.onnx.data").is_file()
    data_bytes = (tmp_path / "target_step.onnx.data").stat().st_size
    assert data_bytes > (tmp_path / "target_step.onnx").stat().st_size  # the weights moved out
    onnx.checker.check_model(str(tmp_path / "target_step.onnx"), full_check=True)
    ort.InferenceSession(str(tmp_path / "target_step.onnx"), providers=["CPUExecutionProvider"])
