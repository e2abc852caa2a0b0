"""A small helper to write ONNX function bodies as straight-line Python.

``Body.op("Mul", a, b)`` appends a node and returns its output name; ``Body.const`` makes a
scalar or 1-D constant. The result becomes an ``onnx.FunctionProto`` with ``Body.function``.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper


class Body:
    """Nodes of one function body, with fresh value names."""

    def __init__(self, prefix: str):
        self.prefix = prefix
        self.nodes: list[onnx.NodeProto] = []
        self._count = 0

    def _name(self, hint: str) -> str:
        self._count += 1
        return f"{self.prefix}_{hint}_{self._count}"

    def op(self, op_type: str, *inputs: str, outputs: int = 1, domain: str = "", **attrs):
        """Append ``op_type(*inputs, **attrs)``; returns the output name (or a tuple of them)."""
        names = [self._name(op_type.lower()) for _ in range(outputs)]
        self.nodes.append(helper.make_node(op_type, list(inputs), names, domain=domain, **attrs))
        return names[0] if outputs == 1 else tuple(names)

    def const(self, value, dtype) -> str:
        """A constant tensor (a scalar for a Python scalar, else 1-D) of numpy ``dtype``."""
        array = np.asarray(value, dtype=dtype)
        tensor = numpy_helper.from_array(array, self._name("c"))
        return self.op("Constant", value=tensor)

    def attr_int(self, attribute: str) -> str:
        """A scalar int64 tensor holding the function's integer attribute ``attribute``."""
        ref = onnx.AttributeProto()
        ref.name = "value_int"
        ref.ref_attr_name = attribute
        ref.type = onnx.AttributeProto.INT
        name = self._name(attribute)
        node = helper.make_node("Constant", [], [name])
        node.attribute.append(ref)
        self.nodes.append(node)
        return name

    def function(self, domain, name, inputs, outputs, opset_imports, attributes=()):
        """The body as a FunctionProto (outputs are given as (public name, value name))."""
        nodes = list(self.nodes)
        for public, value in outputs:
            nodes.append(helper.make_node("Identity", [value], [public]))
        return helper.make_function(
            domain,
            name,
            list(inputs),
            [public for public, _ in outputs],
            nodes,
            opset_imports,
            list(attributes),
        )
