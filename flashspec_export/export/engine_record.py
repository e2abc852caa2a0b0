"""``engines/engines.json``: the engines of an export and what each was built from.

``engine.build.build_engines`` writes the record into the engines directory it builds (the
directory is replaced whole, engines and record together); ``runtime.sessions.from_engines``
``verify``s an export's engines against it before loading one: each engine file against its
SHA-256 (a replaced or damaged engine), the graph it was built from against the export's
manifest (an engine of an earlier export), and the TensorRT that built it against the one that
runs it (a serialized engine runs only on the TensorRT version that built it). The ONNX graphs
are not hashed there: the runtime never loads them.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from flashspec_export.config import ConfigError
from flashspec_export.export import manifest as export_manifest
from flashspec_export.export.manifest import expect_type, json_fields

DIRECTORY = "engines"  # in the export directory
FILE_NAME = "engines.json"
FORMAT = 1  # bump when the layout changes; readers refuse other formats
REBUILD = "rebuild with scripts/build_engines.py --force"


@dataclass(frozen=True)
class Engine:
    """One engine: its file (in ``engines/``) and SHA-256, the SHA-256 of the ONNX graph and of
    the weights file it was built from (the manifest's at the build), the TensorRT that built it
    (``flavour``: the module, tensorrt or tensorrt_rtx, and its version), and whether the
    FlashSpec plugin library resolved the ``flashspec`` nodes (else their function bodies were
    inlined)."""

    file: str
    sha256: str
    graph_sha256: str
    data_sha256: str | None
    flavour: str
    version: str
    plugins: bool


@dataclass(frozen=True)
class Record:
    """The engines of an export by graph name."""

    engines: Mapping[str, Engine]
    format: int = field(default=FORMAT)

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)


def engine_of(
    directory: pathlib.Path,
    file: str,
    graph: export_manifest.Graph,
    flavour: str,
    version: str,
    plugins: bool,
) -> Engine:
    """The ``Engine`` entry of ``directory / file`` (already written), built from ``graph``."""
    return Engine(
        file=file,
        sha256=export_manifest.sha256(directory / file),
        graph_sha256=graph.sha256,
        data_sha256=graph.data_sha256,
        flavour=flavour,
        version=version,
        plugins=plugins,
    )


def write(directory: pathlib.Path, record: Record) -> None:
    """Write ``record`` into the engines ``directory`` (its engines already there)."""
    (pathlib.Path(directory) / FILE_NAME).write_text(record.to_json())


def _engine(data, where: str) -> Engine:
    d = json_fields(Engine, data, where, REBUILD)
    strings = ("file", "sha256", "graph_sha256", "flavour", "version")
    values = {key: expect_type(d[key], str, f"{where}.{key}", REBUILD) for key in strings}
    data_sha256 = expect_type(d["data_sha256"], (str, type(None)), f"{where}.data_sha256", REBUILD)
    plugins = expect_type(d["plugins"], bool, f"{where}.plugins", REBUILD)
    return Engine(data_sha256=data_sha256, plugins=plugins, **values)


def read(directory: str | pathlib.Path) -> Record:
    """The record of an engines ``directory``; ConfigError when it is missing or damaged."""
    path = pathlib.Path(directory) / FILE_NAME
    if not path.is_file():
        raise ConfigError(
            f"engines: {path} not found (engines built before engines were recorded, or not by "
            f"scripts/build_engines.py); {REBUILD}"
        )
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"engines: {path} is not valid JSON ({error}); {REBUILD}") from error
    where = f"engines: {path}"
    expect_type(data, dict, where, REBUILD)
    if data.get("format", FORMAT) != FORMAT:
        raise ConfigError(
            f"{where} has format {data['format']}, this version reads {FORMAT}; {REBUILD}"
        )
    d = json_fields(Record, data, where, REBUILD)
    engines = {
        name: _engine(entry, f"{where}: engines.{name}")
        for name, entry in expect_type(d["engines"], dict, f"{where}: engines", REBUILD).items()
    }
    return Record(engines)


def verify(
    export_dir: str | pathlib.Path,
    manifest: export_manifest.Manifest,
    flavour: str,
    version: str,
    graphs=None,
) -> dict[str, pathlib.Path]:
    """Refuse the engines of ``graphs`` (names, default all of the manifest's) unless each is
    recorded, built from the export's current graph and weights, by the ``flavour`` (module
    name) and ``version`` of TensorRT that will run it, and unchanged since (SHA-256). Returns
    the engine path of each graph."""
    engines = pathlib.Path(export_dir) / DIRECTORY
    names = list(graphs or manifest.graphs)
    missing = [n for n in names if not (engines / f"{n}.engine").is_file()]
    if missing:
        raise ConfigError(
            f"engines: {engines} lacks {', '.join(missing)}; run scripts/build_engines.py first"
        )
    record = read(engines)
    paths = {}
    for name in names:
        path = engines / f"{name}.engine"
        entry = record.engines.get(name)
        if entry is None or entry.file != path.name:
            raise ConfigError(f"engines: {engines / FILE_NAME} has no {path.name}; {REBUILD}")
        graph = manifest.graphs[name]
        if (entry.graph_sha256, entry.data_sha256) != (graph.sha256, graph.data_sha256):
            raise ConfigError(
                f"engines: {path} was built from another export's {graph.file} (the graph or "
                f"weights SHA-256 differs from the manifest's); {REBUILD}"
            )
        if (entry.flavour, entry.version) != (flavour, version):
            raise ConfigError(
                f"engines: {path} was built by {entry.flavour} {entry.version}, this runtime has "
                f"{flavour} {version} (an engine runs only on the TensorRT that built it); "
                f"{REBUILD}"
            )
        if export_manifest.sha256(path) != entry.sha256:
            raise ConfigError(
                f"engines: {path} does not match its record (SHA-256): replaced or damaged "
                f"since the build; {REBUILD}"
            )
        paths[name] = path
    return paths
