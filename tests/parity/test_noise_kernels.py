"""The kernels' noise functions — Triton's and the CUDA kernels' (behind the TensorRT plugins,
through the C ABI) — reproduce the reference noise and the frozen vectors: bits and uniforms
exactly, Gumbel variates to the fp32 ulp-level tolerance of tests/tolerances.py (one log / log1p
evaluated by another math library). On the GPU the two kernels' Gumbel variates are equal to the
bit (both call libdevice's logf / log1pf)."""

from __future__ import annotations

import json
import pathlib

import pytest
import torch

from flashspec_export.ops import cuda
from flashspec_export.reference import noise
from tests.tolerances import GUMBEL_ATOL, GUMBEL_RTOL

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _triton(seeds, positions, tokens, stream):
    pytest.importorskip("triton")
    from flashspec_export.kernels import noise as triton_noise

    return triton_noise.evaluate_noise(seeds, positions, tokens, stream)


def _cuda(seeds, positions, tokens, stream):
    if not cuda.available():
        pytest.skip(f"cuda noise: needs a CUDA device and {cuda.library_path()}")
    return cuda.evaluate_noise(seeds, positions, tokens, stream)


@pytest.fixture(params=["triton", pytest.param("cuda", marks=pytest.mark.cuda_kernels)])
def evaluate(request):
    return {"triton": _triton, "cuda": _cuda}[request.param]


VECTORS = json.loads(
    (pathlib.Path(__file__).parents[1] / "data" / "noise_vectors.json").read_text()
)["vectors"]


def _keys(count: int, seed: int):
    """Random keys plus the ends of every range: seeds whose high half is 0, 1 and maximal,
    positions 0 and P - 1, tokens 0 and P - 1 = 2**31 - 2 (the largest id the hash accepts)."""
    g = torch.Generator().manual_seed(seed)
    seeds = torch.randint(0, 2**63 - 1, (count,), generator=g)
    positions = torch.randint(0, noise.P, (count,), generator=g)
    tokens = torch.randint(0, noise.P, (count,), generator=g)
    edge_seeds = [0, 1, 2**31 - 1, 2**31, 2**32 - 1, 2**32, 2**62, noise.MAX_SEED, 2**63 - 2**31]
    edge_positions = [0, 1, noise.P - 2, noise.P - 1, 2**30, 2**31 - 3]
    edge_tokens = [0, 1, noise.P - 1, noise.P - 2, noise.P - 3, 2**30, 128255, 262143]
    seeds[: len(edge_seeds)] = torch.tensor(edge_seeds)
    positions[-len(edge_positions) :] = torch.tensor(edge_positions)
    tokens[len(edge_seeds) : len(edge_seeds) + len(edge_tokens)] = torch.tensor(edge_tokens)
    return seeds, positions, tokens


@pytest.mark.parametrize(
    "stream", [noise.STREAM_ACCEPT, noise.STREAM_GUMBEL, noise.STREAM_DRAFT], ids=str
)
def test_bits_uniform_and_gumbel_match_reference(evaluate, stream):
    """20,000 keys per stream (both branches of the exponential are hit thousands of times)."""
    seeds, positions, tokens = _keys(20_000, seed=stream)
    bits, uniform, gumbel = evaluate(
        seeds.to(DEVICE), positions.to(DEVICE), tokens.to(DEVICE), stream
    )
    expected = noise.bits(seeds, positions, tokens, stream)
    assert torch.equal(bits.cpu(), expected)
    assert torch.equal(uniform.cpu(), noise.uniform_from_bits(expected))
    torch.testing.assert_close(
        gumbel.cpu(), noise.gumbel_from_bits(expected), rtol=GUMBEL_RTOL, atol=GUMBEL_ATOL
    )
    large = expected + 1 >= 2**30  # the -log(complement) branch of the exponential
    assert 0.2 < float(large.float().mean()) < 0.8


def test_frozen_vectors(evaluate):
    """The frozen vectors of tests/data, stream by stream."""
    for stream in sorted({v["stream"] for v in VECTORS}):
        vectors = [v for v in VECTORS if v["stream"] == stream]
        keys = [torch.tensor([v[k] for v in vectors]) for k in ("seed", "position", "token")]
        bits, uniform, gumbel = evaluate(*(k.to(DEVICE) for k in keys), stream)
        assert bits.tolist() == [v["bits"] for v in vectors]
        assert uniform.tolist() == [v["uniform"] for v in vectors]
        torch.testing.assert_close(
            gumbel.cpu(),
            torch.tensor([v["gumbel"] for v in vectors]),
            rtol=GUMBEL_RTOL,
            atol=GUMBEL_ATOL,
        )


def _rnd(x: int) -> int:
    """The hash round in Python integers: rot16(x**5 % P)."""
    x5 = pow(x, 5, noise.P)
    return (x5 % 2**16) * 2**15 + x5 // 2**16


