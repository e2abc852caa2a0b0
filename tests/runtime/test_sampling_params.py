"""Per-request top-k / top-p end to end (issue 35): the stdlib-tiny preset exported with
``--sampling-params`` takes top_k / top_p per sequence in its target step; onnxruntime and the
PyTorch modules it was made from give the same tokens, speculation keeps the text (γ = 0 and
γ = 3 alike), and an export without them, or a value out of range, is refused by name."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import sessions, text
from flashspec_export.runtime.loop import generate
from flashspec_export.runtime.run import RunConfig, run

PROMPTS = ("import os\nimport sys\n\n\ndef main(argv):\n    ", "for i in range(10):\n")


@pytest.fixture(scope="module")
def sampling_export(tmp_path_factory):
    """stdlib-tiny, n-gram drafter, fp32 (tokens exact against the modules), batch 2."""
    from flashspec_export.export.pipeline import export
    from flashspec_export.models.build import ExportConfig

    out = tmp_path_factory.mktemp("stdlib-tiny-sampling") / "export"
    config = ExportConfig(
        draft="ngram", out=str(out), batch=2, max_len=96, dtype="float32", sampling_params=True
    )
    export(config)
    return out


def test_the_manifest_and_step_graph_carry_the_sampling_params(sampling_export, tiny_ngram_export):
    """``sampling_params``, top_k int64 / top_p float after the seed; a default export has none,
    and a manifest without the field reads as one without them."""
    manifest = export_manifest.read(sampling_export)
    assert manifest.format == 7 and manifest.sampling_params == ("top_k", "top_p")
    inputs = manifest.graphs["target_step"].inputs
    assert [(i.name, i.dtype, i.shape) for i in inputs[-4:]] == [
        ("temperature", "FLOAT", (2,)),
        ("seed", "INT64", (2,)),
        ("top_k", "INT64", (2,)),
        ("top_p", "FLOAT", (2,)),
    ]
    default = export_manifest.read(tiny_ngram_export)
    assert default.format == 7 and default.sampling_params == ()
    assert default.config["sampling_params"] is False
    written = json.loads((tiny_ngram_export / export_manifest.FILE_NAME).read_text())
    del written["config"]["sampling_params"], written["sampling_params"]  # an earlier export's
    assert export_manifest.from_json(written).sampling_params == ()
    written |= dict(sampling_params=["top_p"])
    with pytest.raises(ConfigError, match=r"sampling_params: expected \[\] or \['top_k'"):
        export_manifest.from_json(written)


def test_top_k_top_p_give_the_pytorch_modules_tokens(sampling_export):
    """generate --top-k 20 --top-p 0.9 --check: onnxruntime's tokens and steps equal the PyTorch
    modules' (the reference rebuilt from the manifest takes the same top_k / top_p)."""
    config = RunConfig(
        str(sampling_export),
        new_tokens=24,
        temperature=1.0,
        seed=3,
        check=True,
        prompts=PROMPTS,
        top_k=20,
        top_p=0.9,
    )
    report = run(config)
    assert report.matches, report.first_difference
    assert all(len(t) == 24 for t in report.onnx.tokens)


def test_the_device_loop_gives_onnxruntime_text_under_top_k_top_p(sampling_export):
    """generate --device cpu --top-k 20 --top-p 0.9 (the device loop over the PyTorch modules):
    onnxruntime's tokens, which the truncation changes."""

    def tokens(device, **sampling):
        config = RunConfig(
            str(sampling_export), new_tokens=16, temperature=1.0, seed=3, prompts=PROMPTS,
            device=device, **sampling,
        )  # fmt: skip
        return run(config).onnx.tokens

    truncated = tokens("cpu", top_k=20, top_p=0.9)
    assert truncated == tokens(None, top_k=20, top_p=0.9)
    assert truncated != tokens("cpu")


