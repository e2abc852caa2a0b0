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

import pytest
import torch

from flashspec_export import ops
from tests.cases import make_case

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
