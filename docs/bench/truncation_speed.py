"""The fused truncation of VerifyResample (issue 35) on a GPU: its speed beside plain verify and
beside the materialised way serving stacks truncate, and how often its hand-in settles the
kept set on the stdlib-tiny pair's real logits.

Speed (bf16 LM head, ``scripts/kernel_bench.time_graphs``: CUDA graphs, settled, interleaved).
Logits of standard deviation 4 (random hidden states × 4 against a head scaled by H^-1/2; a
trained LM's spread at T ~ 1, where a 0.9 nucleus holds a few hundred of 128k tokens). Providers:

- ``verify``: the shipped op without truncation (the Hopper kernel from 17 rows on sm_90);
- ``verify_portable``: the portable kernel the truncation runs in, without truncation;
- ``verify_hopper``, ``<truncation>_hopper`` (below 17 rows on sm_90): the Hopper kernel and its
  hand-in forced where the portable kernel is the op's choice;
- ``mask``: an allowed-token mask (random bits, half the vocabulary);
- ``top_k_50``, ``top_k_1024``, ``top_p_0.9``, ``top_k_50_top_p_0.9``: the fused truncation with
  ``settle_only`` (no host read; the recomputation of unsettled rows is not timed, their share is
  printed); ``top_k_50_stage1``: its tile pass and finalize without stage 2 (where the time goes);
- ``materialised_*``: fp32 logits, the mask expanded from its bits, ``topk`` threshold, a sorted
  cumulative softmax for top-p, softmax, an exponential race with torch's RNG, drafts accepted
  while equal — what vLLM-style samplers do;
- ``matmul``: cuBLAS alone;
- ``cuda_*``: the CUDA library's (the TensorRT plugins' kernels; with ``plugins/build``), plain
  and truncating (top-k / top-p: the Triton backend's hand-in and stage 2 compiled in, then its
  native exact recomputation of the unsettled rows, included in the time; a mask: its compiled-in
  kernels' masked variants, ``cuda_mask_native`` the native kernels' mask, as before them). The
  path each took is printed and kept in the JSON (``cuda_paths``).

Settle rate: the stdlib-tiny target (fp32, ``transformers``) over held-out standard-library files;
its final hidden states at every position, verified at γ = 0 in batches of R rows with each
(T, top-k, top-p); the share of rows the hand-in does not settle (recomputed materialised by the
op).

    python docs/bench/truncation_speed.py --rows 1 4 16 64 128 512 --json $OUT/truncation.json
"""

from __future__ import annotations

import argparse
import functools
import json
import pathlib
import statistics
import sys

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))
from kernel_bench import time_graphs  # noqa: E402

from flashspec_export import ops  # noqa: E402
from flashspec_export.config import HeadShape  # noqa: E402
from flashspec_export.kernels import hopper_tiles  # noqa: E402
from flashspec_export.kernels import verify_resample as kernel  # noqa: E402
from flashspec_export.kernels.tiles import KernelConfig, choose_config, hopper_row  # noqa: E402
from flashspec_export.ops import cuda  # noqa: E402

GAMMA = 3
PROVIDERS: list[str] = []  # --providers: time only these (and verify); empty: every provider
TRUNCATIONS = {
    "mask": dict(mask=True),
    "top_k_50": dict(top_k=50),
    "top_k_1024": dict(top_k=1024),
    "top_p_0.9": dict(top_p=0.9),
    "top_k_50_top_p_0.9": dict(top_k=50, top_p=0.9),
}


