/*
 * VerifyResample's truncation (top-k, top-p; specification: flashspec_export/reference/truncation.py)
 * in the native kernels: the pieces verifyResampleKernel.cu puts together.
 *
 * What is kept is a prefix of one order, descending logit then ascending id, so each (logit, id)
 * is one int64 order key (orderKey: the float's bits mapped monotonically, the id reversed) and
 * the kept set is every key at or above the last kept one.
 *
 * Stage 1 (the tile kernel): each lane keeps its kLaneKeys largest keys and the largest it let go
 * (its floor); at the end the CTA hands in the kCandidates largest keys of each (row, split) and a
 * floor, the largest key of the split it did not hand in. Above the row's largest floor (tau) the
 * handed-in keys are therefore every key of the row: an exact prefix of its order.
 *
 * Stage 2 (settleKernel, one CTA per row): the known prefix sorted (at most kKnownCap keys), then
 * top-k's k-th key and top-p's cut inside it when they lie there (top-p's normaliser: stage 1's
 * online softmax of every allowed token, or the top-k prefix's own sum), the Gumbel-max over the
 * kept keys only, and the row's summaries rewritten as one split for the finalizer. A row whose
 * kept set reaches past the known prefix is flagged.
 *
 * The exact recompute (flagged rows only): the tile pass again, writing the flagged rows' masked
 * logits to the workspace ([rows, V] fp32, sized only when top-k / top-p are inputs), then one
 * CTA per row: top-k's k-th key by a radix select on the key (a 4096-bin count per 12 bits, from
 * the top, over the row), top-p's cut in the kExactHeld largest kept keys sorted in shared memory
 * (a scan of their probabilities, as stage 2's), or, for a nucleus of more keys, by bisection on
 * the key over the row; then the Gumbel-max over the kept tokens. Each step reads the row with
 * 16-byte loads, several in flight per thread. One CTA a row: 170-870 us a row on an H200
 * (docs/BENCHMARKS.md).
 */
#pragma once

#include "../common/flashspecNoise.cuh"

#include <cstdint>
#include <cstring>
#include <cuda_runtime.h>

namespace flashspec
{
namespace trunc
{

constexpr int kLaneKeys = 8;        // keys each lane keeps while it streams
constexpr int kCandidates = 32;     // keys each (row, split) hands in
constexpr int kKnownCap = 1024;     // stage 2 sorts at most this many known keys
constexpr int kSelectThreads = 512; // stage 2 and the exact recompute: threads per row
constexpr int kExactHeld = 4096;    // the exact recompute sorts at most this many kept keys
constexpr int kRadixBits = 12;      // the exact recompute's radix select: bits a round
constexpr int kRadixBins = 1 << kRadixBits;
static_assert(kRadixBins == 8 * kSelectThreads, "pickBin: each thread sums 8 bins");
constexpr int64_t kEmptyKey = INT64_MIN; // no key (below every key of a logit)

//! The order key of (logit, id): larger for a larger logit, and for an equal logit a lower id
//! (-0 is +0, as the reference's comparisons take them). Never kEmptyKey.
__host__ __device__ __forceinline__ int64_t orderKey(float logit, int32_t id)
{
    float const x = logit == 0.0f ? 0.0f : logit;
    int32_t bits;
    memcpy(&bits, &x, sizeof(bits));
    int32_t const ordered = bits >= 0 ? bits : bits ^ 0x7FFFFFFF;
    uint64_t const low = 0xFFFFFFFFull - static_cast<uint32_t>(id);
    return static_cast<int64_t>((static_cast<uint64_t>(static_cast<uint32_t>(ordered)) << 32) | low);
}

__host__ __device__ __forceinline__ float keyLogit(int64_t key)
{
    auto const ordered = static_cast<int32_t>(static_cast<uint64_t>(key) >> 32);
    int32_t const bits = ordered >= 0 ? ordered : ordered ^ 0x7FFFFFFF;
    float x;
    memcpy(&x, &bits, sizeof(x));
    return x;
}

__host__ __device__ __forceinline__ int32_t keyId(int64_t key)
{
    return static_cast<int32_t>(0xFFFFFFFFull - (static_cast<uint64_t>(key) & 0xFFFFFFFFull));
}

//! A lane's kLaneKeys largest keys (descending) and the largest key it let go.
struct LaneKeys
{
    int64_t key[kLaneKeys];
    int64_t floor;

    __device__ __forceinline__ void init()
    {
#pragma unroll
        for (int j = 0; j < kLaneKeys; ++j)
        {
            key[j] = kEmptyKey;
        }
        floor = kEmptyKey;
    }

