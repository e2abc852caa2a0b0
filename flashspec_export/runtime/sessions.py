"""The loop's target and drafter from the PyTorch modules or from an export's ONNX graphs.

``from_modules`` is the reference (``reference_of``: the modules an export was made from, its
weights checked); ``from_export`` runs the graphs of a ``scripts/export.py`` output in
onnxruntime, ``from_engines`` the TensorRT engines ``scripts/build_engines.py`` built from them
(with the FlashSpec plugin library loaded), and ``device_loop_of`` the same modules as
``reference_of`` in the device-resident loop (``runtime/device_loop.py``) on a GPU or the CPU.
Each takes the export's manifest, read once by the caller (``export.manifest.read``), and
verifies the files it loads. With the same seeds all give the same tokens
(``tests/runtime/test_loop.py``).
"""

from __future__ import annotations

import pathlib
import re
from typing import TYPE_CHECKING

import numpy as np
import onnx
import torch

from flashspec_export.config import ConfigError
from flashspec_export.engine import plugins
from flashspec_export.export import engine_record
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import (
    DTYPES,
    ExportConfig,
    Modules,
    build_modules,
    weights_sha256,
)
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import cpu_bfloat16, selection
from flashspec_export.runtime.drafting import GraphDrafter
from flashspec_export.runtime.loop import Graph, Target

if TYPE_CHECKING:
    from flashspec_export.runtime.device_loop import DeviceLoop


def torch_graph(
    module: torch.nn.Module,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    keywords: tuple[str, ...] = (),
) -> Graph:
    """A module as a callable on CPU tensors, run on ``device``: float tensors of rank >= 3
    (hidden states, caches) are cast to ``dtype`` there, float outputs come back as fp32. Lower
    ranks (temperature) keep their dtype. ``keywords``: the names of the last inputs, which the
    module takes by name (a target step's optional inputs, as its graph takes them in order)."""

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point() and t.dim() >= 3:
            return t.to(device, dtype)
        return t.to(device)

    def to_host(t: torch.Tensor) -> torch.Tensor:
        return t.float().cpu() if t.is_floating_point() else t.cpu()

    @torch.no_grad()
    def run(*args):
        args = [to_device(a) for a in args]
        named = dict(zip(keywords, args[len(args) - len(keywords) :], strict=True))
        return tuple(to_host(out) for out in module(*args[: len(args) - len(named)], **named))

    return run


# onnxruntime's input types -> the numpy type fed (the loop's host tensors: fp32, int64, int32)
_NUMPY = {
    "tensor(float)": np.float32,
    "tensor(float16)": np.float16,
    "tensor(int64)": np.int64,
    "tensor(int32)": np.int32,  # allowed_tokens
}
_TORCH = {"FLOAT": torch.float32, "FLOAT16": torch.float16, "BFLOAT16": torch.bfloat16}
_CACHE = re.compile(r"^([kv])_cache(?:_out)?_\d+$")  # one graph input / output per layer


def cache_layout(names: list[str]) -> list[str | tuple[str, list[str]]]:
    """A graph's input or output names with each run of per-layer caches (``k_cache_0`` ..
    ``k_cache_<L-1>``) as one entry ("k", names): the loop passes and gets a cache as one
    stacked [L, N, KV, S, D] tensor, whose layer i is the graph's tensor i."""
    layout = []
    for name in names:
        match = _CACHE.match(name)
        if match is None:
            layout.append(name)
        elif layout and isinstance(layout[-1], tuple) and layout[-1][0] == match.group(1):
            layout[-1][1].append(name)
        else:
            layout.append((match.group(1), [name]))
    return layout


