"""torch.onnx.export turns the FlashSpec torch ops into flashspec nodes with function bodies;
ONNX Runtime then emits exactly what the PyTorch module emits."""

from __future__ import annotations

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")
pytest.importorskip("onnxscript")

from flashspec_export.onnx import translation  # noqa: E402
from tests.cases import make_case  # noqa: E402
from tests.tolerances import LOGPROB_ATOL  # noqa: E402


class VerifyHead(torch.nn.Module):
    """A target step's tail: LM head + VerifyResample."""

    def __init__(self, lm_head: torch.Tensor, vocab_size: int):
        super().__init__()
        self.lm_head = torch.nn.Parameter(lm_head, requires_grad=False)
        self.vocab_size = vocab_size

    def forward(self, hidden, draft_tokens, temperature, seed, positions):
        return torch.ops.flashspec.verify_resample(
            hidden,
            self.lm_head,
            draft_tokens,
            temperature,
            seed,
            positions,
            vocab_size=self.vocab_size,
        )


class GreedyDrafter(torch.nn.Module):
    """A drafter's tail: a projection, then TiledArgmax over the shared LM head."""

    def __init__(self, lm_head: torch.Tensor, vocab_size: int):
        super().__init__()
        hidden_size = lm_head.shape[1]
        self.proj = torch.nn.Linear(hidden_size, hidden_size)
        self.lm_head = torch.nn.Parameter(lm_head, requires_grad=False)
        self.vocab_size = vocab_size

    def forward(self, hidden):
        return torch.ops.flashspec.tiled_argmax(self.proj(hidden), self.lm_head, self.vocab_size)


def _run(model: onnx.ModelProto, args) -> list[np.ndarray]:
    onnx.checker.check_model(model, full_check=True)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    names = [i.name for i in session.get_inputs()]
    return session.run(None, dict(zip(names, [a.numpy() for a in args], strict=True)))


def test_verify_head_exports_as_a_flashspec_node():
    temps = torch.tensor([0.0, 0.8, 1.0, 1.7, 0.0])
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        5, 3, 32, 500, torch.float32, padded_vocab=512, temperature=temps, seed=11
    )
    module = VerifyHead(lm_head, vocab)
    args = (hidden, drafts, temps, seeds, positions)
    model = translation.export(module, args)
    flashspec_nodes = [n for n in model.graph.node if n.domain == "flashspec"]
    assert [n.op_type for n in flashspec_nodes] == ["VerifyResample"]
    assert [f.name for f in model.functions] == ["VerifyResample"]
    tokens, emitted, logprobs = _run(model, args)
    expected = module(*args)
    np.testing.assert_array_equal(tokens, expected[0].numpy())
    np.testing.assert_array_equal(emitted, expected[1].numpy())
    np.testing.assert_allclose(logprobs, expected[2].numpy(), atol=LOGPROB_ATOL)
    assert emitted.max() > 1


def test_drafter_exports_with_tiled_argmax():
    g = torch.Generator().manual_seed(3)
    lm_head = torch.randn(700, 24, generator=g)
    module = GreedyDrafter(lm_head, 650)
    hidden = torch.randn(6, 24, generator=g)
    model = translation.export(module, (hidden,))
    assert [n.op_type for n in model.graph.node if n.domain == "flashspec"] == ["TiledArgmax"]
    token, _ = _run(model, (hidden,))
    np.testing.assert_array_equal(token, module(hidden)[0].numpy())


def test_speculative_target_step_exports_and_matches():
    """tiny-llama decoder + static cache + VerifyResample: ORT reproduces the module's emitted
    tokens exactly and its hidden states and caches to fp32 rounding."""
    pytest.importorskip("transformers")
    from flashspec_export.config import TargetConfig
    from flashspec_export.models.target import SpeculativeTarget

    model = TargetConfig.from_name("tiny-llama").build(seed=0)
    target = SpeculativeTarget(model)
    g = torch.Generator().manual_seed(4)
    n, gamma = 4, 3
    k_cache = torch.randn(target.step.cache_shape(n, 24), generator=g)
    v_cache = torch.randn(target.step.cache_shape(n, 24), generator=g)
    args = (
        torch.randint(0, 512, (n, gamma + 1), generator=g),
        torch.tensor([0, 5, 9, 17]),
        k_cache,
        v_cache,
        torch.tensor([0.0, 1.0, 0.7, 1.5]),
        torch.tensor([1, 2, 3, 4]),
    )
    onnx_model = translation.export(target, args)
    outputs = _run(onnx_model, args)
    with torch.no_grad():
        expected = target(*args)
    np.testing.assert_array_equal(outputs[0], expected[0].numpy())
    np.testing.assert_array_equal(outputs[1], expected[1].numpy())
    for got, want in zip(outputs[3:], expected[3:], strict=True):
        np.testing.assert_allclose(got, want.numpy(), atol=1e-5)