    __device__ __forceinline__ void add(int64_t x)
    {
        if (x <= key[kLaneKeys - 1])
        {
            floor = x > floor ? x : floor;
            return;
        }
#pragma unroll
        for (int j = 0; j < kLaneKeys; ++j) // one pass of insertion: x ends as the dropped key
        {
            int64_t const hi = key[j] > x ? key[j] : x;
            x = key[j] > x ? x : key[j];
            key[j] = hi;
        }
        floor = x > floor ? x : floor;
    }
};

//! Where truncation keeps its state in the workspace (after the verify summaries).
struct Workspace
{
    int64_t* candidates; // [numRows, numSplits, kCandidates], descending, kEmptyKey padded
    int64_t* floors;     // [numRows, numSplits]
    int32_t* unsettled;  // [numRows]: 1 where the candidates did not settle the kept set
    int32_t* truncated;  // [numRows >= batch]: 1 where top-k / top-p apply (the compiled kernels' flags)
    float* logits;       // [numRows, vocabSize]: the exact recompute's masked logits
};
// The compiled Triton kernels (tritonAot.h HandInBuffers) use its truncated and unsettled flags;
// their hand-in has a region of its own, after this one.

//! The exact recompute's shared memory (dynamic: 64 KB of held keys and their scan, 16 KB of
//! radix counts).
struct ExactShared
{
    int64_t keys[kExactHeld];
    float scanA[kExactHeld];
    float scanB[kExactHeld];
    uint32_t hist[kRadixBins];
    int64_t scratch64[32];
    float scratchF[32];
    int32_t scratchI[32];
    int32_t pick[2];
};

inline size_t alignUp(size_t bytes)
{
    return (bytes + 255) & ~size_t{255};
}

//! Bytes of Workspace for numRows rows of numSplits splits (top-k or top-p an input; a mask alone
//! needs none).
inline size_t workspaceBytes(int32_t numRows, int32_t numSplits, int32_t vocabSize)
{
    size_t const rows = static_cast<size_t>(numRows);
    size_t const slots = rows * static_cast<size_t>(numSplits);
    return alignUp(slots * kCandidates * sizeof(int64_t)) + alignUp(slots * sizeof(int64_t))
        + 2 * alignUp(rows * sizeof(int32_t)) + alignUp(rows * static_cast<size_t>(vocabSize) * sizeof(float));
}

inline Workspace workspaceAt(void* base, int32_t numRows, int32_t numSplits)
{
    size_t const rows = static_cast<size_t>(numRows);
    size_t const slots = rows * static_cast<size_t>(numSplits);
    auto* p = static_cast<unsigned char*>(base);
    Workspace w{};
    w.candidates = reinterpret_cast<int64_t*>(p);
    p += alignUp(slots * kCandidates * sizeof(int64_t));
    w.floors = reinterpret_cast<int64_t*>(p);
    p += alignUp(slots * sizeof(int64_t));
    w.unsettled = reinterpret_cast<int32_t*>(p);
    p += alignUp(rows * sizeof(int32_t));
    w.truncated = reinterpret_cast<int32_t*>(p);
    p += alignUp(rows * sizeof(int32_t));
    w.logits = reinterpret_cast<float*>(p);
    return w;
}

// ---- block-wide collectives (every thread of the CTA calls them with the same arguments)

template <typename V, typename Op>
__device__ __forceinline__ V blockReduce(V x, Op op, V* scratch /* [32] shared */)
{
    int const lane = threadIdx.x & 31;
    int const warp = threadIdx.x >> 5;
    int const warps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
    {
        x = op(x, __shfl_xor_sync(0xFFFFFFFFu, x, offset));
    }
    __syncthreads(); // scratch may still be read by the previous call
    if (lane == 0)
    {
        scratch[warp] = x;
    }
    __syncthreads();
    V total = scratch[0];
    for (int w = 1; w < warps; ++w)
    {
        total = op(total, scratch[w]);
    }
    return total;
}

struct Max
{
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const
    {
        return a > b ? a : b;
    }
};

struct Min
{
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const
    {
        return a < b ? a : b;
    }
};

struct Sum
{
    template <typename V>
    __device__ __forceinline__ V operator()(V a, V b) const
    {
        return a + b;
    }
};

//! The best (score, id) of a CTA: the higher score, on equal scores the lower id (id < 0: none).
struct Best
{
    float score;
    int32_t id;
};

__device__ __forceinline__ bool beats(float score, int32_t id, Best const& b)
{
    return id >= 0 && (b.id < 0 || score > b.score || (score == b.score && id < b.id));
}

__device__ __forceinline__ Best blockBest(Best x, float* scoreScratch, int32_t* idScratch)
{
    int const lane = threadIdx.x & 31;
    int const warp = threadIdx.x >> 5;
    int const warps = (blockDim.x + 31) >> 5;
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1)
    {
        float const s = __shfl_xor_sync(0xFFFFFFFFu, x.score, offset);
        int32_t const i = __shfl_xor_sync(0xFFFFFFFFu, x.id, offset);
        if (beats(s, i, x))
        {
            x = {s, i};
        }
    }
    __syncthreads();
    if (lane == 0)
    {
        scoreScratch[warp] = x.score;
        idScratch[warp] = x.id;
    }
    __syncthreads();
    Best total{scoreScratch[0], idScratch[0]};
    for (int w = 1; w < warps; ++w)
    {
        if (beats(scoreScratch[w], idScratch[w], total))
        {
            total = {scoreScratch[w], idScratch[w]};
        }
    }
    return total;
}

//! The largest t in [lo, hi] with count(t) >= k, for count(t) = #{keys >= t} (non-increasing in
//! t) and count(lo) >= k: the k-th largest key when lo is at or below it. count is block-wide.
template <typename Count>
__device__ int64_t largestWithCountAtLeast(int64_t lo, int64_t hi, int64_t k, Count&& count)
{
    while (lo < hi)
    {
        uint64_t const d = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
        auto const mid = static_cast<int64_t>(static_cast<uint64_t>(lo) + d / 2 + (d & 1));
        if (count(mid) >= k)
        {
            lo = mid;
        }
        else
        {
            hi = mid - 1;
        }
    }
    return lo;
}

//! The smallest t in (lo, hi] with below(t) true, for below monotone (false at lo, true at hi).
template <typename Pred>
__device__ int64_t smallestTrue(int64_t lo, int64_t hi, Pred&& below)
{
    while (static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo) > 1)
    {
        uint64_t const d = static_cast<uint64_t>(hi) - static_cast<uint64_t>(lo);
        auto const mid = static_cast<int64_t>(static_cast<uint64_t>(lo) + d / 2);
        if (below(mid))
        {
            hi = mid;
        }
        else
        {
            lo = mid;
        }
    }
    return hi;
}