def _unrnd(y: int) -> int:
    """Inverse of the hash round: rotate back, then the fifth root mod P."""
    x5 = (y % 2**15) * 2**16 + y // 2**15
    return pow(x5, pow(5, -1, noise.P - 1), noise.P)


def test_multiplier_edge_a_equals_one(evaluate):
    """``a = 1 + y % (P - 1)`` wraps only for ``y = P - 1`` (probability 1/P, never hit at
    random). Invert the hash to find the position whose row key has ``y = P - 1``, so ``a = 1``,
    and check the Triton bits there (a kernel computing ``a = 1 + y`` would get ``a = P``)."""
    p, seed, stream = noise.P, 12345, noise.STREAM_GUMBEL
    h_seed = _rnd(_rnd((noise.K_INIT + seed) % p))  # seed < 2**31: the high half is 0
    h_final = (_unrnd(p - 1) - noise.K_A) % p  # rnd(h_final + K_A) = P - 1
    h_position = (_unrnd(h_final) - stream) % p  # h_final = rnd(h_position + stream)
    position = (_unrnd(h_position) - h_seed) % p  # h_position = rnd(h_seed + position)
    a, _ = noise.row_keys(torch.tensor(seed), torch.tensor(position), stream)
    assert int(a) == 1
    tokens = torch.tensor([0, 1, 2, 1000, p - 2])
    seeds, positions = torch.full_like(tokens, seed), torch.full_like(tokens, position)
    bits, _, _ = evaluate(seeds.to(DEVICE), positions.to(DEVICE), tokens.to(DEVICE), stream)
    assert torch.equal(bits.cpu(), noise.bits(seeds, positions, tokens, stream))


@pytest.mark.cuda_kernels
def test_cuda_and_triton_gumbel_are_bit_identical_on_the_gpu():
    """Both kernels evaluate the Gumbel variate with libdevice: equal to the bit, 20,000 keys."""
    seeds, positions, tokens = _keys(20_000, seed=7)
    keys = [t.to(DEVICE) for t in (seeds, positions, tokens)]
    if DEVICE != "cuda":
        pytest.skip("needs a CUDA device")
    ours = _cuda(*keys, noise.STREAM_GUMBEL)
    theirs = _triton(*keys, noise.STREAM_GUMBEL)
    for a, b in zip(ours, theirs, strict=True):
        assert torch.equal(a, b)


@pytest.mark.parametrize("vocab", [1000, 4096, 5000, 20000])
def test_exponential_race_equals_reference(vocab):
    """``kernels.noise.exponential_race`` (the noise in registers, each row in chunks of
    ``RACE_CHUNK`` ids) = the reference's ``argmax_v w_v / E_v`` on softmax rows, rows with zeros
    (a truncation's -inf), ties of weight, a row of zeros (all ids tie: the first) and rows with
    NaN (torch's argmax: the first NaN, also one past the first chunk); vocabularies below, at
    and past one block of 2048 ids, and past one chunk. Bit for bit on a GPU; on the CPU the
    interpreter's logs are within an ulp of the reference's, so its rows are drawn far from
    near-ties (the same seeds every run)."""
    pytest.importorskip("triton")
    from flashspec_export.kernels import noise as triton_noise
    from flashspec_export.reference.sampled_verify import exponential_race

    g = torch.Generator().manual_seed(vocab)
    n, width = 3, 4
    weights = torch.softmax(4 * torch.randn(n, width, vocab, generator=g), dim=-1)
    weights[0, 1, ::3] = 0.0
    weights[1, 0] = 0.0
    weights[1, 2, vocab // 2 :] = weights[1, 2, : vocab - vocab // 2].clone()
    weights[2, 3, 7] = float("nan")
    weights[2, 2, [vocab - 5, vocab - 3]] = float("nan")  # past the first chunk where V > 8192
    seed = torch.tensor([0, 2**62, noise.MAX_SEED])
    positions = torch.tensor([[0, 1, 2, 3], [noise.P - 4, noise.P - 3, noise.P - 2, noise.P - 1],
                              [5, 6, 7, 8]])  # fmt: skip
    want = exponential_race(weights, seed, positions, noise.STREAM_GUMBEL)
    got = triton_noise.exponential_race(
        weights.to(DEVICE), seed.to(DEVICE), positions.to(DEVICE), noise.STREAM_GUMBEL
    )
    assert torch.equal(got.cpu(), want), (got.cpu(), want)
    assert int(got[1, 0]) == 0 and int(got[2, 3]) == 7 and int(got[2, 2]) == vocab - 5
    assert vocab < triton_noise.RACE_CHUNK or bool((got >= triton_noise.RACE_CHUNK).any())
