"""Build TensorRT engines from an export with ``polygraphy convert`` (TensorRT if installed,
else TensorRT-RTX, whose builder runs without a GPU).

python scripts/build_engines.py out/tiny-llama-mtp                      # every graph
python scripts/build_engines.py out/tiny-llama-mtp --graphs target_prefill drafter_mtp
"""

from __future__ import annotations

import argparse
import logging

from flashspec_export.config import ConfigError
from flashspec_export.engine.build import build_engines


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("export_dir", help="an output directory of scripts/export.py")
    parser.add_argument("--graphs", nargs="+", default=None, help="default: every graph")
    parser.add_argument("--force", action="store_true", help="rebuild existing engines")
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    try:
        engines = build_engines(args.export_dir, args.graphs, args.force)
    except (ConfigError, FileExistsError, FileNotFoundError) as error:
        parser.exit(2, f"error: {error}\n")
    for name, path in engines.items():
        print(f"{name}: {path} ({path.stat().st_size / 2**20:.1f} MiB)")


if __name__ == "__main__":
    main()