//! Calls f(v, logit) for each finite logit of a row of vocabSize fp32 logits, each thread on its
//! share: 16-byte loads where the row is aligned, four in flight per thread.
template <typename F>
__device__ __forceinline__ void forEachFinite(float const* logits, int vocabSize, F&& f)
{
    int head = 0; // the logits before it are read as float4
    if ((reinterpret_cast<uintptr_t>(logits) & 15) == 0)
    {
        int const quads = vocabSize >> 2;
        auto const* q = reinterpret_cast<float4 const*>(logits);
#pragma unroll 4
        for (int j = threadIdx.x; j < quads; j += blockDim.x)
        {
            float4 const x = q[j];
            int const v = 4 * j;
            if (x.x != -INFINITY)
            {
                f(v, x.x);
            }
            if (x.y != -INFINITY)
            {
                f(v + 1, x.y);
            }
            if (x.z != -INFINITY)
            {
                f(v + 2, x.z);
            }
            if (x.w != -INFINITY)
            {
                f(v + 3, x.w);
            }
        }
        head = 4 * quads;
    }
#pragma unroll 4
    for (int v = head + threadIdx.x; v < vocabSize; v += blockDim.x)
    {
        float const l = logits[v];
        if (l != -INFINITY)
        {
            f(v, l);
        }
    }
}

//! The bin of a histogram hist[0, bins) (bins = kRadixBins or fewer, a multiple of 8) counted from
//! the top that holds the rest-th largest key (1 <= rest <= its total), and rest within that bin:
//! pick = {bin, rest in it}. Each thread sums 8 bins, then a block-wide scan from the top.
__device__ __forceinline__ void pickBin(uint32_t const* hist, int bins, int64_t rest, int32_t* warpTotals /* [32] */,
    int32_t* pick /* [2] */)
{
    int const lane = threadIdx.x & 31;
    int const warp = threadIdx.x >> 5;
    int const top = bins - 1 - 8 * static_cast<int>(threadIdx.x); // this thread's bins: top down to top - 7
    int32_t own = 0;
    if (top >= 0)
    {
#pragma unroll
        for (int b = 0; b < 8; ++b)
        {
            own += static_cast<int32_t>(hist[top - b]);
        }
    }
    int32_t incl = own;
#pragma unroll
    for (int offset = 1; offset < 32; offset <<= 1)
    {
        int32_t const x = __shfl_up_sync(0xFFFFFFFFu, incl, offset);
        incl += lane >= offset ? x : 0;
    }
    if (lane == 31)
    {
        warpTotals[warp] = incl;
    }
    __syncthreads();
    for (int w = 0; w < warp; ++w)
    {
        incl += warpTotals[w];
    }
    int64_t acc = incl - own; // the keys in the bins above this thread's
    if (top >= 0 && acc < rest && incl >= rest)
    {
        for (int b = 0; b < 8; ++b)
        {
            if (acc + hist[top - b] >= rest)
            {
                pick[0] = top - b;
                pick[1] = static_cast<int32_t>(rest - acc);
                break;
            }
            acc += hist[top - b];
        }
    }
    __syncthreads();
}

