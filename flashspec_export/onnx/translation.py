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

from flashspec_export.config import GRAPH_OPSETS
from flashspec_export.export.weights import WeightsFile
from flashspec_export.models import target  # noqa: F401  (registers torch.ops.kvcache)
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
    spec's inputs and int attributes (the exporter binds arguments by that signature). An absent
    optional input (None) is left out of the node: trailing ones dropped, one before a given
    input as an empty name, as ONNX skips an optional input."""
    op = values.Op(_FLASHSPEC, spec.op_type)

    kind = inspect.Parameter.POSITIONAL_OR_KEYWORD
    keyword = inspect.Parameter.KEYWORD_ONLY if specs.has_optional(spec) else kind  # as in torch
    signature = inspect.Signature(
        [
            inspect.Parameter(a.name, kind, default=None if a.optional else inspect.Parameter.empty)
            for a in spec.inputs
        ]
        + [inspect.Parameter(a, keyword, annotation=int) for a in spec.attributes]
    )

    def translate(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        bound.apply_defaults()
        inputs = [bound.arguments[a.name] for a in spec.inputs]
        while inputs[-1] is None:  # required inputs are never None
            inputs.pop()
        attributes = {a: bound.arguments[a] for a in spec.attributes}
        return op(*inputs, **attributes, _outputs=len(spec.outputs), **_PLUGIN)

    translate.__signature__ = signature
    translate.__name__ = f"_{spec.name}"
    return translate


TRANSLATIONS = {
    getattr(torch.ops.flashspec, spec.name).default: translation(spec)
    for spec in specs.SPECS.values()
}
# Opset 24 writes the KV cache with TensorScatter (in place where the runtime binds the past and
# present caches to one buffer) and attends with Attention (GQA, K / V not expanded); 18 is the
# fallback for runtimes without them (ScatterElements into a copy, attention as MatMul /
# Softmax over K / V expanded to every head).
OPSETS = GRAPH_OPSETS


def _tensor_scatter(cache, update, positions):
    return values.Op(values.Opset("", 24), "TensorScatter")(cache, update, positions, axis=2)


def _scatter_elements(cache, update, positions):
    op = values.Opset("", 18)

    def call(name, *args, **kwargs):
        return values.Op(op, name)(*args, **kwargs)

    shape = call("Shape", update)
    new = call("Gather", shape, call("Constant", value_int=2))  # T
    one = call("Constant", value_int=1)
    steps = call("Range", call("Constant", value_int=0), new, one)  # [T]
    slots = call("Add", call("Unsqueeze", positions, call("Constant", value_ints=[1])), steps)
    slots = call("Unsqueeze", slots, call("Constant", value_ints=[1, 3]))  # [N, 1, T, 1]
    return call("ScatterElements", cache, call("Expand", slots, shape), update, axis=2)


def translations(opset: int) -> dict:
    """The custom translation table of a graph of ``opset``."""
    if opset not in OPSETS:
        raise ValueError(f"opset: expected one of {OPSETS}, got {opset}")
    write = _tensor_scatter if opset == 24 else _scatter_elements
    return {**TRANSLATIONS, torch.ops.kvcache.write.default: write}


def drop_unread_outputs(model: onnx.ModelProto) -> onnx.ModelProto:
    """Leave out every optional output of a ``flashspec`` node that nothing reads (no node, no
    graph output): the torch op always returns it, the node then does not compute it
    (``functions.output_attributes``: e.g. ``return_logprobs = 0``). Trailing ones are removed,
    one before a read output is renamed ""."""
    read = {name for node in model.graph.node for name in node.input}
    read |= {o.name for o in model.graph.output}
    dropped = set()
    for node in model.graph.node:
        if node.domain != functions.DOMAIN:
            continue
        args = specs.BY_OP_TYPE[node.op_type].outputs
        names = list(node.output)
        for i, (arg, name) in enumerate(zip(args, names, strict=False)):
            if arg.optional and name and name not in read:
                dropped.add(name)
                names[i] = ""
        while names and not names[-1]:
            names.pop()
        if names == list(node.output):
            continue
        del node.output[:]
        node.output.extend(names)
        present = functions.present_outputs(node.op_type, names)
        for attribute, value in functions.output_attributes(node.op_type, present).items():
            node.attribute.append(onnx.helper.make_attribute(attribute, value))
    kept = [v for v in model.graph.value_info if v.name not in dropped]
    del model.graph.value_info[:]
    model.graph.value_info.extend(kept)
    return model


def attach_functions(model: onnx.ModelProto) -> onnx.ModelProto:
    """Add the function body of every ``flashspec`` op the graph uses (once each: the body of
    the optional inputs its nodes carry and the optional outputs they produce,
    ``functions.function_for``), importing the model's standard opset (the bodies' ops mean the
    same from opset 18 to 24). Optional outputs nothing reads are left out first
    (``drop_unread_outputs``)."""
    drop_unread_outputs(model)
    used = {}
    for node in model.graph.node:
        if node.domain == functions.DOMAIN:
            used.setdefault(node.op_type, []).append(node)
    present = {(f.domain, f.name) for f in model.functions}
    opset = next(o.version for o in model.opset_import if o.domain == "")
    for op_type, nodes in sorted(used.items()):
        if (functions.DOMAIN, op_type) not in present:
            function = functions.function_for(op_type, nodes)
            for imported in function.opset_import:
                if imported.domain == "":
                    imported.version = opset
            model.functions.append(function)
    return model


def export(
    module: torch.nn.Module,
    args: tuple,
    weights: WeightsFile | None = None,
    opset: int = OPSETS[0],
    **kwargs,
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
        custom_translation_table=translations(opset),
        opset_version=opset,
        verbose=False,
        **kwargs,
    )
    if weights is not None:
        weights.externalize(program.model)
    model = attach_functions(program.model_proto)
    # the lowest IR version its opsets allow (runtimes lag behind the newest onnx): 10 for
    # opset 18, 12 for opset 24
    needed = onnx.helper.find_min_ir_version_for(model.opset_import, ignore_unknown=True)
    model.ir_version = max(functions.IR_VERSION, needed)
    return model
