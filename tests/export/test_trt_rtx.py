"""TensorRT-RTX (CPU) parses the exported ops — the function bodies inlined, since RTX has no
plugins — and builds engines from them. TensorRT-RTX's parser and builder run without a GPU."""

from __future__ import annotations

import pytest

trt = pytest.importorskip("tensorrt_rtx", reason="needs TensorRT-RTX (pip install tensorrt-rtx)")
onnx = pytest.importorskip("onnx")

from onnx import TensorProto  # noqa: E402

from flashspec_export.onnx import functions  # noqa: E402
from flashspec_export.reference import truncation  # noqa: E402

SHAPES = {
    "TiledArgmax": {"hidden": (4, 64), "lm_head": (1024, 64)},
    "VerifyResample": {
        "hidden": (4, 4, 64),
        "lm_head": (1024, 64),
        "draft_tokens": (4, 3),
        "temperature": (4,),
        "seed": (4,),
        "positions": (4,),
    },
}


def _parse(op_type: str, float_type: int):
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    model = functions.single_op_model(op_type, float_type, vocab_size=1000)
    ok = parser.parse(model.SerializeToString())
    errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
    return ok, errors, builder, network


@pytest.mark.parametrize("op_type", sorted(SHAPES))
@pytest.mark.parametrize(
    "float_type", [TensorProto.FLOAT, TensorProto.BFLOAT16], ids=["fp32", "bf16"]
)
def test_parses_with_the_function_body_inlined(op_type, float_type):
    ok, errors, _, network = _parse(op_type, float_type)
    assert ok, errors
    assert network.num_layers > 1  # the body, not a single unresolved plugin layer


@pytest.mark.parametrize("op_type", sorted(SHAPES))
def test_builds_an_engine(op_type):
    """Without the fence in the VerifyResample body (functions._fence) this build of 4 rows
    never finishes: Myelin's compile time grows exponentially with the fused hash chain."""
    ok, errors, builder, network = _parse(op_type, TensorProto.FLOAT)
    assert ok, errors
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        shape = SHAPES[op_type][name]
        profile.set_shape(name, shape, shape, shape)
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    assert engine is not None and engine.nbytes > 0


def test_parses_an_exported_torch_module():
    """A module calling torch.ops.flashspec.*, exported by torch.onnx.export, parses too."""
    pytest.importorskip("onnxscript")
    import torch

    from flashspec_export.onnx import translation
    from tests.export.test_torch_export import GreedyDrafter

    g = torch.Generator().manual_seed(0)
    module = GreedyDrafter(torch.randn(300, 16, generator=g), 290)
    model = translation.export(module, (torch.randn(4, 16, generator=g),))
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(network, logger)
    assert parser.parse(model.SerializeToString()), [
        str(parser.get_error(i)) for i in range(parser.num_errors)
    ]


TRUNCATING = ("top_k", "top_p", "allowed_tokens")


@pytest.mark.parametrize(
    ("optional", "vocab"),
    [(TRUNCATING[:2], 1000), (TRUNCATING, 1000), (TRUNCATING, 128_256)],
    ids=["top_k+top_p-1000", "all-1000", "all-128256"],
)
def test_the_truncating_body_parses_and_builds(optional, vocab):
    """VerifyResample with top_k / top_p (and masks): the truncating body parses and builds at
    V = 1000 and at Llama-3's 128 256 — past TensorRT's TopK limit (K <= 3840): the body finds
    the top-k / top-p threshold by bisection, no sort — in a few seconds each; with the noise
    fed the truncated logits instead of masking the noisy scores, Myelin's build never
    finished."""
    logger = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, logger)
    model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab, optional)
    assert parser.parse(model.SerializeToString()), [
        str(parser.get_error(i)) for i in range(parser.num_errors)
    ]
    assert "TopK" not in {node.op_type for node in model.functions[0].node}
    shapes = SHAPES["VerifyResample"] | {
        "lm_head": (vocab, 64),
        "top_k": (4,),
        "top_p": (4,),
        "allowed_tokens": (4, 4, truncation.words_for(vocab)),
    }
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for i in range(network.num_inputs):
        name = network.get_input(i).name
        profile.set_shape(name, shapes[name], shapes[name], shapes[name])
    config.add_optimization_profile(profile)
    engine = builder.build_serialized_network(network, config)
    assert engine is not None and engine.nbytes > 0


def test_a_skipped_optional_input_does_not_parse():
    """TensorRT's parser refuses a function node with an empty (skipped) input: a model for
    TensorRT gives a prefix of the optional inputs (the exporter's top_k, top_p)."""
    logger = trt.Logger(trt.Logger.ERROR)
    network = trt.Builder(logger).create_network(0)
    parser = trt.OnnxParser(network, logger)
    model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, 1000, ("top_p",))
    assert not parser.parse(model.SerializeToString())
