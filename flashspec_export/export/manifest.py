"""``manifest.json``: what an export holds — the contract between export, engine and runtime.

An export directory is written whole or not at all (``pipeline.export`` writes into a temporary
directory beside it and renames it into place), and the manifest records the SHA-256 of every
graph file, so a reader can tell a damaged or mixed export from a good one (``verify``).
"""

from __future__ import annotations

import hashlib
import json
import pathlib

from flashspec_export.config import ConfigError

FILE_NAME = "manifest.json"
FORMAT = 1  # bump when the layout changes; readers refuse other formats
REQUIRED = ("format", "config", "vocab_size", "gamma", "drafter", "graphs")


def sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write(directory: pathlib.Path, manifest: dict) -> dict:
    """Write ``manifest`` (its graphs' files already in ``directory``), adding the format and
    the files' hashes; returns what was written."""
    for graph in manifest["graphs"].values():
        graph["sha256"] = sha256(directory / graph["file"])
        if graph["external_data"]:
            graph["data_sha256"] = sha256(directory / (graph["file"] + ".data"))
    manifest = {"format": FORMAT, **manifest}
    (directory / FILE_NAME).write_text(json.dumps(manifest, indent=1))
    return manifest


def read(directory: str | pathlib.Path) -> dict:
    """The manifest of an export directory; a clear error when it is missing or damaged."""
    path = pathlib.Path(directory) / FILE_NAME
    if not path.is_file():
        raise FileNotFoundError(f"export: {path} not found (run scripts/export.py first)")
    try:
        manifest = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConfigError(f"export: {path} is not valid JSON ({error}); re-export") from error
    if not isinstance(manifest, dict):
        raise ConfigError(f"export: {path} holds no manifest object; re-export")
    missing = [key for key in REQUIRED if key not in manifest]
    if missing:
        raise ConfigError(f"export: {path} lacks {', '.join(missing)}; re-export")
    if manifest["format"] != FORMAT:
        raise ConfigError(
            f"export: {path} has format {manifest['format']}, this version reads {FORMAT}; "
            "re-export"
        )
    return manifest


def verify(directory: str | pathlib.Path, manifest: dict, graphs=None) -> None:
    """Refuse an export whose graph files (``graphs``: names, default all) are missing or do not
    match the hashes in its manifest, naming the file."""
    directory = pathlib.Path(directory)
    for name in graphs or manifest["graphs"]:
        entry = manifest["graphs"][name]
        files = [(entry["file"], entry.get("sha256"))]
        if entry.get("external_data"):
            files.append((entry["file"] + ".data", entry.get("data_sha256")))
        for file, expected in files:
            path = directory / file
            if not path.is_file():
                raise ConfigError(f"export: {path} is missing (the manifest lists it); re-export")
            if expected is None or sha256(path) != expected:
                raise ConfigError(
                    f"export: {path} does not match its manifest (SHA-256); the export is "
                    "damaged or mixed: re-export"
                )
