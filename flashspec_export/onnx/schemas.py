"""ONNX op schemas of the ``flashspec`` domain (version 1), registered on import.

The schemas document the nodes' inputs, outputs and attributes for ``onnx.checker`` and let the
torch exporter emit the custom nodes; the computation is the model-local function body.
"""

from __future__ import annotations

import onnx
from onnx.defs import OpSchema

DOMAIN = "flashspec"
DOMAIN_VERSION = 1
FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]

# op_type -> (inputs, outputs) as (name, type string or "T", symbolic shape, doc)
IO = {
    "TiledArgmax": (
        [("hidden", "T", ["N", "H"], ""), ("lm_head", "T", ["V", "H"], "")],
        [
            ("token", "tensor(int64)", ["N"], "argmax, lowest index on ties"),
            ("max_logit", "tensor(float)", ["N"], ""),
        ],
    ),
    "VerifyResample": (
        [
            ("hidden", "T", ["N", "R", "H"], "R = gamma + 1"),
            ("lm_head", "T", ["V", "H"], ""),
            ("draft_tokens", "tensor(int64)", ["N", "G"], "G = gamma"),
            ("temperature", "tensor(float)", ["N"], "0 = greedy"),
            ("seed", "tensor(int64)", ["N"], ""),
            ("positions", "tensor(int64)", ["N"], "absolute position of row 0"),
        ],
        [
            ("tokens", "tensor(int64)", ["N", "R"], "emitted tokens, then -1"),
            ("num_emitted", "tensor(int64)", ["N"], "in 1..gamma + 1"),
            ("logprobs", "tensor(float)", ["N", "R"], "0 past num_emitted"),
        ],
    ),
}


def _schema(op_type: str) -> OpSchema:
    inputs, outputs = IO[op_type]
    param = OpSchema.FormalParameter
    return OpSchema(
        op_type,
        DOMAIN,
        DOMAIN_VERSION,
        f"FlashSpec {op_type} (docs/DESIGN.md); TensorRT resolves it to the plugin of that name.",
        inputs=[param(name, type_str, f"{shape} {doc}") for name, type_str, shape, doc in inputs],
        outputs=[param(name, type_str, f"{shape} {doc}") for name, type_str, shape, doc in outputs],
        type_constraints=[("T", FLOATS, "hidden and LM-head dtype")],
        attributes=[
            OpSchema.Attribute("vocab_size", OpSchema.AttrType.INT, "logical vocabulary"),
            OpSchema.Attribute("plugin_namespace", OpSchema.AttrType.STRING, "flashspec"),
            OpSchema.Attribute("plugin_version", OpSchema.AttrType.STRING, "1"),
        ],
    )


def register() -> None:
    """Register the schemas once per process."""
    for op_type in IO:
        if not onnx.defs.has(op_type, DOMAIN):
            onnx.defs.register_schema(_schema(op_type))


register()
