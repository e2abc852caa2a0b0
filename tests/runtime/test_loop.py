"""The speculative loop end to end on tiny-llama: exact against plain decoding and across
runtimes (PyTorch modules vs the exported graphs in onnxruntime, same seeds)."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.config import TargetConfig
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.models.target import SpeculativeTarget
from flashspec_export.runtime.loop import OnnxTarget, TorchTarget, generate

GAMMA, NEW_TOKENS = 3, 12
TEMPERATURES = torch.tensor([0.0, 0.8, 1.0])
SEEDS = torch.tensor([5, 6, 7])


@pytest.fixture(scope="module")
def setup():
    model = TargetConfig.from_name("tiny-llama").build(seed=0)
    prompt = torch.randint(0, 512, (3, 6), generator=torch.Generator().manual_seed(0))
    prompt[:, 3:] = prompt[:, :3]  # a repetition the n-gram drafter can exploit
    return model, SpeculativeTarget(model), prompt


def test_greedy_speculation_equals_plain_greedy_decoding(setup):
    """T = 0: whatever the drafts, the output is the target's own argmax chain."""
    model, target, prompt = setup
    result = generate(
        TorchTarget(target), NgramDrafter(), prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS
    )
    sequence = prompt[:1]
    with torch.no_grad():
        for _ in range(NEW_TOKENS):
            next_token = model(sequence).logits[:, -1].argmax(-1, keepdim=True)
            sequence = torch.cat([sequence, next_token], dim=1)
    assert result.tokens[0] == sequence[0, prompt.shape[1] :].tolist()
    assert result.mean_emitted > 1.0  # some drafts were accepted: the multi-token path ran


def test_onnx_runtime_loop_matches_pytorch_loop(setup):
    ort = pytest.importorskip("onnxruntime")
    pytest.importorskip("onnxscript")
    from flashspec_export.onnx import translation

    _, target, prompt = setup
    n = prompt.shape[0]
    k = torch.zeros(target.step.cache_shape(n, prompt.shape[1] + NEW_TOKENS + GAMMA + 1))
    zeros = torch.zeros(n, dtype=torch.int64)
    v = torch.zeros_like(k)
    prefill = translation.export(target.step, (prompt[:, :-1], zeros, k, v))
    step = translation.export(
        target, (torch.zeros(n, GAMMA + 1, dtype=torch.int64), zeros, k, v, TEMPERATURES, SEEDS)
    )

    def session(model):
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])

    onnx_target = OnnxTarget(session(prefill), session(step), target.step.cache_shape)
    expected = generate(
        TorchTarget(target), NgramDrafter(), prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS
    )
    got = generate(onnx_target, NgramDrafter(), prompt, NEW_TOKENS, GAMMA, TEMPERATURES, SEEDS)
    assert got.tokens == expected.tokens
    assert got.steps == expected.steps


def test_ngram_drafter_copies_what_followed():
    drafter = NgramDrafter(max_ngram=2)
    assert drafter.propose_one([1, 2, 3, 9, 1, 2], 3) == [3, 9, 1]
    assert drafter.propose_one([4, 5], 2) == [5, 5]  # no earlier match: repeat the last token
    assert drafter.propose([[1, 2, 1], [7, 8, 7]], 2).tolist() == [[2, 1], [8, 7]]