//! The k-th largest order key of a row's finite logits (1 <= k <= their count): a radix select on
//! the key from its top, 12 bits a round (hist: [kRadixBins] shared), each round one count over
//! the row, until one key is left to take by a max (two or three rounds where no logits tie).
//! Exact, and deterministic (integer counts).
__device__ int64_t kthLargestKey(float const* logits, int vocabSize, int64_t k, ExactShared& sh)
{
    uint64_t prefix = 0; // the bits decided so far, of the key as unsigned (sign bit flipped)
    uint64_t decided = 0;
    int64_t rest = k;    // the rank still sought among the keys with the prefix
    for (int shift = 64 - kRadixBits;; shift -= kRadixBits)
    {
        int const bits = shift >= 0 ? kRadixBits : kRadixBits + shift; // the last round: 64 % 12 bits
        shift = shift >= 0 ? shift : 0;
        int const bins = 1 << bits;
        for (int b = threadIdx.x; b < bins; b += blockDim.x)
        {
            sh.hist[b] = 0;
        }
        __syncthreads();
        forEachFinite(logits, vocabSize, [&](int v, float l) {
            uint64_t const u = static_cast<uint64_t>(orderKey(l, v)) ^ (1ull << 63);
            if ((u & decided) == prefix)
            {
                atomicAdd(&sh.hist[(u >> shift) & (bins - 1)], 1u);
            }
        });
        __syncthreads();
        pickBin(sh.hist, bins, rest, sh.scratchI, sh.pick);
        int const bin = sh.pick[0];
        rest = sh.pick[1];
        uint32_t const inBin = sh.hist[bin];
        prefix |= static_cast<uint64_t>(bin) << shift;
        decided |= static_cast<uint64_t>(bins - 1) << shift;
        __syncthreads(); // hist and pick read by every thread before the next round
        if (inBin == 1 || shift == 0)
        {
            break;
        }
    }
    // one key has the prefix (or every bit is decided): it is the k-th largest
    int64_t found = kEmptyKey;
    forEachFinite(logits, vocabSize, [&](int v, float l) {
        int64_t const key = orderKey(l, v);
        if (((static_cast<uint64_t>(key) ^ (1ull << 63)) & decided) == prefix)
        {
            found = key > found ? key : found;
        }
    });
    return blockReduce(found, Max{}, sh.scratch64);
}

//! Sort keys[0, size) descending in shared memory (size a power of two; bitonic).
__device__ __forceinline__ void sortDescending(int64_t* keys, int size)
{
    for (int block = 2; block <= size; block <<= 1)
    {
        for (int stride = block >> 1; stride > 0; stride >>= 1)
        {
            for (int t = threadIdx.x; t < size / 2; t += blockDim.x)
            {
                int const lo = 2 * t - (t & (stride - 1));
                int const hi = lo + stride;
                bool const descending = (lo & block) == 0;
                int64_t const a = keys[lo];
                int64_t const b = keys[hi];
                if ((a < b) == descending && a != b)
                {
                    keys[lo] = b;
                    keys[hi] = a;
                }
            }
            __syncthreads();
        }
    }
}

//! Inclusive prefix sums of x[0, count) in shared memory (Hillis-Steele; tmp: as large as x).
//! Returns the buffer that holds them.
__device__ __forceinline__ float* inclusiveScan(float* x, float* tmp, int count)
{
    for (int offset = 1; offset < count; offset <<= 1)
    {
        for (int j = threadIdx.x; j < count; j += blockDim.x)
        {
            tmp[j] = j >= offset ? x[j] + x[j - offset] : x[j];
        }
        __syncthreads();
        float* const swap = x;
        x = tmp;
        tmp = swap;
    }
    return x;
}

//! The nucleus's end in keys sorted descending: the first index j < count whose mass before it
//! (the inclusive prefix sum of prob(0..j), less prob(j)) reaches p, or count if none. prob(j) is
//! the j-th key's probability (evaluated twice, the same value each time); probs and tmp are
//! shared buffers of count floats for the scan.
template <typename Prob>
__device__ int firstMassReaching(float p, int count, Prob&& prob, float* probs, float* tmp, int32_t* scratchI /* [32] */)
{
    for (int j = threadIdx.x; j < count; j += blockDim.x)
    {
        probs[j] = prob(j);
    }
    __syncthreads();
    float const* inclusive = inclusiveScan(probs, tmp, count);
    int first = count;
    for (int j = threadIdx.x; j < count; j += blockDim.x)
    {
        float const before = inclusive[j] - prob(j);
        first = before >= p && j < first ? j : first;
    }
    return blockReduce(first, Min{}, scratchI);
}

} // namespace trunc
} // namespace flashspec
