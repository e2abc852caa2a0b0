"""The TensorRT plugins (plugins/*/…Plugin.cpp, IPluginV3 adapters over the CUDA kernels).

- With TensorRT's headers (``cmake -S plugins -B plugins/build -DTENSORRT_INCLUDE_DIR=…``):
  the host-side self-test binary checks the creators, attributes and I/O contracts (no GPU,
  no TensorRT library needed).
- With TensorRT itself and a GPU: the ONNX parser resolves a ``flashspec`` node to the plugin
  (not the function body), and the engine emits the reference's tokens.
"""

from __future__ import annotations

import pathlib
import subprocess

import numpy as np
import pytest
import torch

from flashspec_export import ops
from tests.cases import make_case
from tests.tolerances import LOGIT_ATOL, LOGIT_RTOL, LOGPROB_LARGE_H_ATOL, LOGPROB_RTOL

BUILD = pathlib.Path(__file__).parents[1] / "plugins/build"
SELF_TEST = BUILD / "pluginSelfTest"
PLUGIN_LIBRARY = BUILD / "libflashspec_plugins.so"
HOW = "cmake -S plugins -B plugins/build -DTENSORRT_INCLUDE_DIR=<TensorRT>/include; cmake --build …"


@pytest.mark.skipif(not SELF_TEST.is_file(), reason=f"needs TensorRT headers to build it: {HOW}")
def test_plugin_self_test_passes():
    result = subprocess.run([SELF_TEST], capture_output=True, text=True, timeout=60, check=False)
    assert result.returncode == 0, result.stdout
    assert "0 failure(s)" in result.stdout and "FAIL" not in result.stdout


