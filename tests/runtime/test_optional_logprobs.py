"""Log-probabilities on request (issue 35): ``scripts/export.py --no-logprobs`` exports a target
step without the ``logprobs`` output whose VerifyResample node leaves it out (two outputs,
``return_logprobs = 0``, a function body without the log-sum-exp); onnxruntime then generates
the tokens of the PyTorch modules that return them. The default keeps today's graph and
manifest format."""

from __future__ import annotations

import dataclasses
import json

import onnx
import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import ExportConfig, build_modules
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate
from tests.runtime.tiny import GAMMA, SEEDS, TEMPERATURES, config_of

NEW_TOKENS = 16
LSE_OPS = ("Exp", "Log", "GatherElements")  # the body's log-sum-exp and l(y)


def _lse_ops(body) -> list[int]:
    """How many of each of ``LSE_OPS`` a body has (the sample has its own, per 64-id block)."""
    kinds = [n.op_type for n in body.node]
    return [kinds.count(op) for op in LSE_OPS]


@pytest.fixture(scope="module")
def lean_export(tmp_path_factory, target_checkpoint):
    """The peaked tiny-llama (drafts get accepted), n-gram drafter, exported without logprobs."""
    from flashspec_export.export.pipeline import export

    out = tmp_path_factory.mktemp("tiny-no-logprobs") / "export"
    export(dataclasses.replace(config_of("ngram", target_checkpoint, out), logprobs=False))
    return out


def _verify_node(directory) -> tuple[onnx.NodeProto, onnx.FunctionProto]:
    model = onnx.load(directory / "target_step.onnx", load_external_data=False)
    (node,) = [n for n in model.graph.node if n.op_type == "VerifyResample"]
    (body,) = [f for f in model.functions if f.name == "VerifyResample"]
    return node, body


def test_the_step_graph_has_no_logprobs_and_its_verify_no_lse(lean_export, tiny_ngram_export):
    manifest = export_manifest.read(lean_export)
    outputs = [o.name for o in manifest.graphs["target_step"].outputs]
    assert outputs[:3] == ["emitted", "num_emitted", "hidden"] and "logprobs" not in outputs
    assert manifest.config["logprobs"] is False and manifest.format == 7  # no new format
    node, body = _verify_node(lean_export)
    assert list(node.output) == ["emitted", "num_emitted"]
    assert {a.name: a.i for a in node.attribute}["return_logprobs"] == 0
    assert list(body.output) == ["tokens", "num_emitted"]
    lean = _lse_ops(body)
    # the default export is today's: three outputs, no attribute, the LSE in the body
    default = export_manifest.read(tiny_ngram_export)
    assert default.graphs["target_step"].outputs[2].name == "logprobs"
    assert sessions.step_logprobs(default) and not sessions.step_logprobs(manifest)
    node, body = _verify_node(tiny_ngram_export)
    assert len(node.output) == 3 and "return_logprobs" not in {a.name for a in node.attribute}
    assert [a - b for a, b in zip(_lse_ops(body), lean, strict=True)] == [1, 1, 1]
    # a manifest written before the flag (no config.logprobs) rebuilds modules with logprobs
    written = json.loads((tiny_ngram_export / export_manifest.FILE_NAME).read_text())
    del written["config"]["logprobs"]
    config = ExportConfig(**export_manifest.from_json(written).config)
    assert config.logprobs is True


def test_onnxruntime_without_logprobs_emits_the_tokens_of_the_modules_with_them(
    lean_export, prompt
):
    """fp32: tokens exact. The PyTorch modules with logprobs (today's step) and without them,
    and onnxruntime's step without them, generate the same tokens at γ = 3 and T in {0, 0.8, 1}."""
    manifest = export_manifest.read(lean_export)
    target, drafter = sessions.from_export(lean_export, manifest)
    assert not target.logprobs
    lean = generate(target, drafter, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS)
    results = [lean]
    for logprobs in (True, False):
        config = dataclasses.replace(ExportConfig(**manifest.config), logprobs=logprobs)
        modules = build_modules(config)
        target, drafter = sessions.from_modules(
            modules, "ngram", manifest.batch, manifest.max_len, dtype=torch.float32
        )
        assert target.logprobs is logprobs
        results.append(generate(target, drafter, prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS))
    for result in results[1:]:
        assert result.tokens == lean.tokens
        assert result.steps == lean.steps
    assert lean.mean_emitted > 1, "no draft was ever accepted: the case is vacuous"
