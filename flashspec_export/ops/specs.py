"""One specification per FlashSpec op: its name on every face, its inputs, outputs and
attributes, and where each implementation lives.

Everything else is derived from ``SPECS``: the backend registry (``ops/registry.py``), the torch
custom ops (``ops/torch_ops.py``), the ONNX schemas (``onnx/schemas.py``), the function bodies
and single-op models (``onnx/functions.py``), the exporter's translation table
(``onnx/translation.py``) and the manifest's op list. ``tests/test_op_faces.py`` fails when any
face of any op is missing: a backend, the ONNX body, the C ABI symbol of the CUDA kernel, the
TensorRT plugin creator.

Adding an op: write its reference, kernels and ONNX body, add a spec here, and list its plugin in
``plugins/api/flashspecCreators.cpp``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

DOMAIN = "flashspec"  # ONNX domain = TensorRT plugin namespace
PLUGIN_VERSION = "2"  # 2: the two-level sample (1, the per-id Gumbel-max, is not registered)


@dataclass(frozen=True)
class TensorArg:
    """A tensor input or output. ``dtype``: "T" (the float type of hidden and lm_head: float32,
    float16 or bfloat16), "int64", "int32" or "float32". ``shape``: symbolic dims. ``optional``:
    an input a node may leave out (the torch op's ``Tensor? name=None``, ONNX's optional formal
    parameter, skipped by an empty name when a later one is given), or an output a node may
    leave out (ONNX's optional output; the torch op always returns it)."""

    name: str
    dtype: str
    shape: tuple[str, ...]
    doc: str = ""
    optional: bool = False


@dataclass(frozen=True)
class OpSpec:
    """One op on every face.

    name : the Python / torch / registry name (``torch.ops.flashspec.<name>``)
    op_type : the ONNX node type and the TensorRT plugin name
    backends : backend -> ``module:function`` implementing the canonical signature
    onnx_body : the function in ``onnx/functions.py`` that builds the node's function body
    c_abi : the symbol of the CUDA kernel in ``libflashspec_kernels.so``
    torch_kwargs : keyword arguments the torch op passes to the backend
    """

    name: str
    op_type: str
    doc: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    backends: Mapping[str, str]
    onnx_body: str
    c_abi: str
    attributes: Mapping[str, str] = field(default_factory=lambda: {"vocab_size": "logical vocab"})
    torch_kwargs: Mapping[str, object] = field(default_factory=dict)


VERIFY_RESAMPLE = OpSpec(
    name="verify_resample",
    op_type="VerifyResample",
    doc="verify gamma greedy drafts per sequence and emit the next tokens (docs/DESIGN.md)",
    inputs=(
        TensorArg("hidden", "T", ("N", "R", "H"), "R = gamma + 1"),
        TensorArg("lm_head", "T", ("V", "H")),
        TensorArg("draft_tokens", "int64", ("N", "G"), "G = gamma = R - 1"),
        TensorArg("temperature", "float32", ("N",), "0 = greedy"),
        TensorArg("seed", "int64", ("N",)),
        TensorArg("positions", "int64", ("N",), "absolute position of row 0"),
        # The truncation a request asks for (reference/truncation.py); absent: off.
        TensorArg("top_k", "int64", ("N",), "0 = off", optional=True),
        TensorArg("top_p", "float32", ("N",), "in (0, 1], 1 = off", optional=True),
        TensorArg("allowed_tokens", "int32", ("N", "R", "W"), "W = ceil(V / 32)", optional=True),
    ),
    outputs=(
        TensorArg("tokens", "int64", ("N", "R"), "emitted tokens, then -1"),
        TensorArg("num_emitted", "int64", ("N",), "in 1..gamma + 1"),
        # Asked for: a node may leave it out (the body and the plugin then skip the LSE).
        TensorArg("logprobs", "float32", ("N", "R"), "0 past num_emitted", optional=True),
    ),
    backends={
        "reference": "flashspec_export.reference.verify_resample:verify_resample",
        "standard": "flashspec_export.ops.standard:verify_resample",
        "triton": "flashspec_export.kernels.verify_resample:verify_resample",
        "cuda": "flashspec_export.ops.cuda:verify_resample",
    },
    onnx_body="verify_resample_function",
    c_abi="flashspecVerifyResample",
    torch_kwargs={"return_logprobs": True},
)

TILED_ARGMAX = OpSpec(
    name="tiled_argmax",
    op_type="TiledArgmax",
    doc="greedy drafting: argmax_v hidden . lm_head[v] without materialising the logits",
    inputs=(TensorArg("hidden", "T", ("N", "H")), TensorArg("lm_head", "T", ("V", "H"))),
    outputs=(
        TensorArg("token", "int64", ("N",), "argmax, lowest index on ties"),
        TensorArg("max_logit", "float32", ("N",)),
    ),
    backends={
        "reference": "flashspec_export.reference.tiled_argmax:tiled_argmax",
        "standard": "flashspec_export.ops.standard:tiled_argmax",
        "triton": "flashspec_export.kernels.tiled_argmax:tiled_argmax",
        "cuda": "flashspec_export.ops.cuda:tiled_argmax",
    },
    onnx_body="tiled_argmax_function",
    c_abi="flashspecTiledArgmax",
)

SPECS: dict[str, OpSpec] = {spec.name: spec for spec in (VERIFY_RESAMPLE, TILED_ARGMAX)}
BY_OP_TYPE: dict[str, OpSpec] = {spec.op_type: spec for spec in SPECS.values()}


def required(spec: OpSpec) -> tuple[TensorArg, ...]:
    """The inputs every node of ``spec`` has (the optional ones follow them)."""
    return tuple(a for a in spec.inputs if not a.optional)


def has_optional(spec: OpSpec) -> bool:
    """Whether ``spec`` has optional inputs (its int attributes are then keyword-only in
    torch)."""
    return len(required(spec)) < len(spec.inputs)


def dim_sizes(spec: OpSpec, tensors) -> dict[str, int]:
    """Sizes of the symbolic dims of ``spec.inputs`` bound by the input ``tensors`` (or shapes;
    None for an absent optional input)."""
    sizes = {}
    for arg, tensor in zip(spec.inputs, tensors, strict=True):
        if tensor is None:
            continue
        for dim, size in zip(arg.shape, tuple(tensor.shape), strict=True):
            sizes.setdefault(dim, size)  # SymInt under export: dynamic dims stay dynamic
    return sizes


def output_shapes(spec: OpSpec, tensors) -> list[tuple[int, ...]]:
    """The output shapes of ``spec`` for these inputs."""
    sizes = dim_sizes(spec, tensors)
    return [tuple(sizes[dim] for dim in out.shape) for out in spec.outputs]
