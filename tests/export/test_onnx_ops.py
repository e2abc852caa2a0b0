"""The ONNX face of the ops: custom ``flashspec`` nodes with model-local function bodies.

ONNX Runtime inlines the function body (the standard-op decomposition, noise included) and must
emit exactly the reference's tokens.
"""

from __future__ import annotations

import json
import pathlib

import numpy as np
import pytest
import torch

onnx = pytest.importorskip("onnx")
ort = pytest.importorskip("onnxruntime")

from onnx import TensorProto, helper  # noqa: E402

from flashspec_export import ops  # noqa: E402
from flashspec_export.onnx import functions, noise  # noqa: E402
from flashspec_export.onnx.builder import Body  # noqa: E402
from flashspec_export.ops import specs  # noqa: E402
from tests.cases import make_case  # noqa: E402
from tests.tolerances import (  # noqa: E402
    GUMBEL_ATOL,
    GUMBEL_RTOL,
    LOGIT_ATOL,
    LOGPROB_ATOL,
    LOGPROB_RTOL,
)

FLOAT_TYPES = {
    torch.float32: TensorProto.FLOAT,
    torch.float16: TensorProto.FLOAT16,
    torch.bfloat16: TensorProto.BFLOAT16,
}
VECTORS = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "noise_vectors.json").read_text()
)


def _session(model: onnx.ModelProto):
    return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])


def _numpy(t: torch.Tensor) -> np.ndarray:
    """bf16 has no numpy dtype: ORT takes it as raw uint16 bits through an OrtValue."""
    if t.dtype == torch.bfloat16:
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
            t.view(torch.uint16).numpy(), TensorProto.BFLOAT16
        )
    return t.numpy()


@pytest.mark.parametrize("op_type", sorted(functions.FUNCTIONS))
@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=str)
def test_models_pass_the_full_checker(op_type, dtype):
    model = functions.single_op_model(op_type, FLOAT_TYPES[dtype], vocab_size=1000)
    onnx.checker.check_model(model, full_check=True)
    inferred = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    node = inferred.graph.node[0]
    assert node.domain == "flashspec" and node.op_type == op_type
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    assert attrs == {"vocab_size": 1000, "plugin_namespace": b"flashspec", "plugin_version": b"2"}


def test_integer_attributes_stay_in_int32():
    with pytest.raises(ValueError, match=r"vocab_size: expected 1 <= vocab_size < 2\*\*31"):
        functions.plugin_node("TiledArgmax", ["h", "w"], ["t", "m"], vocab_size=2**31)


@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=str)
@pytest.mark.parametrize("gamma", [0, 1, 4, 8])
def test_verify_resample_body_emits_the_reference_tokens(dtype, gamma):
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.0, 0.7, 1.3, 0.9])
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        9, gamma, 40, 1000, dtype, padded_vocab=1024, temperature=temps, seed=gamma
    )
    session = _session(functions.single_op_model("VerifyResample", FLOAT_TYPES[dtype], vocab))
    tokens, emitted, logprobs = session.run(
        None,
        dict(
            hidden=_numpy(hidden),
            lm_head=_numpy(lm_head),
            draft_tokens=drafts.numpy(),
            temperature=temps.numpy(),
            seed=seeds.numpy(),
            positions=positions.numpy(),
        ),
    )
    r_tokens, r_emitted, r_logprobs = ops.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, vocab, return_logprobs=True
    )
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())
    np.testing.assert_allclose(logprobs, r_logprobs.numpy(), atol=LOGPROB_ATOL, rtol=LOGPROB_RTOL)
    if gamma:
        assert emitted.max() > 1, "no draft was ever accepted: the case is vacuous"


def test_verify_resample_body_is_greedy_below_1e_5():
    """T < 1e-5 is greedy in the function body too: the tokens of T = 0, finite log-probs."""
    hidden, lm_head, drafts, _, seeds, positions, vocab = make_case(
        6, 3, 40, 1000, torch.float32, padded_vocab=1024, seed=5
    )
    session = _session(functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab))
    outputs = []
    for t in (0.0, 1e-38, 9.99e-6):
        feeds = dict(hidden=hidden.numpy(), lm_head=lm_head.numpy(), draft_tokens=drafts.numpy())
        feeds |= dict(temperature=np.full(6, t, np.float32), seed=seeds.numpy())
        outputs.append(session.run(None, feeds | dict(positions=positions.numpy())))
    for tokens, emitted, logprobs in outputs[1:]:
        np.testing.assert_array_equal(tokens, outputs[0][0])
        np.testing.assert_array_equal(emitted, outputs[0][1])
        assert np.isfinite(logprobs).all()


