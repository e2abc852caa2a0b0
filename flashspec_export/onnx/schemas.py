"""ONNX op schemas of the ``flashspec`` domain (version 1), derived from the op specs
(``ops/specs.py``) and registered on import.

The schemas document the nodes' inputs, outputs and attributes for ``onnx.checker`` and let the
torch exporter emit the custom nodes; the computation is the model-local function body.
"""

from __future__ import annotations

import onnx
from onnx.defs import OpSchema

from flashspec_export.ops import specs

DOMAIN = specs.DOMAIN
DOMAIN_VERSION = 1
FLOATS = ["tensor(float)", "tensor(float16)", "tensor(bfloat16)"]
_TYPES = {
    "T": "T",
    "int64": "tensor(int64)",
    "int32": "tensor(int32)",
    "float32": "tensor(float)",
}


def type_string(arg: specs.TensorArg) -> str:
    """The ONNX type string of an op argument ("T" for the float type of hidden / lm_head)."""
    return _TYPES[arg.dtype]


INT = OpSchema.AttrType.INT
_OPTION = {
    False: OpSchema.FormalParameterOption.Single,
    True: OpSchema.FormalParameterOption.Optional,
}


def _schema(spec: specs.OpSpec) -> OpSchema:
    def params(args):
        return [
            OpSchema.FormalParameter(
                a.name,
                type_string(a),
                f"[{', '.join(a.shape)}] {a.doc}",
                param_option=_OPTION[a.optional],
            )
            for a in args
        ]

    return OpSchema(
        spec.op_type,
        DOMAIN,
        DOMAIN_VERSION,
        f"FlashSpec {spec.op_type}: {spec.doc}; TensorRT resolves it to the plugin of that name.",
        inputs=params(spec.inputs),
        outputs=params(spec.outputs),
        type_constraints=[("T", FLOATS, "hidden and LM-head dtype")],
        attributes=[
            *(OpSchema.Attribute(a, INT, doc) for a, doc in spec.attributes.items()),
            *(
                OpSchema.Attribute(
                    f"return_{a.name}",
                    INT,
                    f"0: the node leaves out output {a.name} (absent: 1)",
                    required=False,
                )
                for a in spec.outputs
                if a.optional
            ),
            OpSchema.Attribute("plugin_namespace", OpSchema.AttrType.STRING, DOMAIN),
            OpSchema.Attribute("plugin_version", OpSchema.AttrType.STRING, specs.PLUGIN_VERSION),
        ],
    )


def register() -> None:
    """Register the schemas of every op spec once per process."""
    for spec in specs.SPECS.values():
        if not onnx.defs.has(spec.op_type, DOMAIN):
            onnx.defs.register_schema(_schema(spec))


register()
