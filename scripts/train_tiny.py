"""Train the tiny target and its drafters (MTP head, EAGLE head, standalone draft model) on the
standard library's source files, with a byte-level BPE tokenizer trained by the same run: the
``stdlib-tiny`` preset (flashspec_export/presets/stdlib-tiny) is this script's output.

python scripts/train_tiny.py --out out/stdlib-tiny                 # on a GPU: a few minutes
python scripts/export.py --target out/stdlib-tiny --draft eagle    # a trained directory exports
"""

from __future__ import annotations

import logging
import pathlib

from flashspec_export import cli
from flashspec_export.training.tiny import TrainConfig, train


def main() -> None:
    parser = cli.parser(__doc__)
    d = TrainConfig()
    add = parser.add_argument
    add("--out", required=True, help="output directory (must not exist)")
    add("--steps", type=cli.int_range(1), default=d.steps, help="target training steps")
    add("--batch", type=cli.int_range(1), default=d.batch)
    add("--seq-len", type=cli.int_range(8), default=d.seq_len)
    add("--hidden-size", type=cli.int_range(16), default=d.hidden_size)
    add("--layers", type=cli.int_range(1), default=d.num_layers)
    add("--vocab-size", type=cli.int_range(300), default=d.vocab_size)
    add("--device", default=d.device, help="cuda or cpu")
    add("--max-files", type=cli.int_range(2), default=None, help="a subset of the corpus")
    args = parser.parse_args()
    if pathlib.Path(args.out).exists():
        parser.exit(2, f"error: out: {args.out} exists; choose a new directory\n")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    config = TrainConfig(
        vocab_size=args.vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=2 * args.hidden_size,
        num_layers=args.layers,
        seq_len=args.seq_len,
        batch=args.batch,
        steps=args.steps,
        device=args.device,
        max_files=args.max_files,
    )
    report = train(config, args.out)
    for name, (first, last) in report.losses.items():
        print(f"{name}: loss {first:.2f} -> {last:.2f}")
    print(f"target held out: {report.held_out_loss:.2f} ({report.tokens} training tokens)")


if __name__ == "__main__":
    main()
