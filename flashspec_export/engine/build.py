"""Build TensorRT engines from an export's graphs (the TensorRT Python API, in process).

Works with full TensorRT and with TensorRT-RTX (its parser and builder run on a CPU-only
machine; its engines run on RTX GPUs, not on Hopper). The FlashSpec plugin library
(``engine/plugins.py``) is loaded for every build where it exists, and the build fails when a
``flashspec`` node was not resolved to a plugin layer. Without the library the parser inlines
the ops' function bodies (exact, but materialised): the default for TensorRT-RTX, and for full
TensorRT only when asked (``function_bodies=True``). Dynamic token axes get a profile 1 .. the
cache length; the engines go to ``<export>/engines/<graph>.engine``, recorded in
``engines/engines.json`` (``export/engine_record.py``: each engine's SHA-256, the graph it was
built from, the TensorRT that built it) that the runtime verifies them against.
"""

from __future__ import annotations

import dataclasses
import importlib
import importlib.util
import logging
import os
import pathlib
import shutil
import tempfile
from collections.abc import Sequence

from flashspec_export.config import ConfigError
from flashspec_export.engine import plugins
from flashspec_export.export import engine_record
from flashspec_export.export import manifest as export_manifest

logger = logging.getLogger(__name__)

DYNAMIC_OPT = 16  # the optimisation point of a dynamic token axis


def tensorrt_flavour() -> str:
    """ "tensorrt" when full TensorRT is installed, else "tensorrt_rtx"; an error when neither."""
    for name in ("tensorrt", "tensorrt_rtx"):
        if importlib.util.find_spec(name) is not None:
            return name
    raise ConfigError(
        "tensorrt: neither TensorRT (tensorrt) nor TensorRT-RTX (pip install tensorrt-rtx) is "
        "installed"
    )


def profile(
    io: Sequence[export_manifest.TensorSpec], max_tokens: int
) -> dict[str, tuple[tuple[int, ...], ...]]:
    """(min, opt, max) shapes of a graph's inputs (the manifest's ``Graph.inputs``); named
    (dynamic) axes range over 1 .. ``max_tokens`` with opt = min(16, max_tokens)."""
    shapes = {}
    for value in io:
        dims = value.shape
        low = tuple(d if isinstance(d, int) else 1 for d in dims)
        opt = tuple(d if isinstance(d, int) else min(DYNAMIC_OPT, max_tokens) for d in dims)
        high = tuple(d if isinstance(d, int) else max_tokens for d in dims)
        shapes[value.name] = (low, opt, high)
    return shapes


@dataclasses.dataclass(frozen=True)
class EngineReport:
    """What one engine build did."""

    path: pathlib.Path
    layers: int  # layers of the parsed network
    plugin_layers: tuple[str, ...]  # its PLUGIN_V3 layers (the flashspec nodes, when resolved)
    flashspec_nodes: int  # flashspec nodes in the ONNX graph
    cache_dtype: str | None = None  # the k_cache_0 input's type in the network (strongly typed)


def _flashspec_nodes(path: pathlib.Path) -> list:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return [node for node in model.graph.node if node.domain == plugins.PLUGIN_NAMESPACE]


# The off value of each optional input: a skipped one can be given at it instead.
_OFF_VALUES = {"top_k": "0", "top_p": "1", "allowed_tokens": "every bit set"}
# The scripts/export.py flag that gives the target step each optional input.
_EXPORT_FLAGS = {
    "top_k": "--sampling-params",
    "top_p": "--sampling-params",
    "allowed_tokens": "--allowed-tokens",
}


