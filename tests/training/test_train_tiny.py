"""The tiny trainer end to end on CPU, on a slice of the standard library: every loss falls,
the directory exports through the real Hugging Face path with each trained drafter, and the
MTP head's drafts are accepted (several tokens per step at T = 0) with the text unchanged."""

from __future__ import annotations

import math

import pytest
import torch

pytest.importorskip("tokenizers")
pytest.importorskip("onnxruntime")

from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime import sessions
from flashspec_export.runtime.loop import generate
from flashspec_export.training import corpus
from flashspec_export.training.tiny import HEAD_PREFIXES, TrainConfig, train

SMOKE = TrainConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    draft_hidden_size=32,
    draft_layers=1,
    seq_len=64,
    batch=8,
    steps=60,
    device="cpu",
    max_files=60,
)


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    out = tmp_path_factory.mktemp("stdlib-tiny")
    return out, train(SMOKE, out)


def test_losses_fall_and_the_files_are_written(trained):
    from safetensors.torch import load_file

    out, report = trained
    assert set(report.losses) == {"target", "mtp", "eagle", "draft"}
    for name, (first, last) in report.losses.items():
        assert last < first - (0.5 if name != "draft" else 0.1), (name, first, last)
    assert report.held_out_loss < math.log(SMOKE.vocab_size)  # better than uniform
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (out / "target" / name).is_file()
    assert (out / "draft" / "model.safetensors").is_file()
    for head in ("mtp", "eagle"):
        names = set(load_file(out / f"{head}.safetensors"))
        assert names and all(n.startswith(HEAD_PREFIXES) for n in names), names


def test_the_trained_pair_exports_and_its_drafts_are_accepted(trained, tmp_path):
    out, _ = trained
    config = ExportConfig(target=str(out), draft="mtp", out=str(tmp_path / "export"), max_len=64)
    manifest = export(config)  # a trained directory: the drafter's weights come with it
    assert manifest.config["draft_weights"] == str((out / "mtp.safetensors").resolve())
    assert manifest.tokenizer == "tokenizer"
    prompt = torch.tensor([[corpus_id for corpus_id in range(3, 11)]])
    args = (prompt, 16, 3, torch.zeros(1), torch.zeros(1, dtype=torch.int64))
    onnx = generate(*sessions.from_export(tmp_path / "export", manifest), *args)
    reference = generate(*sessions.reference_of(manifest), *args)
    assert onnx.tokens == reference.tokens
    assert onnx.mean_emitted > 1.5  # trained drafts are accepted: the multi-token path runs


def test_held_out_files_are_a_stable_tenth():
    files = corpus.stdlib_files()
    held = [f for f in files if corpus.is_held_out(f)]
    assert 0.05 < len(held) / len(files) < 0.15
    assert held == [f for f in files if corpus.is_held_out(f)]


@pytest.mark.parametrize("draft", ["eagle", "model"])
def test_the_other_trained_drafters_export(trained, tmp_path, draft):
    out, _ = trained
    config = ExportConfig(target=str(out), draft=draft, out=str(tmp_path / "e"), max_len=32)
    assert f"drafter_{draft}" in export(config).graphs