LSE_OPS = ("Exp", "Log", "GatherElements")  # the log-sum-exp and l(y) of the body


def _lse_ops(nodes) -> list[int]:
    """How many of each of ``LSE_OPS`` a body has (the sample has its own Exp, Log and
    GatherElements, per 64-id block: the LSE adds one of each)."""
    kinds = [n.op_type for n in nodes]
    return [kinds.count(op) for op in LSE_OPS]


@pytest.mark.parametrize("gamma", [0, 4])
def test_verify_resample_without_logprobs_skips_the_lse_and_emits_the_same_tokens(gamma):
    """A node that leaves out ``logprobs`` (issue 35): two graph outputs, ``return_logprobs = 0``
    for the plugin, a body without the LSE, and the tokens and counts of the node with it."""
    temps = torch.tensor([0.0, 0.5, 1.0, 2.0, 1.0, 0.7])
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        6, gamma, 40, 1000, torch.float32, padded_vocab=1024, temperature=temps, seed=gamma
    )
    full = functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab)
    lean = functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab, outputs=())
    onnx.checker.check_model(lean, full_check=True)
    assert [o.name for o in lean.graph.output] == ["tokens", "num_emitted"]
    attrs = {a.name: helper.get_attribute_value(a) for a in lean.graph.node[0].attribute}
    assert attrs["return_logprobs"] == 0
    assert "return_logprobs" not in {a.name for a in full.graph.node[0].attribute}
    assert list(lean.functions[0].output) == ["tokens", "num_emitted"]
    with_lse, without = _lse_ops(full.functions[0].node), _lse_ops(lean.functions[0].node)
    assert [a - b for a, b in zip(with_lse, without, strict=True)] == [1, 1, 1]
    feeds = dict(hidden=hidden.numpy(), lm_head=lm_head.numpy(), draft_tokens=drafts.numpy())
    feeds |= dict(temperature=temps.numpy(), seed=seeds.numpy(), positions=positions.numpy())
    tokens, emitted = _session(lean).run(None, feeds)
    f_tokens, f_emitted, _ = _session(full).run(None, feeds)
    np.testing.assert_array_equal(tokens, f_tokens)
    np.testing.assert_array_equal(emitted, f_emitted)
    r_tokens, r_emitted = ops.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, vocab
    )
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())
    if gamma:
        assert emitted.max() > 1, "no draft was ever accepted: the case is vacuous"


def test_a_logprobs_output_skipped_by_an_empty_name_is_not_computed():
    """ONNX's other way to skip a trailing optional output: an empty name. The body keeps three
    outputs (onnxruntime binds them by position), the third an empty constant."""
    hidden, lm_head, drafts, temps, seeds, positions, vocab = make_case(
        4, 3, 40, 1000, torch.float32, padded_vocab=1024, seed=1
    )
    node = functions.plugin_node(
        "VerifyResample",
        [a.name for a in specs.required(specs.VERIFY_RESAMPLE)],
        ["tokens", "num_emitted", ""],
        vocab,
    )
    assert {a.name: a.i for a in node.attribute}["return_logprobs"] == 0
    body = functions.function_for("VerifyResample", [node])
    full = functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab)
    with_lse = _lse_ops(full.functions[0].node)
    assert len(body.output) == 3 and _lse_ops(body.node) == [n - 1 for n in with_lse]
    model = functions.single_op_model("VerifyResample", TensorProto.FLOAT, vocab, outputs=())
    model.graph.node[0].CopyFrom(node)
    model.functions[0].CopyFrom(body)
    onnx.checker.check_model(model, full_check=True)
    feeds = dict(hidden=hidden.numpy(), lm_head=lm_head.numpy(), draft_tokens=drafts.numpy())
    feeds |= dict(temperature=temps.numpy(), seed=seeds.numpy(), positions=positions.numpy())
    tokens, emitted = _session(model).run(None, feeds)
    r_tokens, r_emitted = ops.verify_resample(
        hidden, lm_head, drafts, temps, seeds, positions, vocab
    )
    np.testing.assert_array_equal(tokens, r_tokens.numpy())
    np.testing.assert_array_equal(emitted, r_emitted.numpy())