def materialised(hidden, lm_head, drafts, temperature, vocab_size, top_k=0, top_p=1.0, mask=None):
    """A serving stack's sampler: fp32 logits, truncation, softmax, torch RNG, acceptance."""
    n, width, h = hidden.shape
    logits = (hidden.reshape(-1, h) @ lm_head[:vocab_size].T).float()
    logits = logits / temperature.repeat_interleave(width)[:, None]
    if mask is not None:
        ids = torch.arange(vocab_size, device=hidden.device)
        bits = (mask.reshape(n * width, -1)[:, ids // 32] >> (ids % 32).to(torch.int32)) & 1
        logits = logits.masked_fill(bits == 0, float("-inf"))
    if top_k:
        kth = logits.topk(top_k, dim=-1).values[:, -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = logits.sort(dim=-1, descending=True)
        probs = ordered.softmax(dim=-1)
        drop = probs.cumsum(dim=-1) - probs >= top_p
        logits = logits.scatter(-1, order, ordered.masked_fill(drop, float("-inf")))
    probs = logits.softmax(dim=-1)
    y = (probs / torch.empty_like(probs).exponential_()).argmax(dim=-1).view(n, width)
    accept = (drafts == y[:, :-1]).long().cumprod(dim=1)
    return y, accept.sum(dim=1) + 1


def _stage1_only(*args, **kwargs):
    """The truncating launch without its stage 2 (``_truncated_summaries`` skipped while a graph
    captures it): the tile pass and the finalize."""
    saved = kernel._truncated_summaries

    def skip(workspace, keys, *rest, **options):
        return torch.zeros(keys.shape[0], dtype=torch.bool, device=keys.device)

    kernel._truncated_summaries = skip
    try:
        return kernel.verify_resample(*args, settle_only=True, **kwargs)
    finally:
        kernel._truncated_summaries = saved


def speed(head: str, rows_list, out: dict) -> None:
    shape = HeadShape.from_name(head)
    torch.manual_seed(0)  # one LM head (the logs up to 2026-11-27 drew theirs unseeded)
    lm = torch.randn(shape.padded_vocab, shape.hidden_size, device="cuda", dtype=torch.bfloat16)
    lm *= shape.hidden_size**-0.5
    for rows in rows_list:
        n = max(1, rows // (GAMMA + 1))
        width = rows // n
        g = torch.Generator(device="cuda").manual_seed(rows)
        hidden = 4 * torch.randn(n, width, shape.hidden_size, device="cuda", generator=g)
        hidden = hidden.to(torch.bfloat16)
        drafts = torch.randint(0, shape.vocab_size, (n, width - 1), device="cuda", generator=g)
        temperature = torch.ones(n, device="cuda")
        seed = torch.arange(n, device="cuda") + 1
        positions = torch.arange(n, device="cuda") * 7
        words = -(-shape.vocab_size // 32)
        mask = torch.randint(-(2**31), 2**31 - 1, (n, width, words), device="cuda", generator=g)
        mask = mask.to(torch.int32)
        args = (hidden, lm, drafts, temperature, seed, positions, shape.vocab_size)
        portable = choose_config(
            "verify_resample", rows, shape.hidden_size, shape.vocab_size, lm.dtype, lm.device,
            hopper=False,
        )  # fmt: skip
        fns = {
            "verify": functools.partial(kernel.verify_resample, *args),
            "verify_portable": functools.partial(kernel.verify_resample, *args, config=portable),
            "matmul": functools.partial(torch.matmul, hidden.view(-1, shape.hidden_size), lm.T),
        }
        # Below 17 rows (the portable kernel's), the Hopper kernel's hand-in forced: its 17-64
        # row shape, plain (``verify_hopper``) and truncating (``<truncation>_hopper``)
        hopper = None
        if rows < 17 and hopper_tiles.runs_on(hidden.view(rows, -1), lm):
            wide = hopper_row("verify_resample", 17)
            splits = -(-shape.vocab_size // wide.block_v)
            hopper = KernelConfig(
                wide.block_n, wide.block_v, wide.block_k, splits, wide.block_n // 16, wide.stages,
                wide,
            )  # fmt: skip
            fns["verify_hopper"] = functools.partial(kernel.verify_resample, *args, config=hopper)
        library = cuda.available()
        if library:  # the CUDA library (the TensorRT plugins' kernels)
            cuda.prepare(lm.device)
            fns["cuda_verify"] = functools.partial(cuda.verify_resample, *args)
        unsettled, paths = {}, {}
        for name, spec in TRUNCATIONS.items():
            kwargs = {}
            if spec.get("mask"):
                kwargs["allowed_tokens"] = mask
            if "top_k" in spec:
                kwargs["top_k"] = torch.full((n,), spec["top_k"], device="cuda")
            if "top_p" in spec:
                kwargs["top_p"] = torch.full((n,), spec["top_p"], device="cuda")
            fns[name] = functools.partial(kernel.verify_resample, *args, settle_only=True, **kwargs)
            if name == "top_k_50":
                fns[name + "_stage1"] = functools.partial(_stage1_only, *args, **kwargs)
            if hopper is not None and name != "mask":
                fns[name + "_hopper"] = functools.partial(
                    kernel.verify_resample, *args, settle_only=True, config=hopper, **kwargs
                )
            if library:  # its fallback runs on the device: no read back, the whole op timed
                fns["cuda_" + name] = functools.partial(cuda.verify_resample, *args, **kwargs)
                paths[name] = cuda.kernel_path("verify_resample", *args, **kwargs)
            if library and name == "mask":  # a split count off the table's: the native kernels
                code = cuda.dtype_codes()[lm.dtype]
                splits = 1 + cuda.library().flashspecResolveNumSplits(
                    cuda.OPS["verify_resample"], rows, shape.hidden_size, shape.vocab_size, code, 0
                )
                if (
                    cuda.kernel_path("verify_resample", *args, num_splits=splits, **kwargs)
                    == "native"
                ):
                    fns["cuda_mask_native"] = functools.partial(
                        cuda.verify_resample, *args, num_splits=splits, **kwargs
                    )
            _, left = fns[name]()
            unsettled[name] = round(left.float().mean().item(), 4)
            fns["materialised_" + name] = functools.partial(
                materialised, hidden, lm, drafts, temperature, shape.vocab_size,
                top_k=spec.get("top_k", 0), top_p=spec.get("top_p", 1.0),
                mask=mask if spec.get("mask") else None,
            )  # fmt: skip
        if PROVIDERS:
            fns = {k: f for k, f in fns.items() if k == "verify" or k in PROVIDERS}
        times = {k: statistics.median(v) for k, v in time_graphs(fns, 20, 200).items()}
        entry = {"us": {k: round(v, 1) for k, v in times.items()}, "unsettled": unsettled}
        entry["cuda_paths"] = paths
        out.setdefault(head, {})[rows] = entry
        base = times["verify"]
        ratios = " ".join(f"{k} {v:.1f} ({v / base:.2f})" for k, v in times.items())
        print(f"{head} R={rows}: {ratios} | unsettled {unsettled} | cuda {paths}", flush=True)


def stdlib_tiny_states(device: str, files: int = 8, tokens: int = 512):
    """The stdlib-tiny target's final hidden states [P, H] (fp32, ``transformers``) at every
    position of the first ``files`` held-out standard-library files of ``tokens`` tokens, and
    its LM head [V, H]."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from flashspec_export.training import corpus

    path = ROOT / "flashspec_export/presets/stdlib-tiny/target"
    model = AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32).to(device).eval()
    tokenizer = AutoTokenizer.from_pretrained(path)
    states = []
    for file in corpus.stdlib_files():
        if corpus.is_held_out(file):
            ids = tokenizer.encode(corpus.read(file), add_special_tokens=False)[:tokens]
            if len(ids) == tokens:
                with torch.no_grad():
                    x = model.model(torch.tensor([ids], device=device)).last_hidden_state[0]
                states.append(x)
        if len(states) == files:
            break
    return torch.cat(states), model.lm_head.weight.detach().contiguous()


def settle_rate(
    rows_list, out: dict, dtype: torch.dtype = torch.float32, device: str = "cuda", cases=()
) -> None:
    """The unsettled share per (T, top-k, top-p, R) of the backend's hand-in: in bf16
    (``--settle-dtype bfloat16``) from 17 rows on sm_90 the Hopper kernel's, else the portable
    kernel's (``--settle-device cpu``: under ``TRITON_INTERPRET=1``); ``cases``: (T, top-k, top-p)
    triples instead of the whole table (``--settle-cases 1.0:0:0.95 ...``)."""
    hidden, lm = (t.to(dtype) for t in stdlib_tiny_states(device))
    vocab = lm.shape[0]
    table = {}
    every = [(t, k, p) for t in (0.7, 1.0) for k, p in ((20, 1.0), (50, 1.0), (100, 1.0), (0, 0.8),
                                                       (0, 0.9), (0, 0.95), (50, 0.9))]  # fmt: skip
    for temperature, top_k, top_p in cases or every:
        for rows in rows_list:
            left = total = 0
            for start in range(0, hidden.shape[0] - rows + 1, rows):
                h = hidden[start : start + rows, None]
                n = rows
                kwargs = {"top_k": torch.full((n,), top_k, device=device)} if top_k else {}
                if top_p < 1:
                    kwargs["top_p"] = torch.full((n,), top_p, device=device)
                _, unsettled = kernel.verify_resample(
                    h, lm, torch.zeros(n, 0, dtype=torch.int64, device=device),
                    torch.full((n,), temperature, device=device),
                    torch.arange(n, device=device) + start, torch.full((n,), start,
                    device=device), vocab, settle_only=True, **kwargs,
                )  # fmt: skip
                left += int(unsettled.sum())
                total += n
            key = f"T={temperature} top_k={top_k} top_p={top_p} R={rows}"
            table[key] = round(left / total, 4)
            print(f"stdlib-tiny {key}: unsettled {left}/{total}", flush=True)
    out["stdlib_tiny_unsettled"] = table
    if dtype != torch.float32:
        return
    # the op end to end (recomputation included) equals the reference on these rows
    n = 64
    kwargs = dict(
        top_k=torch.full((n,), 50, device=device), top_p=torch.full((n,), 0.9, device=device)
    )
    args = (hidden[:n, None], lm, torch.zeros(n, 0, dtype=torch.int64, device=device),
            torch.ones(n, device=device), torch.arange(n, device=device),
            torch.zeros(n, dtype=torch.int64, device=device))  # fmt: skip
    fused = ops.verify_resample(*args, backend="triton", **kwargs)[0]
    want = ops.verify_resample(*args, backend="reference", **kwargs)[0]
    table["tokens_equal_reference_64_rows"] = bool(torch.equal(fused, want))
    out["stdlib_tiny_unsettled"] = table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--heads", nargs="+", default=["llama3-8b"])
    parser.add_argument("--rows", nargs="+", type=int, default=[1, 4, 16, 64, 128, 512])
    parser.add_argument("--settle-rows", nargs="+", type=int, default=[16, 128])
    parser.add_argument("--no-speed", action="store_true", help="the settle rates only")
    parser.add_argument("--no-settle", action="store_true", help="the speed table only")
    parser.add_argument("--providers", nargs="+", default=[], help="time these (and verify)")
    parser.add_argument("--settle-dtype", default="float32", choices=["float32", "bfloat16"])
    parser.add_argument("--settle-device", default="cuda", help="cpu: the Triton interpreter's")
    parser.add_argument(
        "--settle-cases", nargs="+", default=[], help="T:top_k:top_p (default: all)"
    )
    parser.add_argument("--json", type=pathlib.Path)
    args = parser.parse_args()
    PROVIDERS.extend(args.providers)
    on_gpu = torch.cuda.is_available() and args.settle_device == "cuda"
    name = torch.cuda.get_device_name() if on_gpu else "cpu (Triton interpreter)"
    out = {"device": name}
    print(out, flush=True)
    if not args.no_settle:
        cases = [tuple(float(v) if i != 1 else int(v) for i, v in enumerate(c.split(":")))
                 for c in args.settle_cases]  # fmt: skip
        settle_rate(
            args.settle_rows, out, getattr(torch, args.settle_dtype), args.settle_device, cases
        )
    for head in [] if args.no_speed else args.heads:
        speed(head, args.rows, out)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
