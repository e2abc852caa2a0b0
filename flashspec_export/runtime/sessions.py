"""The loop's target and drafter from the PyTorch modules or from an export's ONNX graphs.

``from_modules`` is the reference; ``from_export`` opens ``manifest.json`` of a
``scripts/export.py`` output and runs its graphs in onnxruntime, ``from_engines`` the TensorRT
engines ``scripts/build_engines.py`` built from them (with the FlashSpec plugin library loaded).
With the same seeds all give the same tokens (``tests/runtime/test_loop.py``).
"""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import torch

from flashspec_export.config import ConfigError
from flashspec_export.engine import plugins
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import DTYPES, ExportConfig, Modules, build_modules
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import cpu_bfloat16
from flashspec_export.runtime.drafting import GraphDrafter
from flashspec_export.runtime.loop import Graph, Target


def torch_graph(
    module: torch.nn.Module, device: str = "cpu", dtype: torch.dtype | None = None
) -> Graph:
    """A module as a callable on CPU tensors, run on ``device``: float tensors of rank >= 3
    (hidden states, caches) are cast to ``dtype`` there, float outputs come back as fp32. Lower
    ranks (temperature) keep their dtype."""

    def to_device(t: torch.Tensor) -> torch.Tensor:
        if dtype is not None and t.is_floating_point() and t.dim() >= 3:
            return t.to(device, dtype)
        return t.to(device)

    def to_host(t: torch.Tensor) -> torch.Tensor:
        return t.float().cpu() if t.is_floating_point() else t.cpu()

    @torch.no_grad()
    def run(*args):
        return tuple(to_host(out) for out in module(*(to_device(a) for a in args)))

    return run


# onnxruntime's input types -> the numpy type fed (the loop's host tensors are fp32 / int64)
_NUMPY = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(int64)": np.int64}


def onnx_graph(session) -> Graph:
    """An onnxruntime ``InferenceSession`` as a callable on CPU tensors: inputs are cast to the
    graph's types (fp32 host values of an fp16 graph are fp16-exact), float outputs return as
    fp32."""
    feeds = [(i.name, _NUMPY[i.type]) for i in session.get_inputs()]

    def run(*args):
        feed = {
            name: np.ascontiguousarray(a.numpy(), dtype=dtype)
            for (name, dtype), a in zip(feeds, args, strict=True)
        }
        outputs = (torch.from_numpy(o) for o in session.run(None, feed))
        return tuple(o.float() if o.is_floating_point() else o for o in outputs)

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


def tensorrt_graph(trt, engine_path: pathlib.Path, graph: export_manifest.Graph) -> Graph:
    """A serialized TensorRT engine as a callable on CPU tensors: inputs (in the order of the
    manifest's graph) go to the GPU, the engine runs on torch's current stream, outputs come back.
    The plugin library must be registered before (``from_engines`` does it)."""
    logger = trt.Logger(trt.Logger.WARNING)
    engine = trt.Runtime(logger).deserialize_cuda_engine(engine_path.read_bytes())
    if engine is None:
        raise ConfigError(f"engine: {engine_path} does not deserialize (TensorRT version or GPU)")
    context = engine.create_execution_context()
    inputs = [spec.name for spec in graph.inputs]
    outputs = [spec.name for spec in graph.outputs]

    def torch_dtype(name: str) -> torch.dtype:
        dtype = engine.get_tensor_dtype(name)
        if dtype == trt.DataType.BF16:  # numpy has no bf16
            return torch.bfloat16
        return torch.from_numpy(np.empty(0, trt.nptype(dtype))).dtype

    @torch.no_grad()
    def run(*args):
        feed = {
            n: a.to("cuda", torch_dtype(n)).contiguous() for n, a in zip(inputs, args, strict=True)
        }
        for name, tensor in feed.items():
            context.set_input_shape(name, tuple(tensor.shape))
            context.set_tensor_address(name, tensor.data_ptr())
        results = {}
        for name in outputs:
            shape = tuple(context.get_tensor_shape(name))
            results[name] = torch.empty(shape, dtype=torch_dtype(name), device="cuda")
            context.set_tensor_address(name, results[name].data_ptr())
        stream = torch.cuda.current_stream()
        if not context.execute_async_v3(stream.cuda_stream):
            raise RuntimeError(f"engine: {engine_path.name} failed to run")
        host = (results[name].cpu() for name in outputs)
        return tuple(t.float() if t.is_floating_point() else t for t in host)

    return run


