"""The loop's host-side cost per step over a long output: the stdlib-tiny pair (its target,
exported, in onnxruntime; the n-gram drafter) generating N tokens (default 16384) of one
sequence at T = 0.8 with the text streamed (the stdlib-tiny tokenizer's TextStream, a stop
string that never matches) — what ``scripts/generate.py --prompt ... --stop ...`` runs.

Host-side time of a step: from the end of one target step to the start of the next (accepting,
streaming the text, the drafter's update and next proposal, the bookkeeping); the target's own
time is reported beside it. Means over the steps that end in the first and in the last thousand
tokens, and their ratio (issue 33: decoding the whole text at every push and scanning the whole
sequence at every proposal made it grow with the output). Then the same tokens are replayed
(``--replays`` times, the median reported) through a target that only emits them: the same
steps, streaming and proposals, without the export's growing attention (whose memory traffic
also slows the host code that follows it on a small CPU).

The preset holds 1024 positions: the export is made from a copy of its checkpoint whose
``max_position_embeddings`` fits N (RoPE extends; the text past 1024 tokens is not meaningful,
its cost is what is measured), in float32, by the code under test (``--export`` reuses one).

python docs/bench/long_run.py --json docs/bench/long_run.json --label after
PYTHONPATH=/tmp/before python docs/bench/long_run.py --json docs/bench/long_run.json --label before
(``git worktree add /tmp/before 9aa4ab1``: the code before the incremental TextStream and
n-gram index; each label's entry records the commit it ran.)
"""

from __future__ import annotations

import argparse
import dataclasses
import inspect
import itertools
import json
import os
import pathlib
import platform
import shutil
import subprocess
import tempfile
import time

import torch

import flashspec_export
from flashspec_export.export import manifest as export_manifest
from flashspec_export.models.ngram import NgramDrafter
from flashspec_export.runtime import sessions, text
from flashspec_export.runtime.loop import Target, generate

PROMPT = "import os\nimport sys\n\n\ndef main(argv):\n    "
NEVER = "\u2603\u2603\u2603"  # a stop string the model does not write
WINDOW = 1000  # tokens at the start and at the end of the run
PACKAGE = pathlib.Path(flashspec_export.__file__).parent


def export_long(out: pathlib.Path, max_len: int, gamma: int) -> None:
    """Export the stdlib-tiny target (n-gram drafter, float32) with ``max_len`` positions."""
    from flashspec_export.export.pipeline import export
    from flashspec_export.models.build import ExportConfig

    checkpoint = out.parent / "checkpoint"
    shutil.copytree(PACKAGE / "presets" / "stdlib-tiny" / "target", checkpoint)
    config = json.loads((checkpoint / "config.json").read_text())
    config["max_position_embeddings"] = max_len
    (checkpoint / "config.json").write_text(json.dumps(config))
    export(
        ExportConfig(
            target=str(checkpoint),
            draft="ngram",
            out=str(out),
            gamma=gamma,
            max_len=max_len,
            dtype="float32",
        )
    )


def open_export(directory: pathlib.Path):
    """(target, drafter, tokenizer) of an export, with this code's or the earlier code's API
    (before the manifest was handed down, each function read it itself)."""
    if "manifest" in inspect.signature(sessions.from_export).parameters:
        manifest = export_manifest.read(directory)
        target, drafter = sessions.from_export(directory, manifest)
        return target, drafter, text.load_tokenizer(directory, manifest)
    target, drafter = sessions.from_export(directory)
    return target, drafter, text.load_tokenizer(directory)


def replayed_target(script: list[int], max_len: int) -> Target:
    """A target that emits ``script`` (the prompt, then the tokens a run generated): a step
    accepts the drafts that equal the script's next tokens and emits the one after, which is
    what the coupled rule did in that run (a draft is accepted iff it equals the sampled token),
    with O(γ) work and no memory traffic of its own."""

    def prefill(tokens, positions, k, v):
        return torch.zeros(*tokens.shape, 1), k, v

    def step(tokens, positions, k, v, temperature, seed):
        n, width = tokens.shape  # [N, γ + 1]: the last accepted token, then the drafts
        emitted = torch.full((n, width), -1, dtype=torch.int64)
        num_emitted = torch.zeros(n, dtype=torch.int64)
        for row, (fed, position) in enumerate(
            zip(tokens.tolist(), positions.tolist(), strict=True)
        ):
            follow = script[position + 1 : position + 1 + width]  # fed[0] is script[position]
            accepted = 0
            while accepted < width - 1 and fed[1 + accepted] == follow[accepted]:
                accepted += 1
            emitted[row, : accepted + 1] = torch.tensor(follow[: accepted + 1])
            num_emitted[row] = accepted + 1
        return emitted, num_emitted, torch.zeros(n, width), torch.zeros(n, width, 1), k, v

    return Target(prefill, step, (1, 1, 1, max_len, 1))


