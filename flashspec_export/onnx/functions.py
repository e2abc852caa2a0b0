"""The ONNX face of the FlashSpec ops: custom nodes in domain ``flashspec`` whose model-local
function bodies are the standard-op decomposition (materialised, like backend "standard", but
sampling with Gumbel-max on the logits as the reference does).

ONNX Runtime inlines the function and runs the body; TensorRT (10.15+) resolves the node to the
plugin named by ``op_type`` / ``plugin_namespace`` / ``plugin_version``; where no plugin is
registered (TensorRT-RTX) the parser inlines the body, which uses only ops it accepts.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper

from flashspec_export.onnx import noise, schemas  # schemas register on import
from flashspec_export.onnx.builder import Body
from flashspec_export.ops import specs
from flashspec_export.reference import noise as spec
from flashspec_export.reference.verify_resample import GREEDY_BELOW

DOMAIN = schemas.DOMAIN
DOMAIN_VERSION = schemas.DOMAIN_VERSION
OPSET = 18
IR_VERSION = 10
PLUGIN_VERSION = specs.PLUGIN_VERSION
I64, F32 = np.int64, np.float32
_BIG = 2**31 - 1  # "to the end" for Slice (TensorRT wants int32-range bounds)
OPSET_IMPORTS = [helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]


def _rows_before_last(b: Body, x: str) -> str:
    """x[:, :-1] — the γ draft rows of a [N, γ + 1, ...] value."""
    return b.op("Slice", x, b.const([0], I64), b.const([-1], I64), b.const([1], I64))


def _fence(b: Body, x: str) -> str:
    """``x`` unchanged (a CumSum over a new unit axis), but materialised by TensorRT.

    Myelin (TensorRT-RTX's compiler) fuses a chain of elementwise ops into the reduction that
    consumes it, and its build time grows exponentially with the depth of that chain (about 5x
    per hash round): the noise hash feeding ArgMax never finishes building. CumSum is not fused
    with its neighbours, so the chain ends here in a kernel of its own. A Cast round trip,
    Reshape or Gather do not fence it; TopK does but sorts.
    """
    axis = b.const([-1], I64)
    return b.op("Squeeze", b.op("CumSum", b.op("Unsqueeze", x, axis), b.const(-1, I64)), axis)


def _logits(b: Body, hidden: str, lm_head: str, vocab_size: str) -> str:
    """fp32 ``hidden · lm_head[:vocab_size]ᵀ`` ([..., V]), NaN as -inf (``reference.no_nan``)."""
    end = b.op("Unsqueeze", vocab_size, b.const([0], I64))
    rows = b.op("Slice", lm_head, b.const([0], I64), end, b.const([0], I64))
    weight = b.op("Transpose", b.op("Cast", rows, to=TensorProto.FLOAT), perm=[1, 0])
    dots = b.op("MatMul", b.op("Cast", hidden, to=TensorProto.FLOAT), weight)
    return b.op("Where", b.op("IsNaN", dots), b.const(-np.inf, F32), dots)


def tiled_argmax_function() -> onnx.FunctionProto:
    """``TiledArgmax(hidden [N, H], lm_head [V, H]) -> token [N] int64, max_logit [N] float``."""
    b = Body("ta")
    logits = _logits(b, "hidden", "lm_head", b.attr_int("vocab_size"))  # [N, V]
    token = b.op("ArgMax", logits, axis=1, keepdims=0, select_last_index=0)
    max_logit = b.op("ReduceMax", logits, b.const([1], I64), keepdims=0)
    return b.function(
        DOMAIN,
        "TiledArgmax",
        ["hidden", "lm_head"],
        [("token", token), ("max_logit", max_logit)],
        OPSET_IMPORTS,
        ["vocab_size"],
    )


def verify_resample_function() -> onnx.FunctionProto:
    """``VerifyResample(hidden [N, γ+1, H], lm_head [V, H], draft_tokens [N, γ], temperature [N],
    seed [N], positions [N]) -> tokens [N, γ+1], num_emitted [N], logprobs [N, γ+1]``.

    Per row i: ``y_i = argmax_v (l_v + g_v)`` (greedy: ``argmax_v l_v``); drafts are accepted
    while ``x == y``; the step emits ``y_0 .. y_k``. Log-probabilities: ``l(y) - LSE``.
    """
    b = Body("vr")
    one_f, zero_f = b.const(1.0, F32), b.const(0.0, F32)
    vocab_size = b.attr_int("vocab_size")  # scalar
    unsqueeze2 = b.const([2], I64)

    # Logits and their log-sum-exp: [N, R, V], [N, R]  (R = γ + 1)
    greedy = b.op("Less", "temperature", b.const(GREEDY_BELOW, F32))  # [N]: T < 1e-5 is greedy
    scale = b.op("Where", greedy, one_f, "temperature")
    logits = b.op(
        "Div",
        _logits(b, "hidden", "lm_head", vocab_size),
        b.op("Unsqueeze", scale, b.const([1, 2], I64)),
    )
    peak = b.op("ReduceMax", logits, b.const([-1], I64), keepdims=1)
    total = b.op(
        "ReduceSum", b.op("Exp", b.op("Sub", logits, peak)), b.const([-1], I64), keepdims=1
    )
    lse = b.op("Squeeze", b.op("Add", peak, b.op("Log", total)), unsqueeze2)

    # Noise keys per row: position of row i is positions + i.
    rows = b.op("Gather", b.op("Shape", "hidden"), b.const(1, I64), axis=0)
    row_ids = b.op("Range", b.const(0, I64), rows, b.const(1, I64))  # [R]
    row_pos = b.op("Add", b.op("Unsqueeze", "positions", b.const([1], I64)), row_ids)  # [N, R]
    seed = b.op("Unsqueeze", "seed", b.const([1], I64))  # [N, 1]
    token = b.op("Range", b.const(0, I64), vocab_size, b.const(1, I64))  # [V]

    # y = argmax (l + g) (greedy rows: argmax l), lowest index on ties.
    key_a, key_b = noise.row_keys(b, seed, row_pos, spec.STREAM_GUMBEL)
    bits = noise.token_bits(
        b, b.op("Unsqueeze", key_a, unsqueeze2), b.op("Unsqueeze", key_b, unsqueeze2), token
    )  # [N, R, V]
    gumbel = _fence(b, noise.gumbel_from_bits(b, bits))  # [N, R, V], see _fence
    greedy3 = b.op("Unsqueeze", greedy, b.const([1, 2], I64))
    score = b.op("Where", greedy3, logits, b.op("Add", logits, gumbel))
    best = b.op("ArgMax", score, axis=2, keepdims=1, select_last_index=0)  # [N, R, 1]
    best_logit = b.op("Squeeze", b.op("GatherElements", logits, best, axis=2), unsqueeze2)
    y = b.op("Squeeze", best, unsqueeze2)  # [N, R]

    # k = number of leading drafts equal to y: rows before the first mismatch.
    accept = b.op("Equal", "draft_tokens", _rows_before_last(b, y))  # [N, γ]
    rejects = b.op(
        "CumSum", b.op("Cast", b.op("Not", accept), to=TensorProto.INT64), b.const(1, I64)
    )
    leading = b.op("Cast", b.op("Equal", rejects, b.const(0, I64)), to=TensorProto.INT64)
    k = b.op("ReduceSum", leading, b.const([1], I64), keepdims=1)  # [N, 1]

    emitted = b.op("LessOrEqual", row_ids, k)  # [N, R]: rows 0 .. k
    tokens = b.op("Where", emitted, y, b.const(-1, I64))
    logprobs = b.op("Where", emitted, b.op("Sub", best_logit, lse), zero_f)
    num_emitted = b.op("Squeeze", b.op("Add", k, b.const(1, I64)), b.const([1], I64))
    return b.function(
        DOMAIN,
        "VerifyResample",
        ["hidden", "lm_head", "draft_tokens", "temperature", "seed", "positions"],
        [("tokens", tokens), ("num_emitted", num_emitted), ("logprobs", logprobs)],
        OPSET_IMPORTS,
        ["vocab_size"],
    )


def plugin_node(op_type: str, inputs, outputs, vocab_size: int, name: str | None = None):
    """A ``flashspec`` custom node as TensorRT resolves it to its plugin."""
    if not 0 < vocab_size < 2**31:
        raise ValueError(f"vocab_size: expected 1 <= vocab_size < 2**31 (int32), got {vocab_size}")
    return helper.make_node(
        op_type,
        list(inputs),
        list(outputs),
        name=name or op_type,
        domain=DOMAIN,
        vocab_size=vocab_size,
        plugin_namespace=DOMAIN,
        plugin_version=PLUGIN_VERSION,
    )


# ONNX op_type (= TensorRT plugin name) -> builder of its function body, from the op specs
FUNCTIONS = {spec.op_type: globals()[spec.onnx_body] for spec in specs.SPECS.values()}

_ELEMENT_TYPES = {"int64": TensorProto.INT64, "float32": TensorProto.FLOAT}


def single_op_model(op_type: str, float_type: int, vocab_size: int) -> onnx.ModelProto:
    """A model of one ``flashspec`` node with its function: the unit an engine test builds.

    float_type : ``TensorProto.FLOAT`` / ``FLOAT16`` / ``BFLOAT16`` for hidden and lm_head
    """
    spec = specs.BY_OP_TYPE[op_type]

    def value(arg: specs.TensorArg):
        element = float_type if arg.dtype == "T" else _ELEMENT_TYPES[arg.dtype]
        return helper.make_tensor_value_info(arg.name, element, list(arg.shape))

    names = [a.name for a in spec.inputs], [a.name for a in spec.outputs]
    graph = helper.make_graph(
        [plugin_node(op_type, *names, vocab_size)],
        f"flashspec_{op_type}",
        [value(a) for a in spec.inputs],
        [value(a) for a in spec.outputs],
    )
    model = helper.make_model(
        graph,
        opset_imports=OPSET_IMPORTS,
        functions=[FUNCTIONS[op_type]()],
        ir_version=IR_VERSION,
        producer_name="flashspec_export",
    )
    return model