def from_modules(
    modules: Modules,
    draft: str,
    batch: int,
    max_len: int,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
):
    """(Target, drafter) running the PyTorch modules with caches for ``batch`` x ``max_len``.

    ``device`` / ``dtype``: where and in which float type the modules run (they are moved there;
    the FlashSpec ops then take the Triton kernels on CUDA). The loop still hands CPU tensors.
    """
    for module in (modules.model, modules.target, modules.drafter):
        if module is not None:
            module.to(device=device, dtype=dtype)
    target = Target(
        torch_graph(modules.target.step, device, dtype),
        torch_graph(modules.target, device, dtype),
        modules.target.step.cache_shape(batch, max_len),
    )
    if modules.drafter is None:
        return target, NgramDrafter()
    drafter = GraphDrafter(
        torch_graph(modules.drafter, device, dtype),
        modules.drafter.cache_shape(batch, max_len),
        features=draft != "model",
    )
    return target, drafter


def reference_of(directory: str | pathlib.Path):
    """The PyTorch (Target, drafter) an export was made from (its manifest's config)."""
    manifest = export_manifest.read(directory)
    config = ExportConfig(**manifest.config)
    return from_modules(
        build_modules(config),
        config.draft,
        config.batch,
        config.max_len,
        dtype=DTYPES[manifest.dtype],
    )


def from_export(directory: str | pathlib.Path, providers=("CPUExecutionProvider",)):
    """(Target, drafter) running the exported graphs of ``directory`` in onnxruntime."""
    directory = pathlib.Path(directory)
    manifest = export_manifest.read(directory)
    export_manifest.verify(directory, manifest)
    graphs = manifest.graphs

    def load(name):
        session = onnx_session(directory / graphs[name].file, providers)
        return onnx_graph(session), graphs[name].input("k_cache").shape

    prefill, cache_shape = load("target_prefill")
    step, _ = load("target_step")
    target = Target(prefill, step, cache_shape)
    draft = manifest.drafter
    if draft == "ngram":
        return target, NgramDrafter()
    graph, draft_cache = load(f"drafter_{draft}")
    return target, GraphDrafter(graph, draft_cache, features=draft != "model")


def from_engines(directory: str | pathlib.Path):
    """(Target, drafter) running the TensorRT engines of an export (``<export>/engines``, built by
    ``scripts/build_engines.py``) with full TensorRT on a CUDA GPU, the FlashSpec plugin library
    registered first. TensorRT-RTX engines do not run on data-centre GPUs (Hopper)."""
    import importlib.util

    if importlib.util.find_spec("tensorrt") is None:
        raise ConfigError("engines: running engines needs TensorRT (the tensorrt module)")
    import tensorrt as trt

    directory = pathlib.Path(directory)
    manifest = export_manifest.read(directory)
    export_manifest.verify(directory, manifest)
    library = plugins.library_path()
    if library is not None:
        plugins.register(trt, library)
    engines = directory / "engines"
    missing = [n for n in manifest.graphs if not (engines / f"{n}.engine").is_file()]
    if missing:
        raise ConfigError(
            f"engines: {engines} lacks {', '.join(missing)}; run scripts/build_engines.py first"
        )

    def load(name):
        graph = manifest.graphs[name]
        run = tensorrt_graph(trt, engines / f"{name}.engine", graph)
        return run, graph.input("k_cache").shape

    prefill, cache_shape = load("target_prefill")
    step, _ = load("target_step")
    target = Target(prefill, step, cache_shape)
    if manifest.drafter == "ngram":
        return target, NgramDrafter()
    graph, draft_cache = load(f"drafter_{manifest.drafter}")
    return target, GraphDrafter(graph, draft_cache, features=manifest.drafter != "model")