def test_speculation_keeps_the_truncated_text(sampling_export):
    """Per-row top_k / top_p (row 0: top_k 1, i.e. greedy; row 1: top_k 40, top_p 0.8) at T = 1:
    γ = 3 emits the tokens of γ = 0 (the coupled rule under truncation), with drafts accepted;
    row 0's are the greedy tokens, and row 1's differ from untruncated sampling's."""
    manifest = export_manifest.read(sampling_export)
    target, _ = sessions.from_export(sampling_export, manifest)
    tokenizer = text.load_tokenizer(sampling_export, manifest)
    prompts = text.encode_prompts(tokenizer, list(PROMPTS))
    ones, seeds = torch.ones(2), torch.tensor([5, 6])
    top_k, top_p = torch.tensor([1, 40]), torch.tensor([1.0, 0.8])

    def tokens(gamma, temperature=ones, **sampling):
        return generate(target, NgramDrafter(), prompts, 32, gamma, temperature, seeds, **sampling)

    plain = tokens(0, top_k=top_k, top_p=top_p)
    speculative = tokens(3, top_k=top_k, top_p=top_p)
    assert speculative.tokens == plain.tokens
    assert speculative.mean_emitted > 1.0  # drafts were accepted: the case is not vacuous
    assert plain.tokens[0] == tokens(0, temperature=torch.zeros(2)).tokens[0]
    assert plain.tokens[1] != tokens(0).tokens[1]


# Builds an export's target step with the plugin library (its own process: the registry is
# global) and prints the engine's plugin layers.
_PLUGIN_BUILD = """
import sys
from flashspec_export.engine import build
report = build.build_engines(sys.argv[1], ["target_step"])["target_step"]
print("plugin_layers", *report.plugin_layers)
"""


def test_with_the_plugin_library_the_truncating_step_builds_its_plugin(request, tmp_path):
    """The --sampling-params step's VerifyResample (top_k, top_p among its 8 inputs) becomes
    the plugin layer of a TensorRT-RTX engine built on the CPU."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    from flashspec_export.engine import plugins

    if plugins.library_path() is None:
        pytest.skip("needs the plugin library (plugins/README.md)")
    export = shutil.copytree(request.getfixturevalue("sampling_export"), tmp_path / "export")
    command = [sys.executable, "-c", _PLUGIN_BUILD, str(export)]
    result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plugin_layers node_verify_resample" in result.stdout, result.stdout


def test_the_loop_refuses_sampling_params_a_step_does_not_take(tiny_ngram_export):
    manifest = export_manifest.read(tiny_ngram_export)
    target, drafter = sessions.from_export(tiny_ngram_export, manifest)
    prompt = [[1, 2, 3]]
    with pytest.raises(ConfigError, match="top_p: this target step takes no per-sequence top_k"):
        generate(target, drafter, prompt, 2, 1, torch.ones(1), torch.zeros(1).long(), top_p=0.5)
    with pytest.raises(ConfigError, match=r"--top-k: this export's target step takes no top_k"):
        run(RunConfig(str(tiny_ngram_export), new_tokens=2, top_k=5))


def test_the_engine_builder_builds_the_truncating_body_and_refuses_what_tensorrt_cannot(
    sampling_export, tmp_path, monkeypatch
):
    """Without the plugin library the target step builds from the function bodies: the
    truncating body needs no sort, so stdlib-tiny's 4096 tokens (past TensorRT's TopK limit,
    3840) build (about 10 s on a CPU). A skipped optional input is refused by name (TensorRT's
    parser refuses it), and with a plugin library that predates them the node's top_k / top_p
    are."""
    pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
    from flashspec_export.engine import build, plugins
    from flashspec_export.onnx import functions

    export = shutil.copytree(sampling_export, tmp_path / "export")  # the others run no engine
    reports = build.build_engines(export, ["target_step"], function_bodies=True)
    assert reports["target_step"].path.stat().st_size > 0
    assert reports["target_step"].plugin_layers == ()
    skips = functions.plugin_node("VerifyResample", ["h"] * 6 + ["", "p"], ["t", "n", "l"], 4096)
    with pytest.raises(ConfigError, match=r"skips its optional input top_k .* top_k \(0\)"):
        build._refuse_optional_inputs(export / "step.onnx", [skips], with_plugins=False)
    monkeypatch.setattr(plugins, "library_path", lambda: export / "stub.so")
    monkeypatch.setattr(plugins, "register", lambda trt, library: ["VerifyResample"])
    monkeypatch.setattr(plugins, "takes_optional_inputs", lambda trt: False)  # an older library
    with pytest.raises(ConfigError, match=r"optional inputs top_k, top_p .* library does not take"):
        build.build_engines(export, ["target_step"], force=True)