def timed_run(target, drafter, tokenizer, prompt, new_tokens, gamma, temperature, seed):
    """(result, windows): ``generate`` with the text streamed, and the mean host-side and
    target ms per step over the steps that end in the first and in the last thousand tokens."""
    calls = []  # per target step: (start, end, tokens generated before it)
    generated = [0]

    def timed_step(*args):
        start = time.perf_counter()
        out = target.step(*args)
        calls.append((start, time.perf_counter(), generated[0]))
        return out

    stream = text.TextStream(tokenizer, 1, (NEVER,), lambda row, piece: None, eos=())
    push = stream.push

    def counted_push(row, tokens):
        keep = push(row, tokens)
        generated[0] += len(tokens) if keep is None else keep
        return keep

    stream.push = counted_push
    result = generate(
        dataclasses.replace(target, step=timed_step),
        drafter,
        prompt,
        new_tokens,
        gamma,
        torch.full((1,), temperature),
        torch.tensor([seed]),
        stream=stream,
    )
    # step i's host side: from its target call's end to the next call's start; it ends with
    # `after` tokens generated (those its target call emitted)
    steps = [
        dict(host=nxt[0] - cur[1], target=cur[1] - cur[0], after=nxt[2])
        for cur, nxt in itertools.pairwise(calls)
    ]
    total = len(result.tokens[0])

    def window(selected):
        return {
            "steps": len(selected),
            "host_ms_per_step": 1e3 * sum(s["host"] for s in selected) / len(selected),
            "target_ms_per_step": 1e3 * sum(s["target"] for s in selected) / len(selected),
        }

    first = window([s for s in steps if s["after"] <= WINDOW])
    last = window([s for s in steps if s["after"] > total - WINDOW])
    ratio = last["host_ms_per_step"] / first["host_ms_per_step"]
    return result, {"first_1000": first, "last_1000": last, "host_ratio_last_to_first": ratio}


def measure(directory: pathlib.Path, args) -> dict:
    """The export's run, then ``args.replays`` replays of its tokens (the median replay by
    its last-thousand host time is reported)."""
    target, drafter, tokenizer = open_export(directory)
    prompt = text.encode_prompts(tokenizer, [PROMPT])
    options = (args.new_tokens, args.gamma, args.temperature, args.seed)
    result, export_windows = timed_run(target, drafter, tokenizer, prompt, *options)
    script = prompt[0] + result.tokens[0]
    replays = []
    for _ in range(args.replays):
        replayed = replayed_target(
            script + [script[-1]] * (args.gamma + 1), len(script) + args.gamma
        )
        again, windows = timed_run(replayed, NgramDrafter(), tokenizer, prompt, *options)
        assert again.tokens == result.tokens and again.steps == result.steps
        replays.append(windows)
    replays.sort(key=lambda w: w["last_1000"]["host_ms_per_step"])
    return {
        "new_tokens": len(result.tokens[0]),
        "steps": result.steps,
        "tokens_per_step": result.mean_emitted,
        "export": export_windows,
        "replay": replays[len(replays) // 2],
        "replays_host_ratio": [w["host_ratio_last_to_first"] for w in replays],
    }


def _cpu() -> str:
    cpuinfo = pathlib.Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _commit() -> str:
    try:
        return subprocess.run(
            ["git", "-C", str(PACKAGE), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--new-tokens", type=int, default=16384)
    parser.add_argument("--gamma", type=int, default=3)
    parser.add_argument("--temperature", type=float, default=0.8)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--replays", type=int, default=3, help="replays of the run's tokens")
    parser.add_argument("--export", default=None, help="an export made by this script (reused)")
    parser.add_argument("--label", default="run", help="the key of this run in --json")
    parser.add_argument("--json", default=None, help="add this run to a JSON object there")
    args = parser.parse_args()
    if args.new_tokens <= 2 * WINDOW:
        parser.error(f"--new-tokens: expected more than {2 * WINDOW}, got {args.new_tokens}")
    with tempfile.TemporaryDirectory() as tmp:
        directory = pathlib.Path(args.export or pathlib.Path(tmp) / "export")
        if args.export is None:
            export_long(directory, args.new_tokens + 256, args.gamma)
        run = measure(directory, args)
    run["setup"] = {
        **{k: v for k, v in vars(args).items() if k not in ("json", "export")},
        "prompt": PROMPT,
        "stop": NEVER,
        "commit": _commit(),
        "package": str(PACKAGE),
        "cpu": _cpu(),
        "cores": os.cpu_count(),
        "load_average_after": os.getloadavg()[0],  # other work on the machine during the run
        "python": platform.python_version(),
        "torch": torch.__version__,
        "onnxruntime": __import__("onnxruntime").__version__,
        "tokenizers": __import__("tokenizers").__version__,
    }
    print(
        f"{args.label} ({run['setup']['commit']}): {run['new_tokens']} tokens, {run['steps']} "
        f"steps ({run['tokens_per_step']:.2f} tokens per step)"
    )
    for name in ("export", "replay"):
        first, last = run[name]["first_1000"], run[name]["last_1000"]
        print(
            f"  {name}: host ms per step, first {WINDOW} tokens {first['host_ms_per_step']:.3f}, "
            f"last {WINDOW} {last['host_ms_per_step']:.3f} "
            f"(x{run[name]['host_ratio_last_to_first']:.2f}); target ms per step "
            f"{first['target_ms_per_step']:.3f} / {last['target_ms_per_step']:.3f}"
        )
    if args.json:
        path = pathlib.Path(args.json)
        runs = json.loads(path.read_text()) if path.is_file() else {}
        runs[args.label] = run
        path.write_text(json.dumps(runs, indent=1) + "\n")


if __name__ == "__main__":
    main()
