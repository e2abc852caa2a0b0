"""Build TensorRT engines from an export's graphs with ``polygraphy convert``.

Works with full TensorRT (where the FlashSpec plugins resolve the custom nodes) and with
TensorRT-RTX (``POLYGRAPHY_USE_TENSORRT_RTX=1``: no plugins, the parser inlines the function
bodies; its parser and builder run on a CPU-only machine). Dynamic token axes get a profile
1 .. the cache length; the engines go to ``<export>/engines/<graph>.engine``.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import pathlib
import subprocess

from flashspec_export.config import ConfigError
from flashspec_export.runtime.sessions import read_manifest

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


def polygraphy_command(directory, manifest: dict, graph: str, engine: pathlib.Path) -> list[str]:
    """``polygraphy convert`` of ``graph`` (e.g. "target_step") of the export in ``directory``
    described by ``manifest``."""
    entry = manifest["graphs"][graph]
    source = pathlib.Path(directory) / entry["file"]
    command = ["polygraphy", "convert", str(source), "-o", str(engine)]
    shapes = profile(entry["inputs"], manifest["config"]["max_len"])
    dynamic = {name: s for name, s in shapes.items() if s[0] != s[2]}
    flags = ("--trt-min-shapes", "--trt-opt-shapes", "--trt-max-shapes")
    if dynamic:
        for index, flag in enumerate(flags):
            command.append(flag)
            command += [f"{name}:[{','.join(map(str, s[index]))}]" for name, s in dynamic.items()]
    return command


def build_engines(directory, graphs=None, force: bool = False) -> dict[str, pathlib.Path]:
    """Build the engines of ``graphs`` (default: all) of an export; returns name -> engine path.

    An existing engine is kept unless ``force``. Uses TensorRT when installed, else TensorRT-RTX.
    """
    directory = pathlib.Path(directory)
    manifest = read_manifest(directory)
    names = graphs or list(manifest["graphs"])
    unknown = [n for n in names if n not in manifest["graphs"]]
    if unknown:
        known = ", ".join(manifest["graphs"])
        raise ConfigError(f"graphs: {', '.join(unknown)} not in this export (it has {known})")
    out = directory / "engines"
    existing = [n for n in names if (out / f"{n}.engine").exists()]
    if existing and not force:
        raise FileExistsError(
            f"out: {out} already has {', '.join(existing)}; pass --force to rebuild them"
        )
    env = dict(os.environ)
    if tensorrt_flavour() == "tensorrt_rtx":
        env["POLYGRAPHY_USE_TENSORRT_RTX"] = "1"
    out.mkdir(exist_ok=True)
    engines = {}
    for name in names:
        engine = out / f"{name}.engine"
        command = polygraphy_command(directory, manifest, name, engine)
        logger.info("%s", " ".join(command))
        result = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
        if result.returncode != 0:
            raise RuntimeError(f"{name}: polygraphy convert failed:\n{result.stdout[-3000:]}")
        engines[name] = engine
    return engines
