"""The GPU decode path's fused decoder layers (``models/fused.py``, ``kernels/decoder.py``)
against the PyTorch layers they replace (``run_layers(..., inplace=True)``, the reference and the
exported graph's form): same hidden states and cache writes, in fp32 to summation order.

Sequences sit at different cache lengths with garbage past them (rejected drafts' slots), so a
kernel that reads past a sequence's live prefix, writes the wrong slot or lets a query see a
later new token fails. The flash-decoding split (several splits, one merge) is forced on CPU,
where the kernels run under the Triton interpreter (on a GPU machine: in fp32 on the GPU). On a
GPU (``gpu`` marker) the same in bf16.
"""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("triton")

from flashspec_export.config import TargetConfig
from flashspec_export.kernels import decoder
from flashspec_export.models.fused import FusedLayers
from flashspec_export.models.target import TargetStep
from tests.tolerances import CACHE_ATOL, CACHE_RTOL, FUSED_BF16_ATOL

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"  # fp32: the interpreter without a GPU
QWEN2 = TargetConfig("tiny-qwen2", "qwen2", 512, 64, 128, 2, 4, 2, 16, max_positions=256)
MODELS = {"llama": "tiny-llama", "qwen3": "tiny-qwen", "qwen2 (q/k/v bias)": QWEN2}


def _model(name, device=DEVICE, dtype=torch.float32):
    config = MODELS[name]
    config = TargetConfig.from_name(config) if isinstance(config, str) else config
    return config.build(seed=0).to(device=device, dtype=dtype).eval()


def _both(step, tokens, positions, max_len, splits, device=DEVICE):
    """(reference, fused) hidden states and caches from the same garbage-filled caches."""
    generator = torch.Generator().manual_seed(3)
    k = torch.randn(step.cache_shape(len(tokens), max_len), generator=generator)
    k = k.to(device=device, dtype=step.decoder.embed_tokens.weight.dtype)
    v = torch.randn(k.shape, generator=generator).to(k)
    fused = FusedLayers(step.decoder.layers, step.decoder.rotary_emb, step.geometry)
    with torch.no_grad():
        k_fused, v_fused = k.clone(), v.clone()
        want, _, _ = step(tokens, positions, k, v, inplace=True)
        x = step.decoder.embed_tokens(tokens)
        got = fused.norm(fused(x, positions, k_fused, v_fused, splits=splits), step.decoder.norm)
    return (want, k, v), (got, k_fused, v_fused)


@pytest.mark.parametrize(
    "name, new_tokens, splits",
    [
        ("llama", 4, 1),  # a target step (γ + 1 rows)
        ("llama", 1, 1),  # a drafter call
        ("llama", 4, 3),  # flash-decoding splits and their merge
        ("qwen3", 4, 3),  # per-head q / k RMSNorm
        ("qwen2 (q/k/v bias)", 4, 1),  # packed biases
    ],
)
def test_same_hidden_states_and_cache_as_the_pytorch_layers(name, new_tokens, splits):
    step = TargetStep(_model(name))
    tokens = torch.randint(0, 512, (3, new_tokens), generator=torch.Generator().manual_seed(1))
    tokens = tokens.to(DEVICE)
    positions = torch.tensor([0, 9, 40], device=DEVICE)  # cache lengths: empty, short, near the end
    (want, k, v), (got, k_fused, v_fused) = _both(step, tokens, positions, 48, splits)
    torch.testing.assert_close(got, want, atol=CACHE_ATOL, rtol=CACHE_RTOL)
    # the written slots equal (the packed matmul sums in another order), the garbage kept
    torch.testing.assert_close(k_fused, k, atol=CACHE_ATOL, rtol=CACHE_RTOL)
    torch.testing.assert_close(v_fused, v, atol=CACHE_ATOL, rtol=CACHE_RTOL)


def test_attention_reads_only_the_live_prefix():
    """Slots at or past ``positions + T`` are poisoned with NaN: a kernel reading them (or a
    split past them) returns NaN. And a query must not see the new tokens after it: the first
    row's output changes if the causal mask among the new rows is dropped (checked against a
    full-visibility computation)."""
    generator = torch.Generator().manual_seed(0)
    n, heads, kv, s, d, t = 2, 4, 2, 64, 16, 3
    q = torch.randn(n, heads, t, d, generator=generator).to(DEVICE)
    k = torch.randn(n, kv, s, d, generator=generator).to(DEVICE)
    v = torch.randn(n, kv, s, d, generator=generator).to(DEVICE)
    positions = torch.tensor([5, 20], device=DEVICE)
    for i, p in enumerate(positions.tolist()):
        k[i, :, p + t :] = float("nan")
        v[i, :, p + t :] = float("nan")
    for splits in (1, 4):
        out = decoder.attention(q, k, v, positions, 0.25, splits).view(n, t, heads, d)
        assert not out.isnan().any(), splits
        for i, p in enumerate(positions.tolist()):
            keys = k[i, :, : p + t].repeat_interleave(heads // kv, 0)
            values = v[i, :, : p + t].repeat_interleave(heads // kv, 0)
            scores = q[i] @ keys.transpose(1, 2) * 0.25  # [heads, T, p + T]
            causal = torch.arange(p + t)[None, :] <= (p + torch.arange(t))[:, None]
            causal = causal.to(DEVICE)
            want = torch.softmax(scores.masked_fill(~causal, float("-inf")), -1) @ values
            torch.testing.assert_close(out[i].transpose(0, 1), want, atol=1e-5, rtol=1e-5)
            unmasked = torch.softmax(scores, -1) @ values
            assert not torch.allclose(out[i, 0], unmasked[:, 0], atol=1e-3)


def test_packed_weights_are_the_modules_own():
    """Packing re-points q / k / v and gate / up into one tensor: the model's own forward is
    unchanged and no second copy of the weights is kept."""
    model = _model("llama")
    ids = torch.randint(0, 512, (2, 7), generator=torch.Generator().manual_seed(2)).to(DEVICE)
    with torch.no_grad():
        before = model(ids).logits
        step = TargetStep(model)
        fused = FusedLayers(step.decoder.layers, step.decoder.rotary_emb, step.geometry)
        after = model(ids).logits
    assert torch.equal(before, after)
    attn = model.model.layers[0].self_attn
    packed = fused.packed[0][0]
    assert attn.q_proj.weight.data_ptr() == packed.data_ptr()
    assert attn.v_proj.weight.untyped_storage().data_ptr() == packed.untyped_storage().data_ptr()


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["llama", "qwen3"])
def test_on_the_gpu_in_bf16(name):
    """bf16 on CUDA: the element-wise kernels round as the modules do, the attention
    accumulates in another order; hidden states agree to bf16 resolution."""
    step = TargetStep(_model(name, "cuda", torch.bfloat16))
    tokens = torch.randint(0, 512, (3, 4), generator=torch.Generator().manual_seed(1)).cuda()
    positions = torch.tensor([0, 9, 40]).cuda()
    for splits in (1, 3):
        (want, k, _), (got, k_fused, _) = _both(step, tokens, positions, 48, splits, "cuda")
        torch.testing.assert_close(got.float(), want.float(), atol=FUSED_BF16_ATOL, rtol=0.02)
        torch.testing.assert_close(k_fused.float(), k.float(), atol=FUSED_BF16_ATOL, rtol=0.02)
