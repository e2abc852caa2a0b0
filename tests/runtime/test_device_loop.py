"""The device-resident loop (``runtime.device_loop``) against the host loop (``loop.generate``)
on the same modules and seeds: the same tokens, step for step. On CPU here (reference ops, no
graphs); on a GPU with the Triton kernels and CUDA graphs (``gpu`` marker).

The random-weight MTP head almost never drafts the target's token, so the ragged multi-token
path is exercised with a drafter that proposes the target's own continuation, corrupted at known
positions (``draft_filter``): at T = 0 the text is the target's greedy chain, at T > 0 (the
coupled rule) the γ = 0 text, whatever the drafts."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")

from flashspec_export.models.build import build_modules
from flashspec_export.runtime import sessions
from flashspec_export.runtime.device_loop import DeviceLoop
from flashspec_export.runtime.loop import generate
from tests.runtime.tiny import BATCH, MAX_LEN, NEW_TOKENS, SEEDS, TEMPERATURES, config_of


def _modules(checkpoint, device="cpu", dtype=torch.float32):
    modules = build_modules(config_of("mtp", checkpoint))
    for module in (modules.model, modules.drafter):
        module.to(device=device, dtype=dtype)
    return modules


def _oracle_filter(sequences: torch.Tensor, corrupt_every: int):
    """Drafts = the next tokens of ``sequences [N, L]`` (prompt + continuation) after each
    sequence's last accepted position, one in ``corrupt_every`` replaced by a wrong id."""

    def draft_filter(drafts, positions):
        gamma = drafts.shape[1]
        index = (positions[:, None] + 1 + torch.arange(gamma, device=drafts.device)).clamp(
            max=sequences.shape[1] - 1
        )
        truth = sequences.gather(1, index)
        corrupt = (index * 7 + torch.arange(len(drafts), device=drafts.device)[:, None]) % (
            corrupt_every
        ) == 0
        return torch.where(corrupt, (truth + 1) % 512, truth)

    return draft_filter


ON_A_GPU = "on a GPU the fused layers run in test_on_the_gpu_same_tokens_as_the_host_loop"
INTERPRETED = pytest.mark.skipif(torch.cuda.is_available(), reason=ON_A_GPU)


@pytest.mark.parametrize(
    "gamma, fused", [(0, False), (1, False), (3, False), pytest.param(3, True, marks=INTERPRETED)]
)
def test_same_tokens_as_the_host_loop(gamma, fused, prompt, target_checkpoint):
    """``fused``: the decoder layers on the Triton kernels (``models/fused.py``, under the
    interpreter on CPU, so half the tokens), as on a GPU."""
    modules = _modules(target_checkpoint)
    runtime = sessions.from_modules(
        build_modules(config_of("mtp", target_checkpoint)), "mtp", BATCH, MAX_LEN
    )
    new_tokens = NEW_TOKENS // 2 if fused else NEW_TOKENS
    want = generate(*runtime, prompt, new_tokens, gamma, TEMPERATURES, SEEDS)
    loop = DeviceLoop(modules.model, modules.drafter, BATCH, MAX_LEN, gamma, fused=fused)
    tokens, metrics = loop.generate(prompt, new_tokens, TEMPERATURES, SEEDS)
    assert tokens == want.tokens
    assert metrics.steps == want.steps and metrics.emitted == want.metrics.emitted
    assert metrics.accepted_at == want.metrics.accepted_at


def _check_ragged_acceptance(modules, prompt, device):
    """T = 0 and T > 0 with drafts that are mostly right: several tokens per step, sequences
    advancing by different counts, and the γ = 0 text."""
    temperatures = TEMPERATURES.to(device)
    plain = DeviceLoop(modules.model, None, BATCH, MAX_LEN, 0)
    want, _ = plain.generate(prompt, NEW_TOKENS, temperatures, SEEDS)
    continuation = torch.cat([prompt, torch.tensor(want)], dim=1).to(device)
    loop = DeviceLoop(
        modules.model,
        modules.drafter,
        BATCH,
        MAX_LEN,
        3,
        draft_filter=_oracle_filter(continuation, corrupt_every=5),
    )
    tokens, metrics = loop.generate(prompt, NEW_TOKENS, temperatures, SEEDS)
    assert tokens == want
    assert metrics.tokens_per_step > 2.0, metrics.summary()
    assert 0 < metrics.acceptance[-1] < metrics.acceptance[0] <= 1.0


def test_ragged_multi_token_acceptance_keeps_the_text(prompt, target_checkpoint):
    _check_ragged_acceptance(_modules(target_checkpoint), prompt, "cpu")


@pytest.mark.gpu
@pytest.mark.parametrize("gamma", [0, 3])
def test_on_the_gpu_same_tokens_as_the_host_loop(gamma, prompt, target_checkpoint):
    """fp32 on CUDA, Triton kernels and CUDA graphs in the device loop, Triton kernels in the
    host loop's modules: identical tokens."""
    modules = _modules(target_checkpoint, "cuda")
    reference = build_modules(config_of("mtp", target_checkpoint))
    runtime = sessions.from_modules(reference, "mtp", BATCH, MAX_LEN, device="cuda")
    want = generate(*runtime, prompt, NEW_TOKENS, gamma, TEMPERATURES, SEEDS)
    for split_timing in (False, True):  # one graph per step; three, timed apart
        loop = DeviceLoop(
            modules.model, modules.drafter, BATCH, MAX_LEN, gamma, split_timing=split_timing
        )
        assert loop.use_graphs and loop.target_layers is not None
        for _ in range(2):  # the captured graphs serve a second request too
            tokens, metrics = loop.generate(prompt, NEW_TOKENS, TEMPERATURES, SEEDS)
            assert tokens == want.tokens and metrics.steps == want.steps


@pytest.mark.gpu
def test_on_the_gpu_ragged_acceptance_keeps_the_text(prompt, target_checkpoint):
    _check_ragged_acceptance(_modules(target_checkpoint, "cuda"), prompt, "cuda")
