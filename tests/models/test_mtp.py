"""The MTP drafter: its draft is the argmax of its own logits, and it exports to a graph that
onnxruntime runs with identical drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.config import TargetConfig
from flashspec_export.models.mtp import MtpDrafter


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen"])
def drafter(request):
    return MtpDrafter(TargetConfig.from_name(request.param).build(seed=0), seed=1)


def _inputs(drafter, n=4, max_len=16):
    g = torch.Generator().manual_seed(2)
    hidden = torch.randn(n, 1, drafter.eh_proj.out_features, generator=g)
    tokens = torch.randint(0, drafter.vocab_size, (n, 1), generator=g)
    k = torch.zeros(drafter.cache_shape(n, max_len))
    return hidden, tokens, torch.tensor([1, 4, 2, 7]), k, torch.zeros_like(k)


def test_draft_is_the_argmax_of_the_shared_head(drafter):
    with torch.no_grad():
        draft, max_logit, hidden, k, _ = drafter(*_inputs(drafter))
        logits = drafter.norm(hidden)[:, -1] @ drafter.lm_head.T
    assert torch.equal(draft, logits.argmax(dim=-1))
    torch.testing.assert_close(max_logit, logits.max(dim=-1).values)
    assert bool((k[0, 0, :, 1] != 0).any()) and bool((k[0, 0, :, 2:] == 0).all())


def test_mtp_shares_the_target_weights_and_owns_its_layer():
    model = TargetConfig.from_name("tiny-llama").build(seed=0)
    drafter = MtpDrafter(model, seed=1)
    assert drafter.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    assert drafter.embed_tokens is model.model.embed_tokens
    own = drafter.layers[0].self_attn.q_proj.weight
    assert not torch.equal(own, model.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(own, MtpDrafter(model, seed=1).layers[0].self_attn.q_proj.weight)


def test_mtp_exports_and_onnxruntime_drafts_the_same(drafter):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    args = _inputs(drafter)
    model = translation.export(drafter, args)
    assert [n.op_type for n in model.graph.node if n.domain == "flashspec"] == ["TiledArgmax"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    draft, *_ = session.run(None, dict(zip(names, [a.numpy() for a in args], strict=True)))
    with torch.no_grad():
        np.testing.assert_array_equal(draft, drafter(*args)[0].numpy())
