"""The tiny trainer end to end on CPU, on a slice of the standard library: the losses fall, the
checkpoint exports through the real Hugging Face path with the trained MTP head, and that head's
drafts are accepted (several tokens per step at T = 0) with the text unchanged."""

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
from flashspec_export.training.tiny import TrainConfig, train

SMOKE = TrainConfig(
    vocab_size=512,
    hidden_size=64,
    intermediate_size=192,
    num_layers=2,
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
    out, report = trained
    assert report.target_loss[1] < report.target_loss[0] - 0.5
    assert report.mtp_loss[1] < report.mtp_loss[0] - 0.5
    assert report.held_out_loss < math.log(SMOKE.vocab_size)  # better than uniform
    for name in ("config.json", "model.safetensors", "tokenizer.json"):
        assert (out / "target" / name).is_file()
    assert set(torch.load(out / "mtp.pt")) and all(
        k.startswith(("enorm", "hnorm", "eh_proj", "layers")) for k in torch.load(out / "mtp.pt")
    )


def test_the_trained_pair_exports_and_its_drafts_are_accepted(trained, tmp_path):
    out, _ = trained
    config = ExportConfig(
        target=str(out / "target"),
        draft="mtp",
        out=str(tmp_path / "export"),
        draft_weights=str(out / "mtp.pt"),
        max_len=64,
    )
    export(config)
    prompt = torch.tensor([[corpus_id for corpus_id in range(3, 11)]])
    args = (prompt, 16, 3, torch.zeros(1), torch.zeros(1, dtype=torch.int64))
    onnx = generate(*sessions.from_export(tmp_path / "export"), *args)
    reference = generate(*sessions.reference_of(tmp_path / "export"), *args)
    assert onnx.tokens == reference.tokens
    assert onnx.mean_emitted > 1.5  # trained drafts are accepted: the multi-token path runs


def test_held_out_files_are_a_stable_tenth():
    files = corpus.stdlib_files()
    held = [f for f in files if corpus.is_held_out(f)]
    assert 0.05 < len(held) / len(files) < 0.15
    assert held == [f for f in files if corpus.is_held_out(f)]
