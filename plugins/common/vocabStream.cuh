/*
 * The shared streaming core of the FlashSpec kernels: a CTA owns a contiguous range of
 * vocabulary ids and a block of up to ROWS hidden rows (staged once in shared memory); each
 * warp walks the range U LM-head rows at a time, each lane a VEC-wide slice of H, and keeps
 * ROWS x U fp32 dot products in registers. The LM head is the only DRAM stream (read once per
 * row block); the hidden block is re-read from shared memory and reused across the U rows.
 * After a warp all-reduce every lane holds all ROWS x U logits; lane r runs the epilogue of row r.
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cstdint>

namespace flashspec
{

enum class DataType : int32_t
{
    kFLOAT = 0,
    kHALF = 1,
    kBF16 = 2,
};

constexpr int kWarps = 8;
constexpr int kThreads = kWarps * 32;
constexpr int kUnroll = 2; // U: LM-head rows in flight per warp

template <typename T>
__device__ __forceinline__ float toFloat(T x);
template <>
__device__ __forceinline__ float toFloat<float>(float x)
{
    return x;
}
template <>
__device__ __forceinline__ float toFloat<__half>(__half x)
{
    return __half2float(x);
}
template <>
__device__ __forceinline__ float toFloat<__nv_bfloat16>(__nv_bfloat16 x)
{
    return __bfloat162float(x);
}

//! VEC elements of T loaded as one aligned vector (16 bytes when VEC * sizeof(T) == 16).
template <typename T, int VEC>
struct alignas(sizeof(T) * VEC) Vec
{
    T v[VEC];
};

template <typename T, int VEC>
__device__ __forceinline__ Vec<T, VEC> loadVec(T const* p)
{
    return *reinterpret_cast<Vec<T, VEC> const*>(p);
}

//! Stage rows [row0, row0 + rows) of hidden [numRows, H] into shared memory as T (zeros past numRows).
template <typename T, int ROWS>
__device__ __forceinline__ void stageHidden(T* smem, T const* hidden, int row0, int numRows, int hiddenSize)
{
    for (int i = threadIdx.x; i < ROWS * hiddenSize; i += blockDim.x)
    {
        int const r = i / hiddenSize;
        int const k = i - r * hiddenSize;
        int const row = row0 + r;
        smem[i] = row < numRows ? hidden[static_cast<int64_t>(row) * hiddenSize + k] : T(0.0f);
    }
    __syncthreads();
}

//! acc[u][r] = sum_k hidden[r][k] * lmHead[vocab[u]][k] for one warp (partial per lane, then all-reduced).
template <typename T, int ROWS, int VEC>
__device__ __forceinline__ void warpDots(float (&acc)[kUnroll][ROWS], T const* smemHidden, T const* lmHead,
    int64_t const (&vocab)[kUnroll], bool const (&valid)[kUnroll], int hiddenSize)
{
    int const lane = threadIdx.x & 31;
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
    {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
        {
            acc[u][r] = 0.0f;
        }
    }
    for (int k = lane * VEC; k < hiddenSize; k += 32 * VEC)
    {
        Vec<T, VEC> w[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
        {
            if (valid[u])
            {
                w[u] = loadVec<T, VEC>(lmHead + vocab[u] * hiddenSize + k);
            }
            else
            {
#pragma unroll
                for (int e = 0; e < VEC; ++e)
                {
                    w[u].v[e] = T(0.0f);
                }
            }
        }
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
        {
            Vec<T, VEC> const h = loadVec<T, VEC>(smemHidden + r * hiddenSize + k);
#pragma unroll
            for (int e = 0; e < VEC; ++e)
            {
                float const hv = toFloat(h.v[e]);
#pragma unroll
                for (int u = 0; u < kUnroll; ++u)
                {
                    acc[u][r] = fmaf(hv, toFloat(w[u].v[e]), acc[u][r]);
                }
            }
        }
    }
#pragma unroll
    for (int u = 0; u < kUnroll; ++u)
    {
#pragma unroll
        for (int r = 0; r < ROWS; ++r)
        {
#pragma unroll
            for (int offset = 16; offset > 0; offset >>= 1)
            {
                acc[u][r] += __shfl_xor_sync(0xFFFFFFFFu, acc[u][r], offset);
            }
        }
    }
}

//! The value of acc[u][r] for r == lane (all lanes hold every sum after warpDots).
template <int ROWS>
__device__ __forceinline__ float laneRow(float const (&accU)[ROWS], int lane)
{
    float x = 0.0f;
#pragma unroll
    for (int r = 0; r < ROWS; ++r)
    {
        x = lane == r ? accU[r] : x;
    }
    return x;
}

//! Split [0, vocabSize) into numSplits contiguous ranges; range of split s.
__device__ __forceinline__ void splitRange(int vocabSize, int numSplits, int split, int& begin, int& end)
{
    int const per = (vocabSize + numSplits - 1) / numSplits;
    begin = min(split * per, vocabSize);
    end = min(begin + per, vocabSize);
}

} // namespace flashspec
