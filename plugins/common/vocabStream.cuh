/*
 * The shared streaming core of the FlashSpec kernels: a CTA owns a contiguous range of
 * vocabulary ids and a block of up to ROWS hidden rows (staged once in shared memory); each
 * warp walks the range U LM-head rows at a time, each lane a VEC-wide slice of H, and keeps
 * ROWS x U fp32 dot products in registers. The LM head is the only DRAM stream (read once per
 * row block); the hidden block is re-read from shared memory and reused across the U rows.
 * After a warp all-reduce every lane holds all ROWS x U logits; lane r runs the epilogue of row r.
 *
 * Half / bf16 with H a multiple of 16 take the tensor-core path instead (streamVocabMma): ROWS =
 * 16 rows are the N side of a 16x16x16 WMMA product, each warp takes 16 LM-head rows (the M
 * side, loaded straight from global memory) per step, and the fp32 accumulator tile goes
 * through shared memory to the epilogue, lane l handling row l % 16 for half of the 16 ids.
 * fp32 keeps the FMA path (a TF32 product would not be the reference's fp32 logits).
 */
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
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

//! The FMA path: epilogue(v, logit) runs on lane r < ROWS for row r, for every id v of the range
//! in ascending order per lane.
template <typename T, int ROWS, int VEC, typename Epilogue>
__device__ __forceinline__ void streamVocabFma(
    T const* smemHidden, T const* lmHead, int begin, int end, int hiddenSize, Epilogue&& epilogue)
{
    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    for (int v0 = begin + warp * kUnroll; v0 < end; v0 += kWarps * kUnroll)
    {
        int64_t vocab[kUnroll];
        bool valid[kUnroll];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
        {
            vocab[u] = v0 + u;
            valid[u] = v0 + u < end;
        }
        float acc[kUnroll][ROWS];
        warpDots<T, ROWS, VEC>(acc, smemHidden, lmHead, vocab, valid, hiddenSize);
        if (lane < ROWS)
        {
#pragma unroll
            for (int u = 0; u < kUnroll; ++u)
            {
                if (valid[u])
                {
                    epilogue(v0 + u, laneRow<ROWS>(acc[u], lane));
                }
            }
        }
    }
}

constexpr int kMmaTile = 16;

//! The tensor-core path (T = half or bf16, H % 16 == 0, 32-byte aligned bases): epilogue(v,
//! logit) runs on lane l for row l % 16 and the ids of its half of each 16-id step, ascending.
//! warpTile: this warp's [16 ids][16 rows] fp32 staging buffer in shared memory.
template <typename T, typename Epilogue>
__device__ __forceinline__ void streamVocabMma(T const* smemHidden, T const* lmHead, int begin, int end,
    int hiddenSize, int vocabSize, float* warpTile, Epilogue&& epilogue)
{
    using namespace nvcuda;
    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const half = lane >> 4;
    int const row = lane & 15;
    for (int v0 = begin + warp * kMmaTile; v0 < end; v0 += kWarps * kMmaTile)
    {
        // Ids past the range are computed and dropped; a tile that would run past the logical
        // vocabulary (vocabSize >= 16 on this path) is moved back to end there.
        int const base = min(v0, vocabSize - kMmaTile);
        wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
        wmma::fill_fragment(acc, 0.0f);
        T const* a = lmHead + static_cast<int64_t>(base) * hiddenSize;
#pragma unroll 4
        for (int k = 0; k < hiddenSize; k += kMmaTile)
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> w;
            wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> h;
            wmma::load_matrix_sync(w, a + k, hiddenSize);
            wmma::load_matrix_sync(h, smemHidden + k, hiddenSize);
            wmma::mma_sync(acc, w, h, acc);
        }
        wmma::store_matrix_sync(warpTile, acc, kMmaTile, wmma::mem_row_major); // [id][row]
        __syncwarp();
#pragma unroll
        for (int j = 0; j < kMmaTile / 2; ++j)
        {
            int const v = base + half * (kMmaTile / 2) + j;
            if (v >= v0 && v < end)
            {
                epilogue(v, warpTile[(v - base) * kMmaTile + row]);
            }
        }
        __syncwarp();
    }
}

//! Split [0, vocabSize) into numSplits contiguous ranges; range of split s.
__device__ __forceinline__ void splitRange(int vocabSize, int numSplits, int split, int& begin, int& end)
{
    int const per = (vocabSize + numSplits - 1) / numSplits;
    begin = min(split * per, vocabSize);
    end = min(begin + per, vocabSize);
}

} // namespace flashspec

namespace flashspec
{

//! Run the streaming loop of the path chosen at compile time (MMA: T half / bf16, ROWS == 16).
template <typename T, int ROWS, int VEC, bool MMA, typename Epilogue>
__device__ __forceinline__ void streamVocab(
    T const* smemHidden, T const* lmHead, int begin, int end, int hiddenSize, int vocabSize, Epilogue&& epilogue)
{
    if constexpr (MMA)
    {
        __shared__ __align__(32) float mmaTiles[kWarps][kMmaTile * kMmaTile];
        streamVocabMma<T>(smemHidden, lmHead, begin, end, hiddenSize, vocabSize, mmaTiles[threadIdx.x >> 5], epilogue);
    }
    else
    {
        streamVocabFma<T, ROWS, VEC>(smemHidden, lmHead, begin, end, hiddenSize, epilogue);
    }
}

//! The row of the block a lane's epilogue serves, or -1: FMA lane r -> r (r < ROWS); MMA lane l -> l % 16.
template <int ROWS, bool MMA>
__device__ __forceinline__ int laneBlockRow(int lane)
{
    if constexpr (MMA)
    {
        return lane & 15;
    }
    return lane < ROWS ? lane : -1;
}

} // namespace flashspec
