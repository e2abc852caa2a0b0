"""``manifest.json``: what an export holds — the one contract between export, engine and runtime.

``Manifest`` is typed and versioned: the exporter builds one and ``write``s it; the engine layer
and the runtime ``read`` it (which validates every field's type) and ``verify`` the files it
names. Nothing else reads ``manifest.json``.

An export directory is written whole or not at all (``pipeline.export`` writes into a temporary
directory beside it and renames it into place), and the manifest records the SHA-256 of every
graph file, so a reader can tell a damaged or mixed export from a good one (``verify``).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field

from flashspec_export.config import DTYPE_NAMES, ConfigError

FILE_NAME = "manifest.json"
FORMAT = 7  # bump when the layout or the sampling rule changes; readers refuse other formats
# 5 added ``sampling_params``, 6 an ``allowed_tokens`` input of the target step; 7 is the
# two-level sample (noise version 2, ``reference/verify_resample.py``): the function bodies of a
# format 4-6 export take the per-id Gumbel-max sample, which no backend of this version computes,
# so those exports are re-exported rather than run with a sample of another rule.
FORMATS = (7,)
# The per-sequence sampling inputs of a ``--sampling-params`` export's target step, after
# ``seed``: VerifyResample's optional top_k [N] int64 (0: off) and top_p [N] float32 (1: off).
SAMPLING_PARAMS = ("top_k", "top_p")


def replace_directory(out: pathlib.Path, staging: pathlib.Path) -> None:
    """Put the finished ``staging`` directory at ``out`` (an export, or its ``engines/``): an
    earlier one there is moved aside first and removed only once the new one is in place, so
    ``out`` is always whole."""
    if not out.exists():
        staging.rename(out)
        return
    old = out.with_name(f".{out.name}.old-{uuid.uuid4().hex[:8]}")
    out.rename(old)
    staging.rename(out)
    shutil.rmtree(old)


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@dataclass(frozen=True)
class TensorSpec:
    """A graph input or output: ONNX dtype name ("INT64", "FLOAT", ...) and shape, whose dims are
    ints or symbolic names (dynamic axes)."""

    name: str
    dtype: str
    shape: tuple[int | str, ...]


@dataclass(frozen=True)
class Graph:
    """One ONNX graph of the export and the hashes of its files (``data_file``: the export's
    weights file, shared by its graphs, that the graph's large initializers live in)."""

    file: str
    inputs: tuple[TensorSpec, ...]
    outputs: tuple[TensorSpec, ...]
    sha256: str
    data_file: str | None = None
    data_sha256: str | None = None

    def files(self) -> list[tuple[str, str | None]]:
        """(file name, expected SHA-256) of every file of the graph."""
        extra = [(self.data_file, self.data_sha256)] if self.data_file else []
        return [(self.file, self.sha256), *extra]

    def input(self, name: str) -> TensorSpec:
        return next(i for i in self.inputs if i.name == name)

    @property
    def cache_shape(self) -> tuple[int, ...]:
        """[L, N, KV, S, D] of the graph's KV cache: one input per layer, ``k_cache_<i>`` and
        ``v_cache_<i>`` of shape [N, KV, S, D]."""
        layers = sum(i.name.startswith("k_cache_") for i in self.inputs)
        return (layers, *self.input("k_cache_0").shape)


@dataclass(frozen=True)
class OpVersion:
    """How a ``flashspec`` node is named in the graphs (ONNX domain) and resolved by TensorRT
    (plugin creator)."""

    domain: str
    version: int
    plugin_namespace: str
    plugin_version: str


@dataclass(frozen=True)
class Manifest:
    """An export: the configuration it was made from (``ExportConfig`` fields), the model's
    geometry, the drafter and γ, the custom ops, the graphs by name (``target_prefill``,
    ``target_step``, ``drafter_<draft>``), and the SHA-256 of the weights the graphs were made
    from (``models.build.weights_sha256``: ``--check`` rebuilds the reference from the config
    and refuses other weights)."""

    config: Mapping[str, object]
    source: str
    architecture: str
    vocab_size: int
    padded_vocab: int
    hidden_size: int
    gamma: int
    drafter: str
    opset: int
    ops: Mapping[str, OpVersion]
    graphs: Mapping[str, Graph]
    weights_sha256: str
    tokenizer: str | None = None  # directory of the target's tokenizer files in the export
    sampling_params: tuple[str, ...] = ()  # the target step's SAMPLING_PARAMS inputs, or none
    format: int = field(default=FORMAT)

    @property
    def batch(self) -> int:
        return int(self.config["batch"])

    @property
    def max_len(self) -> int:
        return int(self.config["max_len"])

    @property
    def dtype(self) -> str:
        """The float type of the graphs' weights, hidden states and caches."""
        return str(self.config["dtype"])

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), indent=1)


def hashed_graph(
    directory: pathlib.Path,
    file: str,
    inputs,
    outputs,
    data_file: str | None = None,
    data_sha256: str | None = None,
) -> Graph:
    """The ``Graph`` entry of ``directory / file`` (already written) and its weights file (with
    the hash the caller computed once for all graphs)."""
    return Graph(
        file=file,
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        sha256=sha256(directory / file),
        data_file=data_file,
        data_sha256=data_sha256,
    )


def write(directory: pathlib.Path, manifest: Manifest) -> None:
    """Write ``manifest`` into ``directory`` (its graphs' files already there)."""
    (pathlib.Path(directory) / FILE_NAME).write_text(manifest.to_json())


# ---- reading: every field's type is checked, so a damaged manifest fails here, by name


def expect_type(value, kind, where: str, remedy: str = "re-export"):
    """``value`` if it is a ``kind`` (a bool is no int); else ConfigError naming ``where``."""
    ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
    if not ok:
        names = " or ".join(k.__name__ for k in (kind if isinstance(kind, tuple) else (kind,)))
        raise ConfigError(f"{where}: expected {names}, got {type(value).__name__}; {remedy}")
    return value


