"""scripts/export.py end to end on the tiny presets: graphs, manifest, checks and refusals."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.export import manifest as export_manifest  # noqa: E402
from flashspec_export.export.pipeline import export  # noqa: E402
from flashspec_export.export.weights import INLINE_BYTES  # noqa: E402
from flashspec_export.models.build import SHARED_TENSORS, ExportConfig  # noqa: E402

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
    assert manifest.ops["VerifyResample"].plugin_version == "2"
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
    from flashspec_export.runtime.sessions import cache_layout

    manifest = export_manifest.read(exported)
    modules = build_modules(ExportConfig(**manifest.config))
    module = {
        "target_prefill": modules.target.step,
        "target_step": modules.target,
        "drafter_mtp": modules.drafter,
    }[graph]
    entry = manifest.graphs[graph]
    args = _random_inputs(entry, manifest.vocab_size, new_tokens=5, seed=5)
    # the modules take each per-layer cache run (k_cache_0 .. k_cache_<L-1>) as one list
    grouped = [
        args[e] if isinstance(e, str) else [args[n] for n in e[1]] for e in cache_layout(list(args))
    ]
    with torch.no_grad():
        results = module(*grouped)
    outputs = [t for r in results for t in (r if isinstance(r, list) else [r])]
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

    def export_with(state: dict, name: str):
        path = tmp_path / f"{name}.pt"
        torch.save(state, path)
        out = str(tmp_path / name)
        return export(ExportConfig(target="tiny-llama", out=out, draft_weights=str(path)))

    other = TargetConfig("wide", "llama", 512, 96, 128, 1, 4, 2, 24).build(seed=0)
    with pytest.raises(ValueError, match=r"draft-weights: .* the drafter does not match"):
        export_with(MtpDrafter(other).state_dict(), "wide")
    own = MtpDrafter(TargetConfig.from_name("tiny-llama").build(seed=0), seed=9)
    weights = {k: v for k, v in own.state_dict().items() if not k.startswith(SHARED_TENSORS)}
    assert {k.split(".")[0] for k in weights} == {"enorm", "hnorm", "eh_proj", "layers"}
    assert "drafter_mtp" in export_with(weights, "own").graphs
    # A partial head (no enorm / hnorm) would draft from random norms: refused by name.
    partial = {k: v for k, v in weights.items() if k.startswith(("eh_proj", "layers"))}
    with pytest.raises(ValueError, match=r"lacks 2 of the head's own tensors.*enorm.weight"):
        export_with(partial, "partial")


@pytest.mark.parametrize("draft", ["mtp", "eagle"])
def test_a_checkpoint_target_needs_the_heads_weights(tmp_path, draft):
    """On a real checkpoint a head without --draft-weights would be random (1.00 tokens per
    step): refused, naming the argument, before any weights are loaded. Presets (random
    weights throughout) keep drafting from a random head."""
    from flashspec_export.config import TargetConfig

    TargetConfig.from_name("tiny-llama").build(seed=0).save_pretrained(tmp_path / "ckpt")
    config = ExportConfig(target=str(tmp_path / "ckpt"), draft=draft, out=str(tmp_path / "o"))
    with pytest.raises(ValueError, match=rf"draft-weights: --draft {draft} on the checkpoint"):
        export(config)
    assert not (tmp_path / "o").exists()


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


def _external_bytes(path: pathlib.Path) -> dict[tuple[str, int], int]:
    """(location, offset) -> length of every external initializer of the graph at ``path``."""
    model = onnx.load(path, load_external_data=False)
    refs = {}
    for tensor in model.graph.initializer:
        if tensor.data_location == onnx.TensorProto.EXTERNAL:
            info = {entry.key: entry.value for entry in tensor.external_data}
            refs[(info["location"], int(info["offset"]))] = int(info["length"])
    return refs


def test_graphs_share_one_weights_file(exported):
    """Every graph's large initializers live in the one weights.data: the target's weights that
    prefill and step both use, and the embeddings / LM head the MTP drafter shares, are written
    once; the graph files hold only the graph."""
    manifest = export_manifest.read(exported)
    weights = exported / "weights.data"
    refs = {name: _external_bytes(exported / g.file) for name, g in manifest.graphs.items()}
    assert {g.data_file for g in manifest.graphs.values()} == {"weights.data"}
    assert all(r and {loc for loc, _ in r} == {"weights.data"} for r in refs.values())
    written = {ref: n for r in refs.values() for ref, n in r.items()}
    # Shared: the graphs reference fewer bytes in the file than they hold between them.
    assert sum(written.values()) < sum(sum(r.values()) for r in refs.values())
    assert weights.stat().st_size >= max(o + n for (_, o), n in written.items())
    assert max(refs["target_prefill"].values()) >= 512 * 64 * 4  # the embedding table
    for name, graph in manifest.graphs.items():
        inline = onnx.load(exported / graph.file, load_external_data=False).graph.initializer
        assert all(len(t.raw_data) < INLINE_BYTES for t in inline), name


class _Tables(torch.nn.Module):
    """Three 1 GiB embedding tables: 3 GiB of initializers, over protobuf's 2 GiB."""

    def __init__(self):
        super().__init__()
        rows, width = 2**16, 2**12  # 2**28 fp32 = 1 GiB each
        self.tables = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(rows, width), requires_grad=False) for _ in range(3)
        )
        for i, table in enumerate(self.tables):
            table.data[rows - 1 - i] = i + 1.0  # one marked row in each, at either end of it

    def forward(self, ids):  # [N] int64 -> [N, 4096]
        return sum(torch.nn.functional.embedding(ids, t) for t in self.tables)


def test_an_export_over_2_gib_is_saved_checked_and_runs(tmp_path):
    """The > 2 GiB path for real (no lowered threshold): a graph with 3 GiB of initializers is
    exported the way the pipeline exports (weights file, then the checker from the path), and
    onnxruntime reads back the marked rows from the far end of the file."""
    from flashspec_export.export.pipeline import _save
    from flashspec_export.export.weights import WeightsFile
    from flashspec_export.onnx import translation

    module = _Tables().eval()
    ids = torch.tensor([2**16 - 1, 2**16 - 2, 2**16 - 3, 0])
    with WeightsFile(tmp_path) as weights:
        proto = translation.export(module, (ids,), weights)
        _save(proto, tmp_path / "tables.onnx")
    del module
    assert weights.size >= 3 * 2**30 and weights.tensors == 3
    assert (tmp_path / "tables.onnx").stat().st_size < 2**20
    session = ort.InferenceSession(
        str(tmp_path / "tables.onnx"), providers=["CPUExecutionProvider"]
    )
    (out,) = session.run(None, {session.get_inputs()[0].name: ids.numpy()})
    assert out.shape == (4, 2**12)
    assert [float(v) for v in out[:, 0]] == [1.0, 2.0, 3.0, 0.0]
    assert (out == out[:, :1]).all()