def _refuse_optional_inputs(
    source: pathlib.Path, nodes, with_plugins: bool, takes_optional: bool = False
) -> None:
    """A node with optional inputs (a ``--sampling-params`` export's top_k / top_p, an
    ``--allowed-tokens`` export's mask) builds from its function body, or from the plugin where
    the library takes them (``takes_optional``: ``plugins.takes_optional_inputs``; an older
    library takes the required inputs only), and either only when they are a prefix: TensorRT's
    parser refuses a function node with a skipped (empty) input and hands a plugin none."""
    from flashspec_export.onnx import functions

    for node in nodes:
        present = functions.present_inputs(node.op_type, node.input)
        names = ", ".join(sorted(present))
        flags = " ".join(sorted({_EXPORT_FLAGS[name] for name in present}))
        if present and with_plugins and not takes_optional:
            raise ConfigError(
                f"{source.name}: {node.op_type} has the optional inputs {names} (export "
                f"{flags}), which this plugin library does not take (it predates them): "
                "rebuild plugins/ (plugins/README.md), build the function bodies "
                f"(--function-bodies) or export without {flags}"
            )
        skipped = functions.skipped_inputs(node.op_type, node.input)
        if skipped:
            off = ", ".join(f"{s} ({_OFF_VALUES[s]})" for s in skipped)
            missing = sorted({_EXPORT_FLAGS[s] for s in skipped} - set(flags.split()))
            also = f" (re-export with {' '.join(missing)} too)" if missing else ""
            raise ConfigError(
                f"{source.name}: {node.op_type} skips its optional input {', '.join(skipped)} "
                f"before {names}, and TensorRT's parser refuses a function node with a skipped "
                f"(empty) input; give it at its off value: {off}{also}"
            )


def _build_one(
    trt, source: pathlib.Path, shapes: dict, max_len: int, engine: pathlib.Path, with_plugins: bool
):
    nodes = _flashspec_nodes(source)
    takes_optional = with_plugins and plugins.takes_optional_inputs(trt)
    _refuse_optional_inputs(source, nodes, with_plugins, takes_optional)
    log = trt.Logger(trt.Logger.ERROR)
    builder = trt.Builder(log)
    # Strongly typed: every tensor keeps the graph's type (a bf16 export builds a bf16 engine,
    # fp32 stays fp32 without TF32), so the engine computes what the ONNX graph says.
    network = builder.create_network(1 << int(trt.NetworkDefinitionCreationFlag.STRONGLY_TYPED))
    parser = trt.OnnxParser(network, log)
    if not parser.parse_from_file(str(source)):
        errors = "; ".join(str(parser.get_error(i)) for i in range(parser.num_errors))
        raise RuntimeError(f"{source.name}: the TensorRT ONNX parser failed: {errors}")
    layers = [network.get_layer(i) for i in range(network.num_layers)]
    for layer in layers:
        if layer.type == trt.LayerType.ATTENTION_OUTPUT:
            # fp32 (and shapes without a fused kernel) build as MatMul / Softmax
            layer.__class__ = trt.IAttentionOutputLayer
            layer.attention.decomposable = True
    inputs = {network.get_input(i).name: network.get_input(i) for i in range(network.num_inputs)}
    cache = inputs.get("k_cache_0")
    cache_dtype = str(cache.dtype).split(".")[-1] if cache is not None else None
    plugin_layers = tuple(layer.name for layer in layers if layer.type == trt.LayerType.PLUGIN_V3)
    if with_plugins and len(plugin_layers) != len(nodes):
        raise RuntimeError(
            f"{source.name}: {len(nodes)} flashspec node(s) but {len(plugin_layers)} plugin "
            "layer(s): "
            "a node fell back to its function body (is the plugin library current?)"
        )
    config = builder.create_builder_config()
    profile = builder.create_optimization_profile()
    for name, (low, opt, high) in shapes.items():
        profile.set_shape(name, low, opt, high)
    for name, tensor in inputs.items():
        if tensor.is_shape_tensor:  # positions: the live attention window is sliced by them
            rows = shapes[name][0][0]
            profile.set_shape_input(name, [0] * rows, [0] * rows, [max_len - 1] * rows)
    config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    if serialized is None:
        raise RuntimeError(f"{source.name}: the TensorRT builder failed")
    engine.write_bytes(bytes(serialized))
    return EngineReport(engine, len(layers), plugin_layers, len(nodes), cache_dtype)


