/*
 * FlashSpec counter-based noise (specification: flashspec_export/reference/noise.py).
 *
 * State lives in [0, P), P = 2^31 - 1. The integer part is bit-exact with the reference: a
 * product of two values below 2^31 is reduced mod P with the Mersenne shift-and-add trick,
 * which yields the same integer as `%`. The float part uses CUDA's log1pf / logf, which may
 * differ from the reference in the last ulp (tokens agree except at near-ties).
 */
#pragma once

#include <cstdint>

namespace flashspec
{

constexpr uint64_t kP = 2147483647ULL; // 2^31 - 1
constexpr uint64_t kInit = 1234567891ULL;
constexpr uint64_t kA = 362436069ULL;
constexpr uint64_t kB = 521288629ULL;
constexpr uint64_t kMix = 88675123ULL;
constexpr uint64_t kStreamGumbel = 1;
constexpr uint64_t kStreamPick = 3; // the uniform that picks an id inside a sampled block

//! z mod P for z < 2^62.
__host__ __device__ __forceinline__ uint64_t modP(uint64_t z)
{
    uint64_t r = (z & kP) + (z >> 31); // < 2^32
    r = (r & kP) + (r >> 31);          // <= P
    return r >= kP ? r - kP : r;
}

__host__ __device__ __forceinline__ uint64_t mulmodP(uint64_t a, uint64_t b)
{
    return modP(a * b);
}

//! rot16(x^5 mod P): a nonlinear bijection of [0, P).
__host__ __device__ __forceinline__ uint64_t rnd(uint64_t x)
{
    uint64_t const x2 = mulmodP(x, x);
    uint64_t const x4 = mulmodP(x2, x2);
    uint64_t const x5 = mulmodP(x4, x);
    return (x5 & 0xFFFFULL) * 32768ULL + (x5 >> 16);
}

struct RowKeys
{
    uint64_t a; // multiplier in [1, P - 1]
    uint64_t b; // offset in [0, P)
};

//! Row keys of (seed in [0, 2^63), position in [0, P), stream).
__host__ __device__ __forceinline__ RowKeys rowKeys(int64_t seed, int64_t position, uint64_t stream)
{
    uint64_t const s = static_cast<uint64_t>(seed);
    uint64_t const s0 = s & 0x7FFFFFFFULL;
    uint64_t const s1 = modP(s >> 31);
    uint64_t h = rnd(modP(kInit + s0));
    h = rnd(modP(h + s1));
    h = rnd(modP(h + static_cast<uint64_t>(position)));
    h = rnd(modP(h + stream));
    RowKeys keys;
    keys.a = 1 + rnd(modP(h + kA)) % (kP - 1);
    keys.b = rnd(modP(h + kB));
    return keys;
}

//! The hash integer in [0, P) of token id t under the row keys.
__host__ __device__ __forceinline__ uint64_t tokenBits(RowKeys keys, uint64_t token)
{
    uint64_t x = modP(keys.a * token + keys.b); // a, t < 2^31, b < 2^31: below 2^62 + 2^31
    x = rnd(x);
    return rnd(modP(x + kMix));
}

//! Exact fp32 uniform (2 (x / 256) + 1) 2^-24 in (0, 1).
__device__ __forceinline__ float uniformFromBits(uint64_t x)
{
    return static_cast<float>(2 * (x >> 8) + 1) * 0x1p-24f;
}

//! fp32 Gumbel -log(E), E = -log(1 - W), W = (x + 1) 2^-31, accurate in the upper tail.
__device__ __forceinline__ float gumbelFromBits(uint64_t x)
{
    uint64_t const k = x + 1;
    float exponential;
    if (k < (1ULL << 30))
    {
        exponential = -log1pf(-(__ll2float_rn(static_cast<long long>(k)) * 0x1p-31f));
    }
    else
    {
        exponential = -logf(__ll2float_rn(static_cast<long long>(kP - x)) * 0x1p-31f);
    }
    return -logf(exponential);
}

} // namespace flashspec