def test_return_logprobs_must_agree_with_the_outputs_a_node_names():
    """The plugin reads the attribute, onnxruntime the outputs: a node where they disagree is
    refused, as are nodes of one model that differ in their outputs."""
    inputs = [a.name for a in specs.required(specs.VERIFY_RESAMPLE)]
    node = functions.plugin_node("VerifyResample", inputs, ["t", "n", "l"], 10)
    node.attribute.append(helper.make_attribute("return_logprobs", 0))
    with pytest.raises(ValueError, match="return_logprobs = 0 but the node names output logprobs"):
        functions.function_for("VerifyResample", [node])
    full = functions.plugin_node("VerifyResample", inputs, ["t", "n", "l"], 10)
    lean = functions.plugin_node("VerifyResample", inputs, ["t2", "n2"], 10)
    with pytest.raises(ValueError, match=r"carry different optional outputs \(logprobs; none\)"):
        functions.function_for("VerifyResample", [full, lean])
    with pytest.raises(ValueError, match="TiledArgmax has no optional output"):
        functions.single_op_model("TiledArgmax", TensorProto.FLOAT, 10, outputs=("max_logit",))


@pytest.mark.parametrize("dtype", list(FLOAT_TYPES), ids=str)
def test_tiled_argmax_body_matches_the_reference(dtype):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(17, 40, generator=g).to(dtype)
    lm_head = torch.randn(4160, 40, generator=g).to(dtype)
    session = _session(functions.single_op_model("TiledArgmax", FLOAT_TYPES[dtype], 4099))
    token, max_logit = session.run(None, dict(hidden=_numpy(hidden), lm_head=_numpy(lm_head)))
    r_token, r_max = ops.tiled_argmax(hidden, lm_head, 4099)
    np.testing.assert_array_equal(token, r_token.numpy())
    np.testing.assert_allclose(max_logit, r_max.numpy(), atol=LOGIT_ATOL)


def test_noise_in_onnx_reproduces_the_vectors():
    """Bits and uniforms exactly, Gumbel values to an ulp: the frozen contract of noise.py."""
    outputs = {}
    for stream in (0, 1, 2):
        b = Body("noise")
        key_a, key_b = noise.row_keys(b, "seed", "position", stream)
        bits = noise.token_bits(b, key_a, key_b, "token")
        values = [
            ("bits", bits, TensorProto.INT64),
            ("uniform", noise.uniform_from_bits(b, bits), TensorProto.FLOAT),
            ("gumbel", noise.gumbel_from_bits(b, bits), TensorProto.FLOAT),
        ]
        nodes = [*b.nodes, *(helper.make_node("Identity", [v], [n]) for n, v, _ in values)]
        graph = helper.make_graph(
            nodes,
            "noise",
            [
                helper.make_tensor_value_info(n, TensorProto.INT64, ["M"])
                for n in ("seed", "position", "token")
            ],
            [helper.make_tensor_value_info(n, t, ["M"]) for n, _, t in values],
        )
        model = helper.make_model(
            graph, opset_imports=functions.OPSET_IMPORTS[:1], ir_version=functions.IR_VERSION
        )
        onnx.checker.check_model(model, full_check=True)
        rows = [v for v in VECTORS["vectors"] if v["stream"] == stream]
        feed = {
            k: np.array([v[k] for v in rows], dtype=np.int64) for k in ("seed", "position", "token")
        }
        outputs[stream] = (rows, _session(model).run(None, feed))
    for rows, (bits, uniform, gumbel) in outputs.values():
        np.testing.assert_array_equal(bits, [v["bits"] for v in rows])
        np.testing.assert_array_equal(uniform, np.array([v["uniform"] for v in rows], np.float32))
        np.testing.assert_allclose(
            gumbel, [v["gumbel"] for v in rows], rtol=GUMBEL_RTOL, atol=GUMBEL_ATOL
        )


def test_token_zero_shortcut_is_the_same_hash():
    """The acceptance uniform hashes token id 0 without the multiply: the same integers."""
    b = Body("zero")
    key_a, key_b = noise.row_keys(b, "seed", "position", 0)
    with_multiply = noise.token_bits(b, key_a, key_b, b.const(0, np.int64))
    shortcut = noise.token_bits(b, key_a, key_b, None)
    nodes = [
        *b.nodes,
        helper.make_node("Identity", [with_multiply], ["a"]),
        helper.make_node("Identity", [shortcut], ["b"]),
    ]
    graph = helper.make_graph(
        nodes,
        "zero",
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["M"]) for n in ("seed", "position")],
        [helper.make_tensor_value_info(n, TensorProto.INT64, ["M"]) for n in ("a", "b")],
    )
    model = helper.make_model(
        graph, opset_imports=functions.OPSET_IMPORTS[:1], ir_version=functions.IR_VERSION
    )
    seeds = np.array([0, 1, 2**40, 2**63 - 1], dtype=np.int64)
    a, b_ = _session(model).run(None, dict(seed=seeds, position=np.arange(4, dtype=np.int64)))
    np.testing.assert_array_equal(a, b_)