def json_fields(cls, data, where: str, remedy: str = "re-export") -> dict:
    """The fields of dataclass ``cls`` from the JSON object ``data`` (missing ones named)."""
    expect_type(data, dict, where, remedy)
    required = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    missing = [name for name in required if name not in data]
    if missing:
        raise ConfigError(f"{where} lacks {', '.join(missing)}; {remedy}")
    known = {f.name for f in dataclasses.fields(cls)}
    return {key: value for key, value in data.items() if key in known}


def _tensor(data, where: str) -> TensorSpec:
    d = json_fields(TensorSpec, data, where)
    shape = tuple(
        expect_type(dim, (int, str), f"{where}.shape")
        for dim in expect_type(d["shape"], list, where)
    )
    return TensorSpec(
        expect_type(d["name"], str, where), expect_type(d["dtype"], str, where), shape
    )


def _graph(data, where: str) -> Graph:
    d = json_fields(Graph, data, where)
    tensors = {
        side: tuple(
            _tensor(t, f"{where}.{side}[{i}]")
            for i, t in enumerate(expect_type(d[side], list, f"{where}.{side}"))
        )
        for side in ("inputs", "outputs")
    }
    return Graph(
        file=expect_type(d["file"], str, f"{where}.file"),
        sha256=expect_type(d["sha256"], str, f"{where}.sha256"),
        data_file=expect_type(d.get("data_file"), (str, type(None)), f"{where}.data_file"),
        data_sha256=expect_type(d.get("data_sha256"), (str, type(None)), f"{where}.data_sha256"),
        **tensors,
    )


def _op(data, where: str) -> OpVersion:
    d = json_fields(OpVersion, data, where)
    return OpVersion(
        expect_type(d["domain"], str, f"{where}.domain"),
        expect_type(d["version"], int, f"{where}.version"),
        expect_type(d["plugin_namespace"], str, f"{where}.plugin_namespace"),
        expect_type(d["plugin_version"], str, f"{where}.plugin_version"),
    )


def from_json(data, where: str = FILE_NAME) -> Manifest:
    """A ``Manifest`` from parsed JSON; ``ConfigError`` naming the first bad field."""
    expect_type(data, dict, where)
    if "format" in data and data["format"] not in FORMATS:
        newer = isinstance(data["format"], int) and data["format"] > FORMAT
        raise ConfigError(
            f"{where} has format {data['format']}, this version reads "
            f"{', '.join(map(str, FORMATS))}; "
            + ("upgrade flashspec-export to read it" if newer else "re-export")
        )
    d = json_fields(Manifest, {"format": FORMAT, **data}, where)
    ints = ("vocab_size", "padded_vocab", "hidden_size", "gamma", "opset")
    strings = ("source", "architecture", "drafter", "weights_sha256")
    values = {key: expect_type(d[key], int, f"{where}: {key}") for key in ints}
    values |= {key: expect_type(d[key], str, f"{where}: {key}") for key in strings}
    config = expect_type(d["config"], dict, f"{where}: config")
    for key in ("batch", "max_len"):
        expect_type(config.get(key), int, f"{where}: config.{key}")
    if config.get("dtype") not in DTYPE_NAMES:
        raise ConfigError(
            f"{where}: config.dtype: expected one of {', '.join(DTYPE_NAMES)}, got "
            f"{config.get('dtype')!r}"
        )
    ops = {
        name: _op(entry, f"{where}: ops.{name}")
        for name, entry in expect_type(d["ops"], dict, f"{where}: ops").items()
    }
    graphs = {
        name: _graph(entry, f"{where}: graphs.{name}")
        for name, entry in expect_type(d["graphs"], dict, f"{where}: graphs").items()
    }
    tokenizer = d.get("tokenizer")
    if tokenizer is not None:
        expect_type(tokenizer, str, f"{where}: tokenizer")
    sampling = tuple(expect_type(d.get("sampling_params", []), list, f"{where}: sampling_params"))
    if sampling not in ((), SAMPLING_PARAMS):
        raise ConfigError(
            f"{where}: sampling_params: expected [] or {list(SAMPLING_PARAMS)}, got "
            f"{list(sampling)}; re-export"
        )
    return Manifest(
        config=config,
        ops=ops,
        graphs=graphs,
        tokenizer=tokenizer,
        sampling_params=sampling,
        format=d["format"],
        **values,
    )


def read(directory: str | pathlib.Path) -> Manifest:
    """The manifest of an export directory; a clear error when it is missing or damaged."""
    path = pathlib.Path(directory) / FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"export: {path} not found (run scripts/export.py first)")
    try:
        data = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"export: {path} is not valid JSON ({error}); re-export") from error
    if not isinstance(data, dict):
        raise ConfigError(f"export: {path} holds no manifest object; re-export")
    return from_json(data, f"export: {path}")


def verify(directory: str | pathlib.Path, manifest: Manifest, graphs=None) -> None:
    """Refuse an export whose graph files (``graphs``: names, default all) are missing or do not
    match the hashes in its manifest, naming the file."""
    directory = pathlib.Path(directory)
    checked = set()  # the weights file is shared: hashed once
    for name in graphs or manifest.graphs:
        for file, expected in manifest.graphs[name].files():
            path = directory / file
            if file in checked:
                continue
            checked.add(file)
            if not path.is_file():
                raise ConfigError(f"export: {path} is missing (the manifest lists it); re-export")
            if expected is None or sha256(path) != expected:
                raise ConfigError(
                    f"export: {path} does not match its manifest (SHA-256); the export is "
                    "damaged or mixed: re-export"
                )