def onnx_graph(session, in_place: bool) -> Graph:
    """An onnxruntime ``InferenceSession`` as a callable on CPU tensors.

    Inputs are cast to the graph's types (fp32 host values of an fp16 graph are fp16-exact);
    float outputs return as fp32. Caches are bound layer by layer: ``in_place`` (an opset-24
    graph, whose TensorScatter writes the cache) binds each layer's present cache to its past
    one, so the step writes only its new slots and returns the k and v it was given; otherwise
    the present caches go to new tensors."""
    inputs, outputs = session.get_inputs(), session.get_outputs()
    unfed = [f"{i.name} ({i.type})" for i in inputs if i.type not in _NUMPY]
    if unfed:  # a bf16 graph outside the CPU provider's widening
        raise ConfigError(
            f"providers: inputs {', '.join(unfed)} have no numpy type to feed; run bf16 exports "
            "on CPUExecutionProvider or export with --dtype float16 / float32"
        )
    types = {i.name: _NUMPY[i.type] for i in inputs}
    layout_in = cache_layout([i.name for i in inputs])
    layout_out = cache_layout([o.name for o in outputs])

    def bind(bound, name, tensor, output=False):
        where = (name, "cpu", 0, tensor.numpy().dtype, tuple(tensor.shape), tensor.data_ptr())
        (bound.bind_output if output else bound.bind_input)(*where)

    def run(*args):
        bound = session.io_binding()
        caches = {}
        for entry, a in zip(layout_in, args, strict=True):
            if isinstance(entry, str):
                bound.bind_cpu_input(entry, np.ascontiguousarray(a.numpy(), dtype=types[entry]))
                continue
            kind, names = entry
            if a.dtype != torch.from_numpy(np.empty(0, types[names[0]])).dtype:
                raise ValueError(f"{kind}_cache: {a.dtype}, the graph takes {types[names[0]]}")
            caches[kind] = a.contiguous()
            for layer, name in enumerate(names):
                bind(bound, name, caches[kind][layer])
        results = []
        for entry in layout_out:
            if isinstance(entry, str):
                bound.bind_output(entry, "cpu")
                results.append(entry)
                continue
            kind, names = entry
            present = caches[kind] if in_place else torch.empty_like(caches[kind])
            for layer, name in enumerate(names):
                bind(bound, name, present[layer], output=True)
            results.append(present)
        session.run_with_iobinding(bound)
        values = dict(zip([o.name for o in outputs], bound.get_outputs(), strict=True))

        def host(result):
            if not isinstance(result, str):
                return result
            tensor = torch.from_numpy(values[result].numpy())
            return tensor.float() if tensor.is_floating_point() else tensor

        return tuple(host(r) for r in results)

    return run


def onnx_session(path: pathlib.Path, providers):
    """An onnxruntime session of the graph at ``path``; a bf16 graph on the CPU provider (which
    has no bf16 arithmetic) runs as ``cpu_bfloat16.widen`` rewrites it, fp32 compute rounded to
    bf16 after every op, with its external weights read from beside ``path``."""
    import onnxruntime as ort

    model = onnx.load(path, load_external_data=False)
    if not (cpu_bfloat16.is_bfloat16(model) and providers[0] == "CPUExecutionProvider"):
        return ort.InferenceSession(str(path), providers=list(providers))
    options = ort.SessionOptions()
    options.add_session_config_entry(
        "session.model_external_initializers_file_folder_path", str(path.parent)
    )
    widened = cpu_bfloat16.widen(model).SerializeToString()
    return ort.InferenceSession(widened, options, providers=list(providers))


def tensorrt_graph(
    trt, engine_path: pathlib.Path, graph: export_manifest.Graph, in_place: bool
) -> Graph:
    """A serialized TensorRT engine as a callable: the caches are CUDA tensors of the engine's
    type that stay on the GPU (``in_place``: each layer's present cache bound to its past one,
    as for onnxruntime), the other inputs go to the GPU and the other outputs, the step's small
    ones, come back to the host. The engine runs on torch's current stream. The plugin library
    must be registered before (``from_engines`` does it)."""
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise ConfigError(f"engine: {engine_path} does not deserialize (TensorRT version or GPU)")
    context = engine.create_execution_context()
    layout_in = cache_layout([spec.name for spec in graph.inputs])
    layout_out = cache_layout([spec.name for spec in graph.outputs])

    @torch.no_grad()
    def run(*args):
        caches, held = {}, []  # k / v by kind; the other inputs, alive until the engine ran
        for entry, a in zip(layout_in, args, strict=True):
            if isinstance(entry, str):
                # positions size the live attention window: a shape input, read from the host
                where = "cpu" if engine.is_shape_inference_io(entry) else "cuda"
                tensor = a.to(where, engine_dtype(trt, engine, entry)).contiguous()
                held.append(tensor)
                context.set_input_shape(entry, tuple(tensor.shape))
                context.set_tensor_address(entry, tensor.data_ptr())
                continue
            kind, names = entry
            caches[kind] = a
            for layer, name in enumerate(names):
                context.set_input_shape(name, tuple(a[layer].shape))
                context.set_tensor_address(name, a[layer].data_ptr())
        results = []
        for entry in layout_out:
            if isinstance(entry, str):
                shape = tuple(context.get_tensor_shape(entry))
                dtype = engine_dtype(trt, engine, entry)
                results.append(torch.empty(shape, dtype=dtype, device="cuda"))
                context.set_tensor_address(entry, results[-1].data_ptr())
                continue
            kind, names = entry
            present = caches[kind] if in_place else torch.empty_like(caches[kind])
            for layer, name in enumerate(names):
                context.set_tensor_address(name, present[layer].data_ptr())
            results.append(present)
        stream = torch.cuda.current_stream()
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"engine: {engine_path.name} failed to run")
        small = [isinstance(entry, str) for entry in layout_out]
        host = [r.cpu() if is_small else r for r, is_small in zip(results, small, strict=True)]
        return tuple(
            t.float() if is_small and t.is_floating_point() else t
            for t, is_small in zip(host, small, strict=True)
        )

    return run


