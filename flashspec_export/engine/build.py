"""Build TensorRT engines from an export's graphs.

Works with full TensorRT (``tensorrt``, where the FlashSpec plugins resolve the custom nodes)
and with TensorRT-RTX (``tensorrt_rtx``: no plugins, the parser inlines the function bodies;
its parser and builder run on a CPU-only machine).
"""

from __future__ import annotations

import importlib
import logging
import pathlib

from flashspec_export.runtime.sessions import read_manifest

logger = logging.getLogger(__name__)

DYNAMIC_OPT = 16  # the optimisation point of a dynamic token axis


def tensorrt_module(name: str | None = None):
    """``tensorrt`` (preferred) or ``tensorrt_rtx``; a clear error when neither is installed."""
    for candidate in [name] if name else ["tensorrt", "tensorrt_rtx"]:
        try:
            return importlib.import_module(candidate)
        except ImportError:
            continue
    raise ImportError(
        "tensorrt: neither TensorRT (tensorrt) nor TensorRT-RTX (pip install tensorrt-rtx) is "
        "installed"
    )


def profile(io: list[dict], max_tokens: int) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shapes of a graph's inputs from the manifest's ``inputs`` list; named
    (dynamic) axes range over 1 .. ``max_tokens`` with opt = min(16, max_tokens)."""
    shapes = {}
    for value in io:
        dims = value["shape"]
        low = tuple(d if isinstance(d, int) else 1 for d in dims)
        opt = tuple(d if isinstance(d, int) else min(DYNAMIC_OPT, max_tokens) for d in dims)
        high = tuple(d if isinstance(d, int) else max_tokens for d in dims)
        shapes[value["name"]] = (low, opt, high)
    return shapes


def build_engine(directory, graph: str, trt=None, optimization_level: int | None = None) -> bytes:
    """Parse ``graph`` (e.g. "target_step") of the export in ``directory`` and build a
    serialized engine; dynamic token axes get a profile up to the cache length."""
    trt = trt or tensorrt_module()
    directory = pathlib.Path(directory)
    manifest = read_manifest(directory)
    entry = manifest["graphs"][graph]
    trt_logger = trt.Logger(trt.Logger.WARNING)
    builder = trt.Builder(trt_logger)
    network = builder.create_network(0)
    parser = trt.OnnxParser(network, trt_logger)
    if not parser.parse_from_file(str(directory / entry["file"])):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{graph}: the ONNX parser refused the graph: {errors}")
    config = builder.create_builder_config()
    if optimization_level is not None:
        config.builder_optimization_level = optimization_level
    shapes = profile(entry["inputs"], manifest["config"]["max_len"])
    if any(low != high for low, _, high in shapes.values()):
        opt_profile = builder.create_optimization_profile()
        for name, (low, opt, high) in shapes.items():
            opt_profile.set_shape(name, low, opt, high)
        config.add_optimization_profile(opt_profile)
    logger.info("building %s (%d layers)", graph, network.num_layers)
    engine = builder.build_serialized_network(network, config)
    if engine is None:
        raise RuntimeError(f"{graph}: the TensorRT builder failed (see its log above)")
    return bytes(engine)
