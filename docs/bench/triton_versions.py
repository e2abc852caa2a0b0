"""Tokens of the Triton kernels under the installed Triton, for comparing two Triton releases
on one GPU (issue 29: 3.6 and 3.9).

    python docs/bench/triton_versions.py OUT.pt            # writes the tokens
    python docs/bench/triton_versions.py A.pt B.pt         # compares two files

Each point (Llama-3 8B head shape, bf16, rows 1 .. 512 = N·(γ+1) with γ = 3, T = 1 and 0)
runs ``verify_resample`` (with log-probabilities) and ``tiled_argmax`` on the ``triton``
backend with fixed seeded inputs; the reference's tokens are stored beside them.
"""

from __future__ import annotations

import sys

import torch
import triton

from flashspec_export import ops

VOCAB, HIDDEN, GAMMA = 128256, 4096, 3


def tokens_of_this_triton() -> dict:
    out = {"triton": triton.__version__}
    gen = torch.Generator(device="cuda").manual_seed(0)
    lm_head = (torch.randn(VOCAB, HIDDEN, device="cuda", generator=gen) * 0.02).bfloat16()
    for rows in (4, 16, 64, 128, 256, 512):
        n = rows // (GAMMA + 1)
        hidden = torch.randn(n, GAMMA + 1, HIDDEN, device="cuda", generator=gen).bfloat16()
        drafts = torch.randint(0, VOCAB, (n, GAMMA), device="cuda", generator=gen)
        positions = torch.arange(n, device="cuda") * 7
        for temperature in (1.0, 0.0):
            for backend in ("triton", "reference"):
                tokens, _, logprobs = ops.verify_resample(
                    hidden,
                    lm_head,
                    drafts,
                    temperature,
                    seed=11,
                    positions=positions,
                    return_logprobs=True,
                    backend=backend,
                )
                out[("verify", rows, temperature, backend)] = (tokens.cpu(), logprobs.cpu())
        for backend in ("triton", "reference"):
            token, max_logit = ops.tiled_argmax(
                hidden.reshape(rows, HIDDEN), lm_head, backend=backend
            )
            out[("argmax", rows, backend)] = (token.cpu(), max_logit.cpu())
    return out


def compare(a: dict, b: dict) -> None:
    print(f"triton {a['triton']} against {b['triton']}")
    keys = [k for k in a if k != "triton" and k[-1] == "triton"]
    for key in keys:
        (ta, va), (tb, vb) = a[key], b[key]
        ref = a[(*key[:-1], "reference")][0]
        print(
            f"{key[:-1]}: tokens equal {torch.equal(ta, tb)}, values equal {torch.equal(va, vb)}, "
            f"equal to the reference: {torch.equal(ta, ref)} / {torch.equal(tb, ref)}"
        )


if __name__ == "__main__":
    if len(sys.argv) == 2:
        torch.save(tokens_of_this_triton(), sys.argv[1])
    else:
        compare(torch.load(sys.argv[1]), torch.load(sys.argv[2]))
