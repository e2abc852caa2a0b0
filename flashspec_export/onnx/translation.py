"""``torch.onnx.export`` of modules that call the FlashSpec torch ops.

The custom ops become ``flashspec`` nodes (op_type = plugin name, ``plugin_namespace`` /
``plugin_version`` attributes) and the model carries their function bodies, so ONNX Runtime and
TensorRT-RTX run it and TensorRT with the plugins resolves the nodes.
"""

from __future__ import annotations

import inspect

import onnx
import torch
from onnxscript import values

from flashspec_export.export.weights import WeightsFile
from flashspec_export.onnx import functions, schemas
from flashspec_export.ops import (
    specs,
    torch_ops,  # noqa: F401  (registers torch.ops.flashspec)
)

_FLASHSPEC = values.Opset(schemas.DOMAIN, schemas.DOMAIN_VERSION)
_PLUGIN = {"plugin_namespace": functions.DOMAIN, "plugin_version": functions.PLUGIN_VERSION}


def translation(spec: specs.OpSpec):
    """The onnxscript translation of ``torch.ops.flashspec.<spec.name>``: one ``flashspec`` node
    with the op's attributes and the plugin's namespace and version. Its signature names the
    spec's inputs and int attributes (the exporter binds arguments by that signature)."""
    op = values.Op(_FLASHSPEC, spec.op_type)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    signature = inspect.Signature(
        [inspect.Parameter(a.name, kind) for a in spec.inputs]
        + [inspect.Parameter(a, kind, annotation=int) for a in spec.attributes]
    )

    def translate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs).arguments
        inputs = [bound[a.name] for a in spec.inputs]
        attributes = {a: bound[a] for a in spec.attributes}
        return op(*inputs, **attributes, _outputs=len(spec.outputs), **_PLUGIN)

    translate.__signature__ = signature
    translate.__name__ = f"_{spec.name}"
    return translate


TRANSLATIONS = {
    getattr(torch.ops.flashspec, spec.name).default: translation(spec)
    for spec in specs.SPECS.values()
}


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add the function body of every ``flashspec`` op the graph uses (once each)."""
    used = {n.op_type for n in model.graph.node if n.domain == functions.DOMAIN}
    present = {(f.domain, f.name) for f in model.functions}
    for op_type in sorted(used):
        if (functions.DOMAIN, op_type) not in present:
            model.functions.append(functions.FUNCTIONS[op_type]())
    return model


def export(
    module: torch.nn.Module, args: tuple, weights: WeightsFile | None = None, **kwargs
) -> onnx.ModelProto:
    """Export ``module(*args)`` with the FlashSpec ops as custom nodes plus function bodies.

    With ``weights`` the large initializers are written there and the proto references them
    (external data), so it stays small at any model size; without, they are in the proto."""
    tensors = [a for a in args if isinstance(a, torch.Tensor)]
    for i, a in enumerate(tensors):
        for b in tensors[i + 1 :]:
            if a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.numel():
                raise ValueError(
                    "args: two example inputs share memory; pass distinct tensors (the exporter "
                    "would merge them into one graph input)"
                )
    program = torch.onnx.export(
        module,
        args,
        dynamo=True,
        custom_translation_table=TRANSLATIONS,
        opset_version=functions.OPSET,
        verbose=False,
        **kwargs,
    )
    if weights is not None:
        weights.externalize(program.model)
    model = attach_functions(program.model_proto)
    model.ir_version = min(model.ir_version, functions.IR_VERSION)
    return model