def _previous(out: pathlib.Path, rebuilt) -> dict[str, engine_record.Engine]:
    """The recorded engines in ``out`` that a build of ``rebuilt`` keeps (none when ``out`` has
    no valid record: engines kept without an entry are refused by the runtime)."""
    try:
        engines = engine_record.read(out).engines
    except ConfigError:
        return {}
    return {
        name: e for name, e in engines.items() if name not in rebuilt and (out / e.file).is_file()
    }


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def build_engines(
    directory, graphs=None, force: bool = False, function_bodies: bool = False
) -> dict[str, EngineReport]:
    """Build the engines of ``graphs`` (default: all) of an export; returns name -> report.

    An existing engine is kept unless ``force``. Uses TensorRT when installed, else
    TensorRT-RTX. ``function_bodies``: build the ops' function bodies even where the plugin
    library exists (the materialised path). The engines directory is replaced whole: the new
    engines, the earlier ones of the other graphs, and ``engines.json`` recording them all.
    """
    directory = pathlib.Path(directory)
    manifest = export_manifest.read(directory)
    names = graphs or list(manifest.graphs)
    unknown = [n for n in names if n not in manifest.graphs]
    if unknown:
        known = ", ".join(manifest.graphs)
        raise ConfigError(f"graphs: {', '.join(unknown)} not in this export (it has {known})")
    export_manifest.verify(directory, manifest, names)
    out = directory / engine_record.DIRECTORY
    existing = [n for n in names if (out / f"{n}.engine").exists()]
    if existing and not force:
        raise FileExistsError(
            f"out: {out} already has {', '.join(existing)}; pass --force to rebuild them"
        )
    flavour = tensorrt_flavour()
    library = None if function_bodies else plugins.library_path()
    if library is None and not function_bodies and flavour == "tensorrt":
        raise ConfigError(
            f"plugins: TensorRT needs the FlashSpec plugin library ({plugins.DEFAULT_LIBRARY} or "
            f"${plugins.LIBRARY_ENV}); pass --function-bodies to build the materialised bodies"
        )
    trt = importlib.import_module(flavour)
    if library is not None:
        creators = plugins.register(trt, library)
        logger.info("%s: plugins %s from %s", flavour, ", ".join(creators), library)
    else:
        why = "as asked" if function_bodies else "no plugin library"
        logger.info("%s: %s, the flashspec function bodies are inlined", flavour, why)
    # Engines are built in a staging directory beside engines/, which then receives the earlier
    # engines of the other graphs (hard links) and the record, and replaces engines/: an
    # interrupted build leaves engines/ as it was, and the record always describes its engines.
    staging = pathlib.Path(tempfile.mkdtemp(prefix=".engines.partial-", dir=directory))
    reports, entries = {}, {}
    try:
        for name in names:
            entry = manifest.graphs[name]
            shapes = profile(entry.inputs, manifest.max_len)
            source = directory / entry.file
            engine = staging / f"{name}.engine"
            report = _build_one(trt, source, shapes, manifest.max_len, engine, library is not None)
            reports[name] = dataclasses.replace(report, path=out / engine.name)
            entries[name] = engine_record.engine_of(
                staging, engine.name, entry, flavour, trt.__version__, library is not None
            )
            logger.info("%s: %d layers, plugins %s", name, report.layers, report.plugin_layers)
        kept = _previous(out, names)
        for path in sorted(out.iterdir()) if out.is_dir() else []:
            other = path.name != engine_record.FILE_NAME and not (staging / path.name).exists()
            if path.is_file() and other:
                os.link(path, staging / path.name)  # engines of the other graphs stay
        engine_record.write(staging, engine_record.Record({**kept, **entries}))
        staging.chmod(0o777 & ~_umask())  # mkdtemp makes it private; engines/ is ordinary
        export_manifest.replace_directory(out, staging)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return reports
