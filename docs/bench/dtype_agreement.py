"""How often an export's tokens differ from the PyTorch modules in the same dtype (onnxruntime,
CPU): stdlib-tiny + MTP exported in bf16, fp16 and fp32, random 16-token prompts, T = 0.8.

Per sequence, tokens are compared up to and including the first difference (after it the two
texts part ways); the flip rate is differences / tokens compared.

python docs/bench/dtype_agreement.py --json docs/bench/dtype_agreement_cpu.json
"""

from __future__ import annotations

import argparse
import json
import pathlib
import tempfile

from flashspec_export.export.pipeline import export
from flashspec_export.models.build import ExportConfig
from flashspec_export.runtime.run import RunConfig, run


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, default=40)
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    rows = []
    print("| dtype | sequences identical | tokens compared | differences | flip rate |")
    print("|---|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for dtype in ("bfloat16", "float16", "float32"):
            out = pathlib.Path(tmp) / dtype
            export(ExportConfig(out=str(out), dtype=dtype))
            compared, firsts = 0, []
            for seed in range(args.sequences):
                config = RunConfig(
                    str(out), args.new_tokens, 16, args.temperature, seed, check=True
                )
                report = run(config)
                first = report.first_difference
                compared += args.new_tokens if first is None else first[1] + 1
                if first is not None:
                    firsts.append(first[1])
            row = dict(dtype=dtype, compared=compared, first_differences=firsts)
            row["flip_rate"] = len(firsts) / compared
            rows.append(row)
            same = args.sequences - len(firsts)
            print(
                f"| {dtype} | {same} / {args.sequences} | {compared} | {len(firsts)} | "
                f"{row['flip_rate']:.2%} |",
                flush=True,
            )
    if args.json:
        report = {"setup": vars(args), "rows": rows}
        pathlib.Path(args.json).write_text(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
