"""The tiny-llama setup the runtime tests share: sizes, temperatures, seeds and the export
config of a drafter (fixtures: conftest.py)."""

from __future__ import annotations

import json
import pathlib
import shutil

import torch

from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import ExportConfig, resolve_trained

GAMMA, NEW_TOKENS, BATCH, MAX_LEN = 3, 12, 3, 48
TEMPERATURES = torch.tensor([0.0, 0.8, 1.0])
SEEDS = torch.tensor([5, 6, 7])


# Random tiny-llama logits are nearly flat (p(argmax) ~ 0.003), so sampled drafts would almost
# never be accepted; an LM head scaled by 100 makes p(argmax) ~ 0.9 at T = 1 (0.83 at T = 1.5).
PEAKED_HEAD = 100.0


def config_of(draft, target, out="unused", gamma=GAMMA):
    return ExportConfig(
        target=target,
        draft=draft,
        out=str(out),
        draft_model=target if draft == "model" else None,
        # the random heads the target_checkpoint fixture writes beside the checkpoint
        draft_weights=f"{target}/{draft}.safetensors" if draft in ("mtp", "eagle") else None,
        gamma=gamma,
        batch=BATCH,
        max_len=MAX_LEN,
    )


def with_tokenizer(export_dir: pathlib.Path, out: pathlib.Path) -> pathlib.Path:
    """A copy of the tiny-llama export ``export_dir`` at ``out`` that carries the stdlib-tiny
    tokenizer, for text prompts: its ids cover the tiny model's 512 (prompts must encode below
    512; generated ids decode)."""
    shutil.copytree(export_dir, out)
    tokenizer = pathlib.Path(resolve_trained(ExportConfig()).target)
    (out / "tokenizer").mkdir()
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copyfile(tokenizer / name, out / "tokenizer" / name)
    written = json.loads((out / export_manifest.FILE_NAME).read_text())
    written["tokenizer"] = "tokenizer"
    (out / export_manifest.FILE_NAME).write_text(json.dumps(written))
    return out
