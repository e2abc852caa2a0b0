"""The FlashSpec TensorRT plugin library (``plugins/``, ``libflashspec_plugins.so``): where it
is, and registering its creators (``getCreators``: TiledArgmax, VerifyResample, namespace
``flashspec``) with TensorRT or TensorRT-RTX.

One way to find it: ``$FLASHSPEC_PLUGINS_LIB``, else ``plugins/build/libflashspec_plugins.so``
of this checkout (built with ``cmake -S plugins -B plugins/build
-DTENSORRT_INCLUDE_DIR=<TensorRT>/include``). ``polygraphy --plugins`` only ``dlopen``s a
library, which does not register ``getCreators`` plugins: the registry's ``load_library`` does.
"""

from __future__ import annotations

import logging
import os
import pathlib

from flashspec_export.config import ConfigError

logger = logging.getLogger(__name__)

LIBRARY_ENV = "FLASHSPEC_PLUGINS_LIB"
DEFAULT_LIBRARY = pathlib.Path(__file__).parents[2] / "plugins/build/libflashspec_plugins.so"
PLUGIN_NAMESPACE = "flashspec"


def library_path() -> pathlib.Path | None:
    """The plugin library, or None when it is not built. A ``$FLASHSPEC_PLUGINS_LIB`` that
    names no file is an error (the user asked for it)."""
    if LIBRARY_ENV in os.environ:
        path = pathlib.Path(os.environ[LIBRARY_ENV])
        if not path.is_file():
            raise ConfigError(f"{LIBRARY_ENV}: {path} is not a file (the plugin library)")
        return path
    return DEFAULT_LIBRARY if DEFAULT_LIBRARY.is_file() else None


def _unversioned_rtx_library(trt) -> None:
    """TensorRT-RTX's ONNX parser ``dlopen``s ``libtensorrt_rtx.so`` when it meets a plugin, and
    the wheel ships only ``libtensorrt_rtx.so.1`` (the parse then aborts the process): add the
    symlink beside it (the parser's RPATH is ``$ORIGIN``)."""
    import importlib.util

    spec = importlib.util.find_spec("tensorrt_rtx_libs")
    if spec is None or not spec.submodule_search_locations:
        return
    libs = pathlib.Path(next(iter(spec.submodule_search_locations)))
    link = libs / "libtensorrt_rtx.so"
    if link.exists() or not (libs / "libtensorrt_rtx.so.1").exists():
        return
    try:
        link.symlink_to("libtensorrt_rtx.so.1")
    except OSError as error:
        raise ConfigError(
            f"tensorrt-rtx: its parser needs {link} -> libtensorrt_rtx.so.1 to load plugins and "
            f"it could not be created ({error}); create it, or unset {LIBRARY_ENV}"
        ) from error
    logger.info("created %s -> libtensorrt_rtx.so.1 (TensorRT-RTX plugin loading)", link)


def register(trt, library: pathlib.Path) -> list[str]:
    """Load ``library`` into ``trt``'s plugin registry; returns the flashspec creators' names."""
    if trt.__name__ == "tensorrt_rtx":
        _unversioned_rtx_library(trt)
    registry = trt.get_plugin_registry()
    registry.load_library(str(library))
    names = sorted(c.name for c in registry.all_creators if c.plugin_namespace == PLUGIN_NAMESPACE)
    if not names:
        raise RuntimeError(f"{library}: loaded, but no creator of namespace {PLUGIN_NAMESPACE!r}")
    return names


# The VerifyResample creator's field that says which optional inputs (top_k, top_p,
# allowed_tokens) a node has: a library whose creator lists it takes them.
OPTIONAL_INPUTS_FIELD = "optional_inputs"


def creator_fields(trt, op_type: str) -> list[str]:
    """The field names the registered flashspec creator of ``op_type`` takes (``register``
    first); a ConfigError when none is registered."""
    registry = trt.get_plugin_registry()
    for creator in registry.all_creators:
        if creator.plugin_namespace == PLUGIN_NAMESPACE and creator.name == op_type:
            return [field.name for field in creator.field_names]
    raise ConfigError(f"plugins: no {PLUGIN_NAMESPACE} creator of {op_type} is registered")


def takes_optional_inputs(trt) -> bool:
    """Whether the registered VerifyResample plugin takes its optional inputs (top_k, top_p,
    allowed_tokens, as a prefix: the TensorRT parser hands the plugin no skipped one). An older
    library refuses a node with them when the network is parsed."""
    return OPTIONAL_INPUTS_FIELD in creator_fields(trt, "VerifyResample")
