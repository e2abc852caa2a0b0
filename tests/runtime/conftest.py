"""Fixtures of the runtime tests: a prompt with a repetition and the peaked tiny-llama
checkpoint (tiny.py)."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save_file

from flashspec_export.config import TargetConfig
from flashspec_export.models.build import SHARED_TENSORS, ExportConfig
from flashspec_export.models.drafters import EagleDrafter
from flashspec_export.models.mtp import MtpDrafter
from tests.runtime.tiny import BATCH, PEAKED_HEAD


@pytest.fixture(scope="module")
def prompt():
    prompt = torch.randint(0, 512, (BATCH, 6), generator=torch.Generator().manual_seed(0))
    prompt[:, 3:] = prompt[:, :3]  # a repetition the n-gram drafter can exploit
    return prompt


@pytest.fixture(scope="module")
def target_checkpoint(tmp_path_factory):
    """tiny-llama with a peaked LM head, saved as a checkpoint: as a draft model it drafts the
    target's own argmax, accepted with probability p(argmax) at T > 0."""
    path = tmp_path_factory.mktemp("tiny-llama-ckpt")
    model = TargetConfig.from_name("tiny-llama").build(seed=0)
    with torch.no_grad():
        model.lm_head.weight.mul_(PEAKED_HEAD)
    model.save_pretrained(path)
    # Random MTP / EAGLE heads as --draft-weights files (a checkpoint target requires them), the
    # heads build_modules would draw from the export's seed.
    for draft, head_cls in (("mtp", MtpDrafter), ("eagle", EagleDrafter)):
        head = head_cls(model, seed=ExportConfig().seed + 1).state_dict()
        own = {k: v.contiguous() for k, v in head.items() if not k.startswith(SHARED_TENSORS)}
        save_file(own, path / f"{draft}.safetensors")
    return str(path)
