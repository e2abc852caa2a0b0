"""Model and EAGLE drafters: greedy drafts of their own logits, exportable, and refused when
they do not match the target."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.config import TargetConfig
from flashspec_export.models.drafters import EagleDrafter, ModelDrafter

SMALL = TargetConfig("tiny-draft", "llama", 512, 32, 64, 1, 2, 1, 16, max_positions=256)


def _export_and_run(module, args):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    model = translation.export(module, args)
    assert [n.op_type for n in model.graph.node if n.domain == "flashspec"] == ["TiledArgmax"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, [a.numpy() for a in args], strict=True)))


def test_model_drafter_drafts_its_greedy_next_token():
    small = SMALL.build(seed=2)
    drafter = ModelDrafter(small, target_vocab_size=512)
    tokens = torch.randint(0, 512, (3, 5), generator=torch.Generator().manual_seed(0))
    k = torch.zeros(drafter.cache_shape(3, 16))
    last_row = torch.tensor([4, 2, 0])
    args = (tokens, torch.zeros(3, dtype=torch.int64), last_row, k, torch.zeros_like(k))
    with torch.no_grad():
        draft, *_ = drafter(*args)
        expected = small(tokens).logits[torch.arange(3), last_row].argmax(-1)
    assert torch.equal(draft, expected)
    np.testing.assert_array_equal(_export_and_run(drafter, args)[0], draft.numpy())


def test_model_drafter_with_another_vocabulary_is_refused():
    with pytest.raises(ValueError, match=r"vocabulary \(512\) differs from the target's \(1000\)"):
        ModelDrafter(SMALL.build(), target_vocab_size=1000)


def test_eagle_drafter_exports_and_drafts_the_same():
    drafter = EagleDrafter(TargetConfig.from_name("tiny-qwen").build(seed=0), seed=1)
    g = torch.Generator().manual_seed(3)
    k = torch.zeros(drafter.cache_shape(2, 8))
    args = (
        torch.randn(2, 1, 64, generator=g),
        torch.tensor([[3], [9]]),
        torch.tensor([2, 5]),
        torch.tensor([0, 0]),
        k,
        torch.zeros_like(k),
    )
    with torch.no_grad():
        draft, _, hidden, _, _ = drafter(*args)
        logits = drafter.norm(hidden)[:, 0] @ drafter.lm_head.T
    assert torch.equal(draft, logits.argmax(-1))
    np.testing.assert_array_equal(_export_and_run(drafter, args)[0], draft.numpy())
