"""The tiny-llama setup the runtime tests share: sizes, temperatures, seeds and the export
config of a drafter (fixtures: conftest.py)."""

from __future__ import annotations

import torch

from flashspec_export.models.build import ExportConfig

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