@pytest.mark.trt
@pytest.mark.gpu
@pytest.mark.skipif(not PLUGIN_LIBRARY.is_file(), reason=f"needs the plugin library: {HOW}")
def test_engine_resolves_the_plugin_and_emits_the_reference_tokens():
    import tensorrt as trt

    onnx = pytest.importorskip("onnx")
    from flashspec_export.onnx import functions

    n, gamma, hidden_size, vocab = 4, 3, 64, 1000
    case = make_case(n, gamma, hidden_size, vocab, torch.bfloat16, padded_vocab=1024, seed=3)
    hidden, lm_head, drafts, temps, seeds, positions, _ = case
    logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(logger)
    builder.get_plugin_registry().load_library(str(PLUGIN_LIBRARY))
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    model = functions.single_op_model("VerifyResample", onnx.TensorProto.BFLOAT16, vocab_size=vocab)
    errors = lambda: [parser.get_error(i) for i in range(parser.num_errors)]  # noqa: E731
    assert parser.parse(model.SerializeToString()), errors()
    assert network.num_layers == 1 and network.get_layer(0).type == trt.LayerType.PLUGIN_V3
    names = ["hidden", "lm_head", "draft_tokens", "temperature", "seed", "positions"]
    inputs = dict(zip(names, case[:6], strict=True))
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, tensor in inputs.items():
        profile.set_shape(name, tensor.shape, tensor.shape, tensor.shape)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    engine = trt.Runtime(logger).deserialize_cuda_engine(serialized)
    context = engine.create_execution_context()
    device = {name: tensor.cuda().contiguous() for name, tensor in inputs.items()}
    outputs = {
        "tokens": torch.empty(n, gamma + 1, dtype=torch.int64, device="cuda"),
        "num_emitted": torch.empty(n, dtype=torch.int64, device="cuda"),
        "logprobs": torch.empty(n, gamma + 1, dtype=torch.float32, device="cuda"),
    }
    for name, tensor in device.items():
        context.set_input_shape(name, tuple(tensor.shape))
    for name, tensor in {**device, **outputs}.items():
        context.set_tensor_address(name, tensor.data_ptr())
    assert context.execute_async_v3(torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    tokens, emitted = ops.verify_resample(hidden, lm_head, drafts, temps, seeds, positions, vocab)
    assert torch.equal(outputs["tokens"].cpu(), tokens)
    assert torch.equal(outputs["num_emitted"].cpu(), emitted)


RUNNER = BUILD / "pluginCaseRunner"
# (N, γ) under one dynamic profile (N <= 32, γ <= 8), bf16 at H = 4096 (the CUDA library's
# compiled-in Triton kernels where built for it): 1 and 15 rows (the portable kernels), 20 and 128
# rows (on Hopper the warp-specialised kernel's 64-row tile), 150 rows (its 128-row tile), and
# γ = 8 (past the compiled finalize kernels: the native CUDA kernels).
PROFILE_CASES = [(1, 0), (3, 4), (4, 4), (32, 3), (30, 4), (16, 8)]


def _write_case(directory: pathlib.Path, lm_head, n, gamma, g):
    """Inputs of one shape, written as the runner reads them: drafts are the target's greedy
    choice for 70% of the positions (so drafts are accepted), temperatures mixed."""
    hidden = torch.randn(n, gamma + 1, 4096, generator=g).to(torch.bfloat16)
    greedy, _ = ops.tiled_argmax(hidden.reshape(-1, 4096).cuda(), lm_head.cuda(), 32000)
    greedy = greedy.cpu().reshape(n, gamma + 1)[:, :gamma]
    drafts = torch.where(
        torch.rand(n, gamma, generator=g) < 0.7,
        greedy,
        torch.randint(0, 32000, (n, gamma), generator=g),
    )
    inputs = dict(
        hidden=hidden,
        draft_tokens=drafts,
        temperature=torch.tensor([0.0, 1.0, 0.7, 1.3])[torch.arange(n) % 4],
        seed=torch.randint(0, 2**62, (n,), generator=g),
        positions=torch.randint(0, 10_000, (n,), generator=g),
    )
    directory.mkdir()
    for name, t in inputs.items():
        data = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        data.contiguous().numpy().tofile(directory / f"{name}.bin")
    values = list(inputs.values())
    return (values[0], lm_head, *values[1:])


def _runner_inputs(directory: pathlib.Path, op: str, profile: str, seed: int):
    """(generator, lm_head) of a runner case directory: the bf16 [32064, 4096] head written to
    it, and the first lines of its cases.txt (op, dtype, H, V, the profile)."""
    g = torch.Generator().manual_seed(seed)
    lm_head = (torch.randn(32064, 4096, generator=g) * (6.0 / 64)).to(torch.bfloat16)
    lm_head.view(torch.int16).numpy().tofile(directory / "lm_head.bin")
    lines = [f"op {op}", "dtype bfloat16", "hidden 4096", "vocab 32000 padded 32064", profile]
    return g, lm_head, lines


def _check_runner_case(directory, case, truncate=None) -> torch.Tensor:
    """The runner's tokens, counts and log-probabilities in ``directory`` against the reference
    op's on ``case`` (and its ``truncate`` inputs); returns the counts."""
    n, width = case[2].shape[0], case[2].shape[1] + 1
    tokens, emitted, logprobs = ops.verify_resample(
        *(t.cuda() for t in case),
        32000,
        return_logprobs=True,
        **{k: v.cuda() for k, v in (truncate or {}).items()},
    )
    got_tokens = torch.from_numpy(np.fromfile(directory / "tokens.bin", np.int64))
    got_emitted = torch.from_numpy(np.fromfile(directory / "num_emitted.bin", np.int64))
    got_logprobs = torch.from_numpy(np.fromfile(directory / "logprobs.bin", np.float32))
    assert torch.equal(got_tokens.reshape(n, width), tokens.cpu()), directory.name
    assert torch.equal(got_emitted, emitted.cpu()), directory.name
    torch.testing.assert_close(
        got_logprobs.reshape(n, width),
        logprobs.cpu(),
        atol=LOGPROB_LARGE_H_ATOL,
        rtol=LOGPROB_RTOL,
    )
    return emitted


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not RUNNER.is_file(), reason=f"needs TensorRT headers to build it: {HOW}")
def test_verify_plugin_under_a_dynamic_profile_emits_the_reference_tokens(tmp_path):
    """The plugin configured for a profile (N 1..32, γ 0..8), deserialized from its fields and
    run at six shapes with the profile's one workspace, as an engine runs it: the reference's
    tokens and log-probabilities at every shape (bf16, H = 4096, V = 32000)."""
    g, lm_head, lines = _runner_inputs(tmp_path, "VerifyResample", "profile 32 9", seed=0)
    cases = {}
    for n, gamma in PROFILE_CASES:
        name = f"n{n}_g{gamma}"
        cases[name] = _write_case(tmp_path / name, lm_head, n, gamma, g)
        lines.append(f"case {name} {n} {gamma + 1}")
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    run = subprocess.run([RUNNER, tmp_path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    accepted = 0
    for name, case in cases.items():
        accepted += int((_check_runner_case(tmp_path / name, case) > 1).sum())
    assert accepted > 0, "no draft was accepted: the cases are vacuous"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not RUNNER.is_file(), reason=f"needs TensorRT headers to build it: {HOW}")
def test_verify_plugin_with_truncation_under_a_dynamic_profile_emits_the_reference_tokens(tmp_path):
    """The plugin with all three optional inputs (top_k, top_p, allowed_tokens: 9 inputs, the
    field optional_inputs serialized at configure and restored) under the profile N 1..32,
    γ 0..8, at six shapes: the reference's truncated tokens and log-probabilities. k up to 3000
    sends rows through the exact recompute; a sequence whose p lies within 1e-5 of a token's
    mass-before (where summation order may move the cut) gets p = 1."""
    from tests.parity.test_truncation_cuda_gpu import _margin

    g, lm_head, lines = _runner_inputs(tmp_path, "VerifyResample", "profile 32 9", seed=2)
    lines.append("optional 3")
    cases = {}
    for n, gamma in PROFILE_CASES:
        name = f"n{n}_g{gamma}"
        case = _write_case(tmp_path / name, lm_head, n, gamma, g)
        top_k = torch.tensor([0, 1, 20, 50, 3000])[torch.arange(n) % 5]
        top_p = torch.tensor([1.0, 0.9, 0.5, 1.0, 0.95, 0.8, 1.0])[torch.arange(n) % 7]
        words = torch.randint(-(2**31), 2**31 - 1, (2, n, gamma + 1, 1000), generator=g,
                              dtype=torch.int32)  # fmt: skip
        allowed = words[0] | words[1]  # three tokens in four allowed
        cuda_case = [t.cuda() for t in case]
        for s in range(n):
            one = dict(top_k=top_k[s : s + 1].cuda(), top_p=top_p[s : s + 1].cuda())
            rows = (cuda_case[0][s : s + 1], cuda_case[1], cuda_case[3][s : s + 1], 32000)
            if _margin(*rows, **one, allowed_tokens=allowed[s : s + 1].cuda()) < 1e-5:
                top_p[s] = 1.0
        truncate = dict(top_k=top_k, top_p=top_p, allowed_tokens=allowed)
        for key, t in truncate.items():
            t.numpy().tofile(tmp_path / name / f"{key}.bin")
        cases[name] = (case, truncate)
        lines.append(f"case {name} {n} {gamma + 1}")
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    run = subprocess.run([RUNNER, tmp_path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for name, (case, truncate) in cases.items():
        _check_runner_case(tmp_path / name, case, truncate)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.skipif(not RUNNER.is_file(), reason=f"needs TensorRT headers to build it: {HOW}")
def test_argmax_plugin_under_a_dynamic_profile_matches_the_reference(tmp_path):
    """TiledArgmax configured for 1..256 rows and run at 1, 16, 100 and 256 rows (bf16, H 4096)."""
    g, lm_head, lines = _runner_inputs(tmp_path, "TiledArgmax", "profile 256 1", seed=1)
    hidden = {}
    for rows in (1, 16, 100, 256):
        name = f"r{rows}"
        hidden[name] = torch.randn(rows, 4096, generator=g).to(torch.bfloat16)
        (tmp_path / name).mkdir()
        hidden[name].view(torch.int16).numpy().tofile(tmp_path / name / "hidden.bin")
        lines.append(f"case {name} {rows} 1")
    (tmp_path / "cases.txt").write_text("\n".join(lines) + "\n")
    run = subprocess.run([RUNNER, tmp_path], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    for name, h in hidden.items():
        token, max_logit = ops.tiled_argmax(h.cuda(), lm_head.cuda(), 32000)
        got = torch.from_numpy(np.fromfile(tmp_path / name / "token.bin", np.int64))
        got_max = torch.from_numpy(np.fromfile(tmp_path / name / "max_logit.bin", np.float32))
        assert torch.equal(got, token.cpu()), name
        torch.testing.assert_close(got_max, max_logit.cpu(), atol=LOGIT_ATOL, rtol=LOGIT_RTOL)
