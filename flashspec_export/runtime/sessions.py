"""The loop's target and drafter from the PyTorch modules or from an export's ONNX graphs.

``from_modules`` is the reference; ``from_export`` opens ``manifest.json`` of a
``scripts/export.py`` output and runs its graphs in onnxruntime. With the same seeds both give
the same tokens (``tests/runtime/test_loop.py``).
"""

from __future__ import annotations

import pathlib

import numpy as np
import torch

from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.build import ExportConfig, Modules, build_modules
from flashspec_export.models.ngram import NgramDrafter
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


def onnx_graph(session) -> Graph:
    """An onnxruntime ``InferenceSession`` as a callable on CPU tensors."""
    names = [i.name for i in session.get_inputs()]

    def run(*args):
        feed = {n: np.ascontiguousarray(a.numpy()) for n, a in zip(names, args, strict=True)}
        return tuple(torch.from_numpy(o) for o in session.run(None, feed))

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
    return from_modules(build_modules(config), config.draft, config.batch, config.max_len)


def from_export(directory: str | pathlib.Path, providers=("CPUExecutionProvider",)):
    """(Target, drafter) running the exported graphs of ``directory`` in onnxruntime."""
    import onnxruntime as ort

    directory = pathlib.Path(directory)
    manifest = export_manifest.read(directory)
    export_manifest.verify(directory, manifest)
    graphs = manifest.graphs

    def load(name):
        session = ort.InferenceSession(str(directory / graphs[name].file), providers=providers)
        return onnx_graph(session), graphs[name].input("k_cache").shape

    prefill, cache_shape = load("target_prefill")
    step, _ = load("target_step")
    target = Target(prefill, step, cache_shape)
    draft = manifest.drafter
    if draft == "ngram":
        return target, NgramDrafter()
    graph, draft_cache = load(f"drafter_{draft}")
    return target, GraphDrafter(graph, draft_cache, features=draft != "model")
