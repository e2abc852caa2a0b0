"""The MTP drafter: a call over T rows drafts the argmax of the shared head at row
``last_row``, keys its cache by the hidden rows' positions, and exports (T dynamic) to a graph
that onnxruntime runs with identical drafts."""

from __future__ import annotations

import numpy as np
import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.config import TargetConfig
from flashspec_export.models.mtp import MtpDrafter


@pytest.fixture(scope="module", params=["tiny-llama", "tiny-qwen"])
def drafter(request):
    return MtpDrafter(TargetConfig.from_name(request.param).build(seed=0), seed=1).eval()


def _inputs(drafter, rows=3, n=4, max_len=16, seed=2):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, rows, drafter.eh_proj.out_features, generator=g)
    tokens = torch.randint(0, drafter.vocab_size, (n, rows), generator=g)
    positions = torch.tensor([1, 4, 2, 7])
    last_row = torch.tensor([rows - 1, 0, rows // 2, rows - 1])
    k = torch.zeros(drafter.cache_shape(n, max_len))
    return hidden, tokens, positions, last_row, k, k.clone()


def test_draft_is_the_argmax_of_the_shared_head_at_the_last_row(drafter):
    hidden, tokens, positions, last_row, k, v = _inputs(drafter)
    with torch.no_grad():
        draft, max_logit, out, k, _ = drafter(hidden, tokens, positions, last_row, k, v)
        logits = drafter.norm(out)[:, 0] @ drafter.lm_head.T
        # row last_row of a call over all rows is the same state as a call that stops there
        for i in range(4):
            r = int(last_row[i])
            one = [a[i : i + 1] for a in (hidden[:, : r + 1], tokens[:, : r + 1], positions)]
            cache = torch.zeros(drafter.cache_shape(1, 16))
            alone = drafter(*one, torch.tensor([r]), cache, cache.clone())
            assert int(alone[0]) == int(draft[i])
            torch.testing.assert_close(alone[2][0], out[i])
    assert torch.equal(draft, logits.argmax(dim=-1))
    torch.testing.assert_close(max_logit, logits.max(dim=-1).values)
    written = (k[0, :, 0].abs().sum(-1) != 0).int()  # [N, S]: slots p .. p + T - 1 only
    expected = torch.zeros_like(written)
    for i, p in enumerate(positions.tolist()):
        expected[i, p : p + 3] = 1
    assert torch.equal(written, expected)


def test_mtp_shares_the_target_weights_and_owns_its_layer():
    model = TargetConfig.from_name("tiny-llama").build(seed=0)
    drafter = MtpDrafter(model, seed=1)
    assert drafter.lm_head.data_ptr() == model.lm_head.weight.data_ptr()
    assert drafter.embed_tokens is model.model.embed_tokens
    own = drafter.layers[0].self_attn.q_proj.weight
    assert not torch.equal(own, model.model.layers[0].self_attn.q_proj.weight)
    assert torch.equal(own, MtpDrafter(model, seed=1).layers[0].self_attn.q_proj.weight)


def test_mtp_exports_and_onnxruntime_drafts_the_same(drafter):
    """Exported with T = 2 rows dynamic, run at T = 1 and 5 with varied positions / rows."""
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    rows = torch.export.Dim("rows", min=1, max=16)
    model = translation.export(
        drafter, _inputs(drafter, rows=2), dynamic_shapes=({1: rows}, {1: rows}, *[None] * 4)
    )
    assert [n.op_type for n in model.graph.node if n.domain == "flashspec"] == ["TiledArgmax"]
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    for t in (1, 5):
        args = _inputs(drafter, rows=t, seed=t)
        feed = dict(zip(names, [a.numpy() for a in args], strict=True))
        draft, _, out, *_ = session.run(None, feed)
        with torch.no_grad():
            expected = drafter(*args)
        np.testing.assert_array_equal(draft, expected[0].numpy())
        np.testing.assert_allclose(out, expected[2].numpy(), atol=1e-5, rtol=0)


def test_example_inputs_sharing_memory_are_refused(drafter):
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    hidden, tokens, positions, _, k, v = _inputs(drafter)
    with pytest.raises(ValueError, match="args: two example inputs share memory"):
        translation.export(drafter, (hidden, tokens, positions, positions, k, v))