def engine_dtype(trt, engine, name: str) -> torch.dtype:
    """The torch type of an engine's tensor."""
    dtype = engine.get_tensor_dtype(name)
    if dtype == trt.DataType.BF16:  # numpy has no bf16
        return torch.bfloat16
    return torch.from_numpy(np.empty(0, trt.nptype(dtype))).dtype


def from_modules(
    modules: Modules,
    draft: str,
    batch: int,
    max_len: int,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    sampling_params: bool = False,
    allowed_tokens: bool = False,
):
    """(Target, drafter) running the PyTorch modules with caches for ``batch`` x ``max_len``.

    ``device`` / ``dtype``: where and in which float type the modules run (they are moved there;
    the FlashSpec ops then take the Triton kernels on CUDA). The loop still hands CPU tensors.
    ``sampling_params`` / ``allowed_tokens``: the target step takes top_k / top_p, or the
    allowed-token masks, as a ``--sampling-params`` / ``--allowed-tokens`` export's does (then
    the op takes a truncating backend).
    """
    for module in (modules.model, modules.target, modules.drafter):
        if module is not None:
            module.to(device=device, dtype=dtype)
    optional = (*export_manifest.SAMPLING_PARAMS,) if sampling_params else ()
    optional += ("allowed_tokens",) if allowed_tokens else ()
    target = Target(
        torch_graph(modules.target.step, device, dtype),
        torch_graph(modules.target, device, dtype, keywords=optional),
        modules.target.step.cache_shape(batch, max_len),
        sampling_params=sampling_params,
        allowed_vocab=modules.target.vocab_size if allowed_tokens else None,
        logprobs=modules.target.logprobs,
    )
    if modules.drafter is None:
        return target, NgramDrafter()
    drafter = GraphDrafter(
        torch_graph(modules.drafter, device, dtype),
        modules.drafter.cache_shape(batch, max_len),
        features=draft != "model",
    )
    return target, drafter


def modules_of(manifest: export_manifest.Manifest, argument: str = "check") -> Modules:
    """The PyTorch modules an export was made from (its manifest's config: the checkpoint, the
    drafter and its weights, the dtype), refused (ConfigError naming ``--<argument>``, the flag
    that asked for them) when its checkpoint is gone or its weights are not those the export
    was made from (``manifest.weights_sha256``)."""
    config = ExportConfig(**manifest.config)
    try:
        modules = build_modules(config)
    except ConfigError as error:
        raise ConfigError(
            f"{argument}: the PyTorch modules the export was made from cannot be rebuilt "
            f"({error}); --{argument} rebuilds them from the checkpoint recorded at export: "
            "restore it there, or re-export"
        ) from error
    if weights_sha256(modules) != manifest.weights_sha256:
        sources = [config.target, config.draft_weights, config.draft_model]
        raise ConfigError(
            f"{argument}: the weights at {' and '.join(s for s in sources if s)} differ from "
            "those the export was made from (SHA-256 of the state dicts): they changed since "
            "the export; re-export, or restore the original weights there"
        )
    return modules


def reference_of(manifest: export_manifest.Manifest):
    """The PyTorch (Target, drafter) an export was made from (``modules_of``)."""
    config = ExportConfig(**manifest.config)
    return from_modules(
        modules_of(manifest),
        config.draft,
        config.batch,
        config.max_len,
        dtype=DTYPES[manifest.dtype],
        sampling_params=config.sampling_params,
        allowed_tokens=config.allowed_tokens,
    )


