"""Build TensorRT engines from an export (TensorRT if installed, else TensorRT-RTX, whose
builder runs without a GPU), with the FlashSpec plugin library where it is built.

python scripts/build_engines.py out/tiny-llama-mtp                      # every graph
python scripts/build_engines.py out/tiny-llama-mtp --graphs target_prefill drafter_mtp
python scripts/build_engines.py out/tiny-llama-mtp --function-bodies    # no plugins: materialised
"""

from __future__ import annotations

import logging

from flashspec_export import cli
from flashspec_export.config import ConfigError
from flashspec_export.engine.build import build_engines


def main() -> None:
    parser = cli.parser(__doc__)
    parser.add_argument("export_dir", help="an output directory of scripts/export.py")
    parser.add_argument("--graphs", nargs="+", default=None, help="default: every graph")
    parser.add_argument("--force", action="store_true", help="rebuild existing engines")
    parser.add_argument(
        "--function-bodies",
        action="store_true",
        help="inline the ops' function bodies even where the plugin library is built",
    )
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        reports = build_engines(args.export_dir, args.graphs, args.force, args.function_bodies)
    except (ConfigError, FileExistsError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    for name, report in reports.items():
        size = report.path.stat().st_size / 2**20
        plugins = ", ".join(report.plugin_layers) or (
            "none (function bodies inlined)" if report.flashspec_nodes else "no flashspec node"
        )
        print(
            f"{name}: {report.path} ({size:.1f} MiB, {report.layers} layers, cache "
            f"{report.cache_dtype}, plugins: {plugins})"
        )


if __name__ == "__main__":
    main()
