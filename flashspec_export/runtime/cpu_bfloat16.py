"""bf16 graphs on onnxruntime's CPU provider, which has no bf16 arithmetic kernels.

``widen`` rewrites a bf16 graph so that every op computes in fp32 and rounds each bf16 result to
bf16 (a Cast to bf16 and back), which is what PyTorch's CPU kernels do for bf16 tensors: the
values are those of bf16 execution, only carried in fp32 containers. The graph's bf16 inputs and
outputs become fp32 (every bf16 value is exact in fp32), so callers feed and read fp32.

Matrix products still sum in a different order than PyTorch's, so a result can round to the
neighbouring bf16 value now and then; ``scripts/generate.py --check`` reports how often that
changes a token.
"""

from __future__ import annotations

import onnx
from onnx import TensorProto, helper

BF16, F32 = TensorProto.BFLOAT16, TensorProto.FLOAT
# Ops that only move or select values: their results are bf16 values already, so they need no
# rounding, and TensorScatter's output stays the graph's present cache (written in place when
# bound to the past cache's buffer).
MOVES = {
    "Concat", "Expand", "Gather", "Identity", "Reshape", "ScatterElements", "Slice", "Squeeze",
    "TensorScatter", "Transpose", "Unsqueeze",
}  # fmt: skip


def is_bfloat16(model: onnx.ModelProto) -> bool:
    """Whether any input, output or initializer of the graph is bf16."""
    g = model.graph
    return any(v.type.tensor_type.elem_type == BF16 for v in [*g.input, *g.output]) or any(
        t.data_type == BF16 for t in g.initializer
    )


def _cast(source: str, to: int, name: str) -> onnx.NodeProto:
    return helper.make_node("Cast", [source], [name], to=to, name=f"widen_{name}")


def widen(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` (initializers may stay external) with its bf16 arithmetic done in fp32 and
    rounded to bf16 after every op; its bf16 inputs and outputs typed fp32. Needs the type of
    every value (``torch.onnx.export`` records them); refuses a graph that lacks them."""
    g = model.graph
    types = {v.name: v.type.tensor_type.elem_type for v in [*g.input, *g.value_info, *g.output]}
    types.update({t.name: t.data_type for t in g.initializer})
    untyped = [o for n in g.node for o in n.output if o and o not in types]
    if untyped:
        raise ValueError(f"model: values without a recorded type, e.g. {untyped[:3]}")

    prologue = []  # bf16 initializers -> fp32 values of the same name
    for tensor in g.initializer:
        if tensor.data_type == BF16:
            source = f"{tensor.name}__bf16"
            prologue.append(_cast(source, F32, tensor.name))
            tensor.name = source
    nodes = []
    for node in g.node:
        nodes.append(node)
        if node.op_type in MOVES and node.domain == "":
            continue
        for i, name in enumerate(node.output):
            if types.get(name) == BF16:  # compute wide, round to bf16, carry in fp32
                node.output[i] = f"{name}__wide"
                nodes.append(_cast(node.output[i], BF16, f"{name}__bf16"))
                nodes.append(_cast(f"{name}__bf16", F32, name))
    del g.node[:]
    g.node.extend(prologue + nodes)
    for value in [*g.input, *g.output, *g.value_info]:
        if value.type.tensor_type.elem_type == BF16:
            value.type.tensor_type.elem_type = F32
    return model