def device_loop_of(
    manifest: export_manifest.Manifest, device: str, select: bool = False
) -> DeviceLoop:
    """The device loop of an export on ``device`` ("cuda" or "cpu"): the modules it was made
    from (``modules_of``, in the export's dtype) moved there, with the export's batch, cache
    length, drafter (the n-gram drafter's lookup on the device too) and γ; with ``select``,
    every arm of ``selection.arms_for`` (the drafter and n-gram lookup at γ = 1 .. the
    export's), each its own graph. On CUDA the decoder layers run fused and each step is one
    CUDA graph; on the CPU the same loop runs the PyTorch layers and the reference ops.
    Refused (ConfigError naming ``--device``) before any model is built where it cannot run."""
    if device not in ("cpu", "cuda"):
        raise ConfigError(f"device: expected cpu or cuda, got {device!r}")
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: --device cuda needs a CUDA GPU (torch.cuda.is_available() is False); "
            "--device cpu runs the same loop on the CPU"
        )
    from flashspec_export.runtime.device_loop import DeviceLoop  # its kernels load with it

    modules = modules_of(manifest, "device")
    drafter = None
    if manifest.gamma > 0:
        drafter = NgramDrafter() if manifest.drafter == "ngram" else modules.drafter.to(device)
    arms = selection.arms_for(manifest.drafter, manifest.gamma) if select else None
    model = modules.model.to(device)
    return DeviceLoop(model, drafter, manifest.batch, manifest.max_len, manifest.gamma, arms=arms)


def step_logprobs(manifest: export_manifest.Manifest) -> bool:
    """Whether an export's target step returns logprobs (``--no-logprobs``: not)."""
    return any(o.name == "logprobs" for o in manifest.graphs["target_step"].outputs)


def step_allowed_vocab(manifest: export_manifest.Manifest) -> int | None:
    """V where an export's target step takes allowed_tokens masks of V tokens
    (``--allowed-tokens``), else None."""
    takes = any(i.name == "allowed_tokens" for i in manifest.graphs["target_step"].inputs)
    return manifest.vocab_size if takes else None


def from_export(
    directory: str | pathlib.Path,
    manifest: export_manifest.Manifest,
    providers=("CPUExecutionProvider",),
):
    """(Target, drafter) running the exported graphs of ``directory`` (``manifest``: its
    manifest) in onnxruntime; the graph files are verified against the manifest first."""
    directory = pathlib.Path(directory)
    export_manifest.verify(directory, manifest)
    graphs = manifest.graphs
    in_place = manifest.opset >= 24  # TensorScatter writes the caches

    def load(name):
        session = onnx_session(directory / graphs[name].file, providers)
        cache_type = next(i.type for i in session.get_inputs() if i.name == "k_cache_0")
        dtype = torch.from_numpy(np.empty(0, _NUMPY[cache_type])).dtype
        return onnx_graph(session, in_place), graphs[name].cache_shape, dtype

    prefill, cache_shape, dtype = load("target_prefill")
    step, _, _ = load("target_step")
    target = Target(
        prefill,
        step,
        cache_shape,
        dtype,
        sampling_params=bool(manifest.sampling_params),
        allowed_vocab=step_allowed_vocab(manifest),
        logprobs=step_logprobs(manifest),
    )
    draft = manifest.drafter
    if draft == "ngram":
        return target, NgramDrafter()
    graph, draft_cache, dtype = load(f"drafter_{draft}")
    return target, GraphDrafter(graph, draft_cache, draft != "model", dtype)


def from_engines(directory: str | pathlib.Path, manifest: export_manifest.Manifest):
    """(Target, drafter) running the TensorRT engines of an export (``<export>/engines``, built by
    ``scripts/build_engines.py``; ``manifest``: the export's) with full TensorRT on a CUDA GPU,
    the FlashSpec plugin library registered first. The engines are verified against their record
    (``export.engine_record.verify``: unchanged, built from this export's graphs by this
    TensorRT) first. TensorRT-RTX engines do not run on data-centre GPUs (Hopper)."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        raise ConfigError("engines: running engines needs TensorRT (the tensorrt module)")
    import tensorrt as trt

    engines = engine_record.verify(directory, manifest, "tensorrt", trt.__version__)
    library = plugins.library_path()
    if library is not None:
        plugins.register(trt, library)
    in_place = manifest.opset >= 24

    def load(name):
        graph = manifest.graphs[name]
        run = tensorrt_graph(trt, engines[name], graph, in_place)
        dtype = _TORCH[graph.input("k_cache_0").dtype]  # a strongly typed engine's too
        return run, graph.cache_shape, dtype

    prefill, cache_shape, dtype = load("target_prefill")
    step, _, _ = load("target_step")
    target = Target(
        prefill,
        step,
        cache_shape,
        dtype,
        "cuda",  # caches on the GPU
        sampling_params=bool(manifest.sampling_params),
        allowed_vocab=step_allowed_vocab(manifest),
        logprobs=step_logprobs(manifest),
    )
    if manifest.drafter == "ngram":
        return target, NgramDrafter()
    graph, draft_cache, dtype = load(f"drafter_{manifest.drafter}")
    return target, GraphDrafter(graph, draft_cache, manifest.drafter != "model", dtype, "cuda")
