"""The ONNX face of the FlashSpec ops: custom nodes in domain ``flashspec`` whose model-local
function bodies are the standard-op decomposition (materialised, like backend "standard", but
sampling with Gumbel-max on the logits as the reference does).

ONNX Runtime inlines the function and runs the body; TensorRT (10.15+) resolves the node to the
plugin named by ``op_type`` / ``plugin_namespace`` / ``plugin_version``; where no plugin is
registered (TensorRT-RTX) the parser inlines the body, which uses only ops it accepts.

Optional inputs (``VerifyResample``'s ``top_k``, ``top_p``, ``allowed_tokens``): a function body
cannot ask whether an input was given (inlined, an absent one is an empty name, which a node
that reads it refuses, and ``OptionalHasElement`` / ``If`` are not for TensorRT), so the body is
chosen when the model is built: every builder takes the optional inputs its nodes carry
(``present``) and the model holds the body for exactly those (``function_for``). Its formal
inputs are the spec's up to the last present one, as many as the node has (TensorRT's parser
requires that); a body reads only the present ones, and with none present it is the
untruncated body, node for node. All nodes of one op in a model carry the same ones.

Optional outputs (``VerifyResample``'s ``logprobs``) are chosen the same way: a node that leaves
one out (or names it "") gets a body that does not compute it (no log-sum-exp) and the attribute
``return_logprobs = 0``, which the plugin reads (TensorRT hands it node attributes, not the
output count); a node with every output has no such attribute and today's body.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from flashspec_export.onnx import noise, schemas  # schemas register on import
from flashspec_export.onnx.builder import Body
from flashspec_export.ops import specs
from flashspec_export.reference import noise as spec
from flashspec_export.reference import verify_resample as spec_vr
from flashspec_export.reference.truncation import WORD_BITS
from flashspec_export.reference.verify_resample import GREEDY_BELOW

DOMAIN = schemas.DOMAIN
DOMAIN_VERSION = schemas.DOMAIN_VERSION
OPSET = 18
IR_VERSION = 10
PLUGIN_VERSION = specs.PLUGIN_VERSION
I64, F32 = np.int64, np.float32
_BIG = 2**31 - 1  # "to the end" for Slice (TensorRT wants int32-range bounds)
OPSET_IMPORTS = [helper.make_opsetid("", OPSET), helper.make_opsetid(DOMAIN, DOMAIN_VERSION)]


def _check_optional(op_type: str, present: Collection[str], outputs: Collection[str]) -> None:
    """Refuse an optional input (``present``) or output (``outputs``) the spec lacks, naming it."""
    spec = specs.BY_OP_TYPE[op_type]
    for argument, names, args, kind, verb in (
        ("present", present, spec.inputs, "input", "takes"),
        ("outputs", outputs, spec.outputs, "output", "has"),
    ):
        optional = [a.name for a in args if a.optional]
        unknown = sorted(set(names) - set(optional))
        if unknown:
            raise ValueError(
                f"{argument}: {op_type} has no optional {kind} {', '.join(unknown)}; it {verb} "
                f"{', '.join(optional) or 'none'}"
            )


def formal_inputs(op_type: str, present: Collection[str]) -> list[str]:
    """The formal inputs of the body for ``present``: the spec's, up to the last present one
    (TensorRT's parser wants as many as the node has inputs)."""
    names = [a.name for a in specs.BY_OP_TYPE[op_type].inputs]
    given = [
        i
        for i, a in enumerate(specs.BY_OP_TYPE[op_type].inputs)
        if not a.optional or a.name in present
    ]
    return names[: given[-1] + 1]


def present_inputs(op_type: str, inputs: Sequence[str]) -> frozenset[str]:
    """The optional inputs a node of ``op_type`` with these input names carries (an empty name
    skips one)."""
    pairs = zip(specs.BY_OP_TYPE[op_type].inputs, inputs, strict=False)  # trailing ones left out
    return frozenset(a.name for a, name in pairs if a.optional and name)


def skipped_inputs(op_type: str, inputs: Sequence[str]) -> list[str]:
    """The optional inputs a node of ``op_type`` with these input names skips (an empty name
    before a given one), which TensorRT's parser refuses."""
    pairs = zip(specs.BY_OP_TYPE[op_type].inputs, inputs, strict=False)  # trailing ones left out
    return [a.name for a, name in pairs if a.optional and not name]


def present_outputs(op_type: str, outputs: Sequence[str]) -> frozenset[str]:
    """The optional outputs a node of ``op_type`` with these output names produces (a trailing
    one left out or given an empty name is not computed)."""
    pairs = zip(specs.BY_OP_TYPE[op_type].outputs, outputs, strict=False)
    return frozenset(a.name for a, name in pairs if a.optional and name)


def all_outputs(op_type: str) -> frozenset[str]:
    """Every optional output of ``op_type`` (what a node that names all its outputs has)."""
    return frozenset(a.name for a in specs.BY_OP_TYPE[op_type].outputs if a.optional)


def output_attributes(op_type: str, outputs: Collection[str]) -> dict[str, int]:
    """The node attributes that tell a plugin which optional outputs it produces: ``return_<name>
    = 0`` for each one left out (absent: 1, every output, as nodes without them always had)."""
    return {
        f"return_{a.name}": 0
        for a in specs.BY_OP_TYPE[op_type].outputs
        if a.optional and a.name not in outputs
    }


def _check_output_attributes(op_type: str, node: onnx.NodeProto) -> None:
    """Refuse a node whose ``return_<output>`` attributes disagree with the outputs it names (the
    plugin reads the attribute, onnxruntime the outputs)."""
    given = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    outputs = present_outputs(op_type, node.output)
    for arg in specs.BY_OP_TYPE[op_type].outputs:
        if not arg.optional:
            continue
        flag = given.get(f"return_{arg.name}", 1)
        if flag != int(arg.name in outputs):
            raise ValueError(
                f"{op_type} node {node.name!r}: return_{arg.name} = {flag} but the node "
                f"{'names' if arg.name in outputs else 'leaves out'} output {arg.name}; set "
                f"return_{arg.name} = {int(arg.name in outputs)} (or use plugin_node)"
            )


def function_for(op_type: str, nodes: Sequence[onnx.NodeProto]) -> onnx.FunctionProto:
    """The function body of ``op_type`` for a model whose nodes of that type are ``nodes``: the
    body of the optional inputs they carry and the optional outputs they produce, which must be
    the same for all (one function per op in a model)."""
    for node in nodes:
        _check_output_attributes(op_type, node)
    chosen = []
    for side, present_of, default in (
        ("inputs", lambda node: present_inputs(op_type, node.input), frozenset()),
        ("outputs", lambda node: present_outputs(op_type, node.output), all_outputs(op_type)),
    ):
        kinds = {present_of(node) for node in nodes} or {default}
        if len(kinds) > 1:
            shown = "; ".join(sorted(", ".join(sorted(k)) or "none" for k in kinds))
            raise ValueError(
                f"{op_type}: the nodes of one model carry different optional {side} ({shown}); "
                "one function body serves them all, so give every node the same ones"
            )
        chosen.append(kinds.pop())
    present, outputs = chosen
    function = FUNCTIONS[op_type](present, outputs)
    _name_skipped_outputs(function, op_type, max((len(node.output) for node in nodes), default=0))
    return function


def _name_skipped_outputs(function: onnx.FunctionProto, op_type: str, width: int) -> None:
    """Give ``function`` as many outputs as the widest node names (onnxruntime binds a node's
    outputs to the function's by position and wants no more of them): an optional output a
    node skips by an empty name is, in the body, an empty constant, never computed or read."""
    names = [a.name for a in specs.BY_OP_TYPE[op_type].outputs]
    for name in names[len(function.output) : width]:
        empty = helper.make_tensor(f"{name}_skipped", TensorProto.FLOAT, [0], [])
        function.node.append(helper.make_node("Constant", [], [name], value=empty))
        function.output.append(name)


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


def tiled_argmax_function(
    present: Collection[str] = (), outputs: Collection[str] = ()
) -> onnx.FunctionProto:
    """``TiledArgmax(hidden [N, H], lm_head [V, H]) -> token [N] int64, max_logit [N] float``."""
    _check_optional("TiledArgmax", present, outputs)
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


def _allowed(b: Body, allowed_tokens: str, token: str) -> str:
    """[N, R, V] bool: bit ``v % 32`` of word ``v // 32`` of each row's ``allowed_tokens``
    ([N, R, W] int32), in int64 Div / Mod (TensorRT refuses bitwise ops): the word as its
    unsigned value, divided by 2^(v % 32), mod 2."""
    bits = b.const(WORD_BITS, I64)
    word = b.op("Gather", allowed_tokens, b.op("Div", token, bits), axis=2)  # [N, R, V] int32
    word = b.op("Cast", word, to=TensorProto.INT64)
    two32 = b.const(2**WORD_BITS, I64)
    unsigned = b.op("Where", b.op("Less", word, b.const(0, I64)), b.op("Add", word, two32), word)
    powers = b.const([2**j for j in range(WORD_BITS)], I64)
    shifted = b.op("Div", unsigned, b.op("Gather", powers, b.op("Mod", token, bits), axis=0))
    return b.op("Equal", b.op("Mod", shifted, b.const(2, I64)), b.const(1, I64))


# Order keys: the signed integers K in [key(-inf), key(+inf)] stand for the floats in order, K >= 0
# for the float whose bits are K, K < 0 for the negation of the one whose bits are -K - 1 (so -1
# is -0.0, equal to 0 = +0.0). Between two floats lie no keys, so a search over keys ends on a
# float exactly, in 32 halvings.
_MANTISSA = 2**23  # an fp32 magnitude's bits: exponent field · 2^23 + mantissa field
_INF_KEY = 0x7F800000  # key(+inf); key(-inf) = -_INF_KEY - 1
_KEY_BITS = 32  # key(+inf) - key(-inf) < 2^32


def _key_value(b: Body):
    """A function of ``b`` from order keys (int64, any shape) to their fp32 values, by integer
    arithmetic on the magnitude's exponent field e and mantissa field m: ``(2^23 + m) ·
    2^(e - 150)`` (subnormal, e = 0: ``m · 2^-149``). Both factors and their product are exact;
    e = 255 overflows to inf. Its constants are made once."""
    zero, minus_one, one = b.const(0, I64), b.const(-1, I64), b.const(1, I64)
    mantissa_bits = b.const(_MANTISSA, I64)
    scales = b.const([2.0 ** (max(e, 1) - 150) for e in range(256)], F32)  # 2^(e - 127 - 23)

    def value(key: str) -> str:
        negative = b.op("Less", key, zero)
        magnitude = b.op("Where", negative, b.op("Sub", minus_one, key), key)
        exponent = b.op("Div", magnitude, mantissa_bits)
        mantissa = b.op("Mod", magnitude, mantissa_bits)
        implicit = b.op("Add", mantissa, mantissa_bits)  # the leading 1 of a normal float
        significand = b.op("Where", b.op("Greater", exponent, zero), implicit, mantissa)
        scale = b.op("Gather", scales, b.op("Max", exponent, one), axis=0)
        magnitude = b.op("Mul", b.op("Cast", significand, to=TensorProto.FLOAT), scale)
        return b.op("Where", negative, b.op("Neg", magnitude), magnitude)

    return value


def _cutoff(b: Body, logits: str, probs: str | None, target: str) -> str:
    """[N, R, V] bool: the tokens of ``logits`` [N, R, V] in descending order, ties by lower id,
    each kept while the weight strictly before it is below ``target`` [N, 1, 1] — top-k: each
    token weighs 1 (``probs`` None), ``target`` k (int32); top-p: a token weighs its ``probs``
    [N, R, V], ``target`` p.

    No sort (TensorRT's TopK takes K <= 3840): the last kept logit t is the largest float whose
    tokens at or above it weigh at least the target (the weight before a token reaches the
    target inside t's tie group). It is found by bisection on its order key, setting the bits
    from the highest — 32 masked sums over the row, exact because there is no key between two
    floats. Then the tokens above t are kept, those below it not, and those equal to it in id
    order while ``weight above t + rank · weight(t)`` is below the target. A row that weighs
    less than the target has t = -inf: every token is kept. The sums must be monotone in the set
    summed (non-negative weights in a fixed order)."""
    counting = probs is None
    last_axis = b.const([-1], I64)
    zero = None if counting else b.const(0.0, F32)

    def weight_of(mask: str) -> str:  # [N, R, 1]
        if counting:
            return b.op("ReduceSum", b.op("Cast", mask, to=TensorProto.INT32), last_axis)
        return b.op("ReduceSum", b.op("Where", mask, probs, zero), last_axis, keepdims=1)

    value = _key_value(b)
    top = b.const(_INF_KEY, I64)
    key = b.op("Expand", b.const(-_INF_KEY - 1, I64), b.op("Shape", target))  # [N, 1, 1]: -inf
    for bit in reversed(range(_KEY_BITS)):
        candidate = b.op("Min", b.op("Add", key, b.const(2**bit, I64)), top)
        reached = weight_of(b.op("GreaterOrEqual", logits, value(candidate)))
        key = b.op("Where", b.op("GreaterOrEqual", reached, target), candidate, key)  # [N, R, 1]
    limit = value(key)
    above = b.op("Greater", logits, limit)
    tied = b.op("Equal", logits, limit)
    ties = b.op("Cast", tied, to=TensorProto.INT32)
    rank = b.op("Sub", b.op("CumSum", ties, last_axis), ties)  # the tied tokens of lower id
    if counting:
        before = b.op("Add", weight_of(above), rank)
    else:
        tied_weight = b.op("ReduceMax", b.op("Where", tied, probs, zero), last_axis, keepdims=1)
        spread = b.op("Mul", b.op("Cast", rank, to=TensorProto.FLOAT), tied_weight)
        before = b.op("Add", weight_of(above), spread)
    return b.op("Or", above, b.op("And", tied, b.op("Less", before, target)))


def _kept(b: Body, logits: str, vocab_size: str, present) -> str:
    """[N, R, V] bool: the tokens the request's truncation keeps of ``logits`` [N, R, V]
    (``reference/truncation.py``): the allowed-token mask first, then, of the finite masked
    logits, the top-k, then the top-p nucleus of their renormalised law (``_cutoff``).

    Exact as the reference (a stable sort) in which tokens top-k keeps and in the order
    top-p walks; the mass before a token is summed in another order than the reference's
    cumulative sum, so a token whose mass-before lies within float rounding of p may be kept by
    one and not the other (as in ``kernels/verify_resample.py``). A row without a finite logit
    keeps none here and token 0 in the reference: alike, since its sample is token 0 and its
    log-probability NaN either way."""
    minus_inf = b.const(-np.inf, F32)
    kept = None
    if "allowed_tokens" in present:
        token = b.op("Range", b.const(0, I64), vocab_size, b.const(1, I64))  # [V]
        kept = _allowed(b, "allowed_tokens", token)
    if "top_k" in present or "top_p" in present:
        if kept is not None:
            logits = b.op("Where", kept, logits, minus_inf)
        kept = b.op("Greater", logits, minus_inf)  # the masked-out tokens never
        per_row = b.const([1, 2], I64)
    if "top_k" in present:
        k = b.op("Where", b.op("Greater", "top_k", b.const(0, I64)), "top_k", vocab_size)
        k = b.op("Cast", b.op("Min", k, vocab_size), to=TensorProto.INT32)  # V < 2^31
        kept = b.op("And", kept, _cutoff(b, logits, None, b.op("Unsqueeze", k, per_row)))
    if "top_p" in present:
        last_axis = b.const([-1], I64)
        left = b.op("Where", kept, logits, minus_inf)
        peak = b.op("ReduceMax", left, last_axis, keepdims=1)
        weights = b.op("Exp", b.op("Sub", left, peak))
        probs = b.op("Div", weights, b.op("ReduceSum", weights, last_axis, keepdims=1))
        p = b.op("Unsqueeze", "top_p", per_row)
        nucleus = b.op(
            "Or", b.op("GreaterOrEqual", p, b.const(1.0, F32)), _cutoff(b, logits, probs, p)
        )
        kept = b.op("And", kept, nucleus)
    return kept


def _truncates(b: Body, present) -> str:
    """[N] bool: the sequences top-k (k > 0) or top-p (p < 1) truncates
    (``reference.verify_resample.truncated_rows``)."""
    on = None
    if "top_k" in present:
        on = b.op("Greater", "top_k", b.const(0, I64))
    if "top_p" in present:
        below = b.op("Less", "top_p", b.const(1.0, F32))
        on = below if on is None else b.op("Or", on, below)
    return on


def _block_sample(b: Body, logits: str, seed: str, row_pos: str, vocab_size: str) -> str:
    """[N, R] int64: each row's two-level sample of ``logits [N, R, V]``
    (``reference.verify_resample.block_samples``): the vocabulary in blocks of 64 ids (-inf past
    V), each scored ``M_b + log S_b + g_b``, the best block (lowest on ties) and its pick, the
    count of its running sums at or below ``u_b · S_b``. The running sums in the reference's
    order: CumSum inside each run of 16 ids, plus the exclusive CumSum of the run totals."""
    block, run = spec_vr.SAMPLE_BLOCK, spec_vr.SAMPLE_RUN
    last = b.const([-1], I64)
    pad = b.op(
        "Mod",
        b.op("Sub", b.const(block, I64), b.op("Mod", vocab_size, b.const(block, I64))),
        b.const(block, I64),
    )
    pads = b.op(
        "Concat", b.const([0, 0, 0, 0, 0], I64), b.op("Unsqueeze", pad, b.const([0], I64)), axis=0
    )
    padded = b.op("Pad", logits, pads, b.const(-np.inf, F32))  # [N, R, nb · 64]
    leading = b.op("Slice", b.op("Shape", logits), b.const([0], I64), b.const([2], I64))  # N, R
    shape = b.op("Concat", leading, b.const([-1, block // run, run], I64), axis=0)
    x = b.op("Reshape", padded, shape)  # [N, R, nb, 4, 16]
    m = b.op("ReduceMax", x, b.const([3, 4], I64), keepdims=1)  # [N, R, nb, 1, 1]
    finite = b.op("Not", b.op("IsInf", m))
    zero = b.const(0.0, F32)
    e = b.op("Where", finite, b.op("Exp", b.op("Sub", x, b.op("Where", finite, m, zero))), zero)
    c = b.op("CumSum", e, b.const(4, I64))  # inside each run
    totals = b.op("Gather", c, b.const([run - 1], I64), axis=4)  # [N, R, nb, 4, 1]
    before = b.op("CumSum", totals, b.const(3, I64), exclusive=1)
    sums = b.op("Add", before, c)  # [N, R, nb, 4, 16]
    total = b.op("ReduceMax", sums, b.const([3, 4], I64), keepdims=0)  # S_b: sums never fall
    m = b.op("Squeeze", m, b.const([3, 4], I64))  # [N, R, nb]
    nb = b.op("Gather", b.op("Shape", total), b.const(2, I64), axis=0)
    blocks = b.op("Range", b.const(0, I64), nb, b.const(1, I64))  # [nb]
    unsqueeze2 = b.const([2], I64)
    # One hash chain for both streams ([N, R, 2, nb]: the Gumbel's keys, then the pick's), fenced
    # once: two chains side by side, each fenced, made Myelin's build of the bf16 tiny export run
    # past 10 minutes (2-3 s with either alone).
    keys = [
        noise.row_keys(b, seed, row_pos, stream)
        for stream in (spec.STREAM_GUMBEL, spec.STREAM_PICK)
    ]
    pair = b.const([2, 3], I64)
    key_a = b.op("Concat", *(b.op("Unsqueeze", k[0], pair) for k in keys), axis=2)  # [N, R, 2, 1]
    key_b = b.op("Concat", *(b.op("Unsqueeze", k[1], pair) for k in keys), axis=2)
    bits = _fence(b, noise.token_bits(b, key_a, key_b, blocks))  # [N, R, 2, nb]
    g = noise.gumbel_from_bits(b, b.op("Gather", bits, b.const(0, I64), axis=2))  # [N, R, nb]
    u = noise.uniform_from_bits(b, b.op("Gather", bits, b.const(1, I64), axis=2))
    flat = b.op("Concat", b.op("Shape", total), b.const([block], I64), axis=0)
    sums = b.op("Reshape", sums, flat)  # [N, R, nb, 64]
    target = b.op("Unsqueeze", b.op("Mul", u, total), last)
    below = b.op("Cast", b.op("LessOrEqual", sums, target), to=TensorProto.INT64)
    pick = b.op("ReduceSum", below, last, keepdims=0)
    pick = b.op("Where", b.op("Greater", total, zero), pick, b.const(0, I64))
    pos_inf = b.op(
        "Cast", b.op("IsInf", b.op("Reshape", x, flat), detect_negative=0), to=TensorProto.INT32
    )
    first_inf = b.op("ArgMax", pos_inf, axis=3, keepdims=0, select_last_index=0)
    plus_inf, minus_inf = b.const(np.inf, F32), b.const(-np.inf, F32)
    m_pos = b.op("Equal", m, plus_inf)
    pick = b.op("Where", m_pos, first_inf, pick)
    score = b.op("Add", b.op("Add", m, b.op("Log", total)), g)
    score = b.op("Where", m_pos, plus_inf, score)
    score = b.op("Where", b.op("Equal", m, minus_inf), minus_inf, score)
    best = b.op("ArgMax", score, axis=2, keepdims=1, select_last_index=0)  # [N, R, 1]
    chosen = b.op("Squeeze", b.op("GatherElements", pick, best, axis=2), unsqueeze2)
    return b.op("Add", b.op("Mul", b.op("Squeeze", best, unsqueeze2), b.const(block, I64)), chosen)


def verify_resample_function(
    present: Collection[str] = (), outputs: Collection[str] = ("logprobs",)
) -> onnx.FunctionProto:
    """``VerifyResample(hidden [N, γ+1, H], lm_head [V, H], draft_tokens [N, γ], temperature [N],
    seed [N], positions [N][, top_k [N], top_p [N], allowed_tokens [N, γ+1, W]]) -> tokens
    [N, γ+1], num_emitted [N][, logprobs [N, γ+1]]``.

    Per row i: ``y_i`` the two-level sample (``_block_sample``; rows top-k / top-p truncate:
    ``argmax_kept (l_v + g_v)``; greedy: ``argmax_v l_v``); drafts are accepted
    while ``x == y``; the step emits ``y_0 .. y_k``. Log-probabilities: ``l(y) - LSE``.
    ``present``: the optional inputs the nodes carry; with any, the logits outside the
    truncation are -inf before the sample and the LSE (materialised: top-k / top-p by 32
    masked sums over each row, ``_cutoff``, no sort), as in the reference.
    ``outputs``: the optional outputs the nodes produce; without ``logprobs`` the body has no
    LSE (no Exp over the vocabulary, no ``l(y)`` gather) and two outputs.
    """
    _check_optional("VerifyResample", present, outputs)
    b = Body("vr")
    one_f, zero_f = b.const(1.0, F32), b.const(0.0, F32)
    vocab_size = b.attr_int("vocab_size")  # scalar
    unsqueeze2 = b.const([2], I64)

    # Logits [N, R, V]  (R = γ + 1)
    greedy = b.op("Less", "temperature", b.const(GREEDY_BELOW, F32))  # [N]: T < 1e-5 is greedy
    scale = b.op("Where", greedy, one_f, "temperature")
    logits = b.op(
        "Div",
        _logits(b, "hidden", "lm_head", vocab_size),
        b.op("Unsqueeze", scale, b.const([1, 2], I64)),
    )
    if present:  # the truncated logits: what the LSE and the log-probabilities see
        kept = _kept(b, logits, vocab_size, present)
        logits, untruncated = b.op("Where", kept, logits, b.const(-np.inf, F32)), logits
    # Noise keys per row: position of row i is positions + i.
    rows = b.op("Gather", b.op("Shape", "hidden"), b.const(1, I64), axis=0)
    row_ids = b.op("Range", b.const(0, I64), rows, b.const(1, I64))  # [R]
    row_pos = b.op("Add", b.op("Unsqueeze", "positions", b.const([1], I64)), row_ids)  # [N, R]
    seed = b.op("Unsqueeze", "seed", b.const([1], I64))  # [N, 1]
    greedy3 = b.op("Unsqueeze", greedy, b.const([1, 2], I64))

    # y: the two-level sample (greedy rows: argmax l), lowest index on ties.
    y = _block_sample(b, logits, seed, row_pos, vocab_size)  # [N, R]
    y = b.op(
        "Where",
        b.op("Unsqueeze", greedy, b.const([1], I64)),
        b.op("ArgMax", logits, axis=2, keepdims=0),
        y,
    )
    if "top_k" in present or "top_p" in present:
        # Rows that top-k / top-p truncate: argmax over the kept ids of l_v + g_v (g keyed by id).
        key_a, key_b = noise.row_keys(b, seed, row_pos, spec.STREAM_GUMBEL)
        token = b.op("Range", b.const(0, I64), vocab_size, b.const(1, I64))  # [V]
        bits = noise.token_bits(
            b, b.op("Unsqueeze", key_a, unsqueeze2), b.op("Unsqueeze", key_b, unsqueeze2), token
        )  # [N, R, V]
        gumbel = _fence(b, noise.gumbel_from_bits(b, bits))  # [N, R, V], see _fence
        # The same scores as from the truncated logits (a dropped token's -inf + g is -inf),
        # masked after the noise is added: fed the truncated logits, Myelin's build of the
        # hash chain never finishes (as without _fence), the fence notwithstanding.
        score = b.op("Where", greedy3, untruncated, b.op("Add", untruncated, gumbel))
        score = b.op("Where", kept, score, b.const(-np.inf, F32))
        per_id = b.op("ArgMax", score, axis=2, keepdims=0, select_last_index=0)  # [N, R]
        truncates = _truncates(b, present)  # [N]
        y = b.op("Where", b.op("Unsqueeze", truncates, b.const([1], I64)), per_id, y)
    best = b.op("Unsqueeze", y, unsqueeze2)  # [N, R, 1]

    # k = number of leading drafts equal to y: rows before the first mismatch.
    accept = b.op("Equal", "draft_tokens", _rows_before_last(b, y))  # [N, γ]
    rejects = b.op(
        "CumSum", b.op("Cast", b.op("Not", accept), to=TensorProto.INT64), b.const(1, I64)
    )
    leading = b.op("Cast", b.op("Equal", rejects, b.const(0, I64)), to=TensorProto.INT64)
    k = b.op("ReduceSum", leading, b.const([1], I64), keepdims=1)  # [N, 1]

    emitted = b.op("LessOrEqual", row_ids, k)  # [N, R]: rows 0 .. k
    tokens = b.op("Where", emitted, y, b.const(-1, I64))
    num_emitted = b.op("Squeeze", b.op("Add", k, b.const(1, I64)), b.const([1], I64))
    results = [("tokens", tokens), ("num_emitted", num_emitted)]
    if "logprobs" in outputs:  # l(y) - LSE of the (truncated) logits: [N, R]
        last_axis = b.const([-1], I64)
        peak = b.op("ReduceMax", logits, last_axis, keepdims=1)
        total = b.op("ReduceSum", b.op("Exp", b.op("Sub", logits, peak)), last_axis, keepdims=1)
        lse = b.op("Squeeze", b.op("Add", peak, b.op("Log", total)), unsqueeze2)
        best_logit = b.op("Squeeze", b.op("GatherElements", logits, best, axis=2), unsqueeze2)
        results.append(("logprobs", b.op("Where", emitted, b.op("Sub", best_logit, lse), zero_f)))
    return b.function(
        DOMAIN,
        "VerifyResample",
        formal_inputs("VerifyResample", present),
        results,
        OPSET_IMPORTS,
        ["vocab_size"],
    )


def plugin_node(op_type: str, inputs, outputs, vocab_size: int, name: str | None = None):
    """A ``flashspec`` custom node as TensorRT resolves it to its plugin. An optional output
    left out (or named "") gets ``return_<output> = 0``, which tells the plugin not to produce
    it (``output_attributes``)."""
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
        **output_attributes(op_type, present_outputs(op_type, outputs)),
    )


# ONNX op_type (= TensorRT plugin name) -> builder of its function body, from the op specs
FUNCTIONS = {spec.op_type: globals()[spec.onnx_body] for spec in specs.SPECS.values()}

_ELEMENT_TYPES = {
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "float32": TensorProto.FLOAT,
}


def single_op_model(
    op_type: str,
    float_type: int,
    vocab_size: int,
    optional: Collection[str] = (),
    outputs: Collection[str] | None = None,
) -> onnx.ModelProto:
    """A model of one ``flashspec`` node with its function: the unit an engine test builds.

    float_type : ``TensorProto.FLOAT`` / ``FLOAT16`` / ``BFLOAT16`` for hidden and lm_head
    optional : the optional inputs the node and the model take (e.g. ``("top_k", "top_p")``)
    outputs : the optional outputs the node and the model produce (None: all; ``()``:
        VerifyResample without ``logprobs``)
    """
    spec = specs.BY_OP_TYPE[op_type]
    outputs = all_outputs(op_type) if outputs is None else frozenset(outputs)
    _check_optional(op_type, optional, outputs)
    produced = [a for a in spec.outputs if not a.optional or a.name in outputs]
    given = [a for a in spec.inputs if not a.optional or a.name in optional]

    def value(arg: specs.TensorArg):
        element = float_type if arg.dtype == "T" else _ELEMENT_TYPES[arg.dtype]
        return helper.make_tensor_value_info(arg.name, element, list(arg.shape))

    inputs = [a.name if a in given else "" for a in spec.inputs[: spec.inputs.index(given[-1]) + 1]]
    node = plugin_node(op_type, inputs, [a.name for a in produced], vocab_size)
    graph = helper.make_graph(
        [node],
        f"flashspec_{op_type}",
        [value(a) for a in given],
        [value(a) for a in produced],
    )
    model = helper.make_model(
        graph,
        opset_imports=OPSET_IMPORTS,
        functions=[function_for(op_type, [node])],
        ir_version=IR_VERSION,
        producer_name="flashspec_export",
    )
    return model
