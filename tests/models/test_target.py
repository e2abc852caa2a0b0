"""TargetStep against the Hugging Face model it wraps: same hidden states, with a static cache."""

from __future__ import annotations

import pytest
import torch

transformers = pytest.importorskip("transformers")

from flashspec_export.config import TargetConfig  # noqa: E402
from flashspec_export.models.target import TargetStep  # noqa: E402

ATOL = 1e-5  # fp32, the same weights; only the attention's summation order differs

QWEN2 = TargetConfig("tiny-qwen2", "qwen2", 512, 64, 128, 2, 4, 2, 16, max_positions=256)


@pytest.fixture(params=["tiny-llama", "tiny-qwen", "qwen2"])
def model(request):
    config = QWEN2 if request.param == "qwen2" else TargetConfig.from_name(request.param)
    return config.build(seed=0)


def test_prefill_then_step_equals_one_full_forward(model):
    step = TargetStep(model)
    ids = torch.randint(0, 512, (3, 12), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model.model(ids).last_hidden_state  # [3, 12, H]
        k = torch.zeros(step.cache_shape(3, 32))
        v = torch.zeros_like(k)
        h0, k, v = step(ids[:, :8], torch.zeros(3, dtype=torch.int64), k, v)
        h1, k, v = step(ids[:, 8:], torch.full((3,), 8), k, v)
    torch.testing.assert_close(h0, full[:, :8], atol=ATOL, rtol=0)
    torch.testing.assert_close(h1, full[:, 8:], atol=ATOL, rtol=0)
    assert bool((k[:, :, :, 12:] == 0).all())  # nothing written past the last position


def test_ragged_positions_and_stale_slots(model):
    """Sequences at different cache lengths in one batch; slots past a sequence's length hold
    garbage (rejected drafts) and must not matter."""
    step = TargetStep(model)
    g = torch.Generator().manual_seed(2)
    lengths = [3, 7, 5]
    seqs = [torch.randint(0, 512, (1, n + 4), generator=g) for n in lengths]
    k = torch.randn(step.cache_shape(3, 16), generator=g)  # stale everywhere
    v = torch.randn(step.cache_shape(3, 16), generator=g)
    with torch.no_grad():
        for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            _, k_row, v_row = step(
                seq[:, :n],
                torch.zeros(1, dtype=torch.int64),
                k[:, row : row + 1],
                v[:, row : row + 1],
            )
            k[:, row : row + 1], v[:, row : row + 1] = k_row, v_row
        new = torch.cat([seq[:, n:] for seq, n in zip(seqs, lengths, strict=True)])  # [3, 4]
        hidden, _, _ = step(new, torch.tensor(lengths), k, v)
        for row, (seq, n) in enumerate(zip(seqs, lengths, strict=True)):
            expected = model.model(seq).last_hidden_state[0, n:]
            torch.testing.assert_close(hidden[row], expected, atol=ATOL, rtol=0)


def test_unsupported_architecture_is_named():
    config = transformers.GPT2Config(n_layer=1, n_embd=32, n_head=2, vocab_size=64)
    with pytest.raises(
        ValueError, match=r"target: unsupported architecture 'gpt2'; expected one of llama"
    ):
        TargetStep(transformers.GPT2LMHeadModel(config))


def test_unknown_preset_lists_the_presets():
    with pytest.raises(
        ValueError, match=r"target: unknown preset 'gpt-9'; expected one of tiny-llama, tiny-qwen"
    ):
        TargetConfig.from_name("gpt-9")
