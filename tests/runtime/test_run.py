"""``runtime.run`` (``scripts/generate.py``): the manifest read once and handed down, each file
hashed once, and ``--check`` refusing a reference whose weights are not the export's before
anything is generated (issue 33)."""

from __future__ import annotations

import collections
import json
import pathlib
import re

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("onnxruntime")

from flashspec_export.config import ConfigError, TargetConfig
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime import run as run_module
from flashspec_export.runtime.run import RunConfig, run
from tests.runtime.tiny import with_tokenizer


def _export_of_a_checkpoint(
    tmp_path: pathlib.Path, tiny_ngram_export
) -> tuple[pathlib.Path, pathlib.Path]:
    """(export, checkpoint): the shared tiny-llama n-gram export as an export of a checkpoint
    directory. The tiny-llama preset's weights are drawn from the export's seed, so a checkpoint
    saved from them holds the same weights: the copy's manifest names the checkpoint instead of
    exporting again (~10 s). It borrows the stdlib-tiny tokenizer (whose ids cover the tiny
    model's 512) for text prompts."""
    checkpoint = tmp_path / "checkpoint"
    TargetConfig.from_name("tiny-llama").build(seed=ExportConfig().seed).save_pretrained(checkpoint)
    out = with_tokenizer(tiny_ngram_export, tmp_path / "export")
    written = json.loads((out / export_manifest.FILE_NAME).read_text())
    written["config"]["target"] = written["source"] = str(checkpoint)
    (out / export_manifest.FILE_NAME).write_text(json.dumps(written))
    return out, checkpoint


def test_a_run_reads_the_manifest_once_and_hashes_each_file_once(
    tmp_path, tiny_ngram_export, monkeypatch
):
    """generate --check with a text prompt and a stop string: one read of manifest.json, handed
    to the sessions, the tokenizer and the reference, and each graph file hashed once (it was
    read four times and every graph hashed twice)."""
    out, _ = _export_of_a_checkpoint(tmp_path, tiny_ngram_export)
    reads, hashed = [], collections.Counter()
    read, sha256 = export_manifest.read, export_manifest.sha256

    def counting_read(directory):
        reads.append(directory)
        return read(directory)

    def counting_sha256(path):
        hashed[pathlib.Path(path).name] += 1
        return sha256(path)

    monkeypatch.setattr(export_manifest, "read", counting_read)
    monkeypatch.setattr(export_manifest, "sha256", counting_sha256)
    config = RunConfig(str(out), new_tokens=4, check=True, prompts=("def f(x):",), stop=("\n\n",))
    report = run(config)
    assert report.matches and report.texts is not None
    assert len(reads) == 1
    assert hashed == {"target_prefill.onnx": 1, "target_step.onnx": 1, "weights.data": 1}


def test_check_refuses_a_reference_whose_weights_are_not_the_exports(
    tmp_path, tiny_ngram_export, monkeypatch
):
    """The checkpoint as exported is the reference; one weight changed in place (retrained
    there), or the checkpoint moved, is refused by name before anything is generated (it was
    found out after the run, or not at all: the tokens were compared with other weights)."""
    from safetensors.torch import load_file, save_file

    out, checkpoint = _export_of_a_checkpoint(tmp_path, tiny_ngram_export)
    config = RunConfig(str(out), new_tokens=4, check=True)
    assert run(config).matches  # the weights the export was made from
    generated = []
    monkeypatch.setattr(run_module, "generate", lambda *args, **kwargs: generated.append(args))

    weights = checkpoint / "model.safetensors"
    state = load_file(weights)
    name = sorted(state)[0]
    state[name] = state[name].clone()
    state[name].view(-1)[0] += torch.tensor(1e-3, dtype=state[name].dtype)
    save_file(state, weights, metadata={"format": "pt"})
    where = re.escape(str(checkpoint))
    with pytest.raises(ConfigError, match=rf"check: the weights at {where} differ from those the"):
        run(config)

    checkpoint.rename(tmp_path / "moved")
    with pytest.raises(ConfigError, match=rf"check: .* cannot be rebuilt \(target: '{where}' is"):
        run(config)
    assert generated == []
