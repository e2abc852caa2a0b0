/*
 * The shared streaming core of the FlashSpec kernels: a CTA owns a contiguous range of
 * vocabulary ids and a block of up to ROWS hidden rows (staged once in shared memory); each
 * warp walks the range U LM-head rows at a time, each lane a VEC-wide slice of H, and keeps
 * ROWS x U fp32 dot products in registers. The LM head is the only DRAM stream (read once per
 * row block); the hidden block is re-read from shared memory and reused across the U rows.
 * After a warp all-reduce every lane holds all ROWS x U logits; lane r runs the epilogue of row r.
 *
 * Half / bf16 with H a multiple of the k chunk (kGemmK = 64) and 16-byte aligned bases take the
 * tensor-core path instead (streamVocabGemm): ROWS = 16 or 32 rows are the N side of 16x16x16
 * WMMA products, each warp takes 16 LM-head rows (the M side) per tile, both staged in shared
 * memory by cp.async in k chunks, and the fp32 accumulator tile goes through shared memory to
 * the epilogue (ROWS = 32: lane r serves row r; ROWS = 16: lane l serves row l % 16 for half of
 * the 16 ids). fp32 keeps the FMA path (a TF32 product would not be the reference's fp32 logits).
 */
#pragma once

#include "flashspecKernels.h"

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <mma.h>
#include <cstdint>

namespace flashspec
{

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

constexpr int kMmaTile = 16;        // WMMA 16x16x16
#ifndef FLASHSPEC_GEMM_K
#define FLASHSPEC_GEMM_K 64
#endif
constexpr int kGemmK = FLASHSPEC_GEMM_K; // k chunk staged per step (a multiple of 16)
constexpr int kGemmIds = kWarps * kMmaTile; // ids per CTA tile: 16 per warp
constexpr int kGemmPad = 8;         // shared-memory row padding (elements) against bank conflicts
constexpr int kGemmLd = kGemmK + kGemmPad;

//! Dynamic shared memory of the tensor-core path: two stages of [ids | rows] x k chunks, then
//! one [16 ids x ROWS] fp32 tile per warp for the epilogue.
template <typename T, int ROWS>
__host__ __device__ constexpr size_t gemmSmemBytes()
{
    return 2 * static_cast<size_t>(kGemmIds + ROWS) * kGemmLd * sizeof(T)
        + static_cast<size_t>(kWarps) * kMmaTile * ROWS * sizeof(float);
}

//! 16-byte global -> shared copy, asynchronous; zero-fills when !valid (src is not read).
__device__ __forceinline__ void cpAsync16(void* dst, void const* src, bool valid)
{
    unsigned const d = static_cast<unsigned>(__cvta_generic_to_shared(dst));
    int const bytes = valid ? 16 : 0;
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(d), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cpAsyncCommit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

__device__ __forceinline__ void cpAsyncWaitPrevious()
{
    asm volatile("cp.async.wait_group 1;\n" ::);
}

//! The tensor-core path (T = half / bf16, H % 64 == 0, 16-byte aligned bases; ROWS = 16 or 32):
//! a GEMM tile of 128 ids x ROWS rows per step of the CTA's range, k in chunks of 64 staged in
//! shared memory by cp.async (coalesced 16-byte pieces, two stages: the next chunk loads while
//! this one multiplies). The hidden rows come from global memory (L2-resident) with each chunk,
//! so ROWS is not bounded by shared memory. After a tile's last chunk each warp's fp32
//! accumulators (16 ids x ROWS) go through shared memory to the epilogue: ROWS = 32: lane r
//! serves row r for the warp's 16 ids; ROWS = 16: lane l serves row l % 16 for half of them.
template <typename T, int ROWS, typename Epilogue>
__device__ __forceinline__ void streamVocabGemm(T const* hidden, T const* lmHead, int row0, int numRows, int begin,
    int end, int hiddenSize, int vocabSize, unsigned char* smem, Epilogue&& epilogue)
{
    using namespace nvcuda;
    constexpr int kTiles = ROWS / kMmaTile;
    constexpr int kPieces = kGemmK / 8; // 16-byte pieces per staged row
    T* stages = reinterpret_cast<T*>(smem);
    size_t const stageElems = static_cast<size_t>(kGemmIds + ROWS) * kGemmLd;
    float* warpTile = reinterpret_cast<float*>(stages + 2 * stageElems) + (threadIdx.x >> 5) * kMmaTile * ROWS;
    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    int const kChunks = hiddenSize / kGemmK;
    int const numTiles = (end - begin + kGemmIds - 1) / kGemmIds;
    int const total = numTiles * kChunks;
    if (total <= 0)
    {
        return;
    }
    auto load = [&](int chunk) {
        T* a = stages + (chunk & 1) * stageElems; // [kGemmIds][kGemmLd], then [ROWS][kGemmLd]
        T* b = a + kGemmIds * kGemmLd;
        int const tileBase = begin + (chunk / kChunks) * kGemmIds;
        int const k0 = (chunk % kChunks) * kGemmK;
        for (int i = threadIdx.x; i < (kGemmIds + ROWS) * kPieces; i += blockDim.x)
        {
            int const r = i / kPieces;
            int const c = (i - r * kPieces) * 8;
            if (r < kGemmIds)
            {
                int const v = tileBase + r;
                bool const valid = v < vocabSize;
                cpAsync16(a + r * kGemmLd + c, lmHead + static_cast<int64_t>(valid ? v : 0) * hiddenSize + k0 + c, valid);
            }
            else
            {
                int const row = row0 + r - kGemmIds;
                bool const valid = row < numRows;
                cpAsync16(b + (r - kGemmIds) * kGemmLd + c,
                    hidden + static_cast<int64_t>(valid ? row : 0) * hiddenSize + k0 + c, valid);
            }
        }
    };
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc[kTiles];
#pragma unroll
    for (int t = 0; t < kTiles; ++t)
    {
        wmma::fill_fragment(acc[t], 0.0f);
    }
    load(0);
    cpAsyncCommit();
    for (int chunk = 0; chunk < total; ++chunk)
    {
        if (chunk + 1 < total)
        {
            load(chunk + 1);
        }
        cpAsyncCommit();
        cpAsyncWaitPrevious(); // this chunk's group is complete
        __syncthreads();
        T const* a = stages + (chunk & 1) * stageElems + warp * kMmaTile * kGemmLd;
        T const* b = stages + (chunk & 1) * stageElems + kGemmIds * kGemmLd;
#pragma unroll
        for (int ks = 0; ks < kGemmK; ks += kMmaTile)
        {
            wmma::fragment<wmma::matrix_a, 16, 16, 16, T, wmma::row_major> w;
            wmma::load_matrix_sync(w, a + ks, kGemmLd);
#pragma unroll
            for (int t = 0; t < kTiles; ++t)
            {
                wmma::fragment<wmma::matrix_b, 16, 16, 16, T, wmma::col_major> h;
                wmma::load_matrix_sync(h, b + t * kMmaTile * kGemmLd + ks, kGemmLd);
                wmma::mma_sync(acc[t], w, h, acc[t]);
            }
        }
        __syncthreads(); // the stage is free for the load two chunks ahead
        if (chunk % kChunks == kChunks - 1)
        {
#pragma unroll
            for (int t = 0; t < kTiles; ++t)
            {
                wmma::store_matrix_sync(warpTile + t * kMmaTile, acc[t], ROWS, wmma::mem_row_major); // [id][row]
                wmma::fill_fragment(acc[t], 0.0f);
            }
            __syncwarp();
            int const idBase = begin + (chunk / kChunks) * kGemmIds + warp * kMmaTile;
            constexpr int kSplit = ROWS == 16 ? 2 : 1; // lanes per row
            constexpr int kIdsPerLane = kMmaTile / kSplit;
            int const row = lane % ROWS;
            int const first = (lane / ROWS) * kIdsPerLane;
#pragma unroll
            for (int j = 0; j < kIdsPerLane; ++j)
            {
                int const v = idBase + first + j;
                if (v < end)
                {
                    epilogue(v, warpTile[(first + j) * ROWS + row]);
                }
            }
            __syncwarp();
        }
    }
}

//! Ids of one block of VerifyResample's two-level sample (reference.verify_resample.SAMPLE_BLOCK):
//! a split is a whole number of them.
constexpr int kSampleBlock = 64;

//! Split [0, vocabSize) into numSplits contiguous ranges of whole kSampleBlock-id blocks (the last
//! ones may be empty); range of split s.
__device__ __forceinline__ void splitRange(int vocabSize, int numSplits, int split, int& begin, int& end)
{
    int const blocks = (vocabSize + kSampleBlock - 1) / kSampleBlock;
    int const per = (blocks + numSplits - 1) / numSplits * kSampleBlock;
    begin = min(split * per, vocabSize);
    end = min(begin + per, vocabSize);
}

} // namespace flashspec

namespace flashspec
{

//! Run the streaming loop of the path chosen at compile time (MMA: T half / bf16, ROWS 16 or 32,
//! hidden read from global memory; FMA: the ROWS hidden rows staged in smemHidden).
template <typename T, int ROWS, int VEC, bool MMA, typename Epilogue>
__device__ __forceinline__ void streamVocab(T const* hidden, T const* smemHidden, unsigned char* smem, T const* lmHead,
    int row0, int numRows, int begin, int end, int hiddenSize, int vocabSize, Epilogue&& epilogue)
{
    if constexpr (MMA)
    {
        streamVocabGemm<T, ROWS>(hidden, lmHead, row0, numRows, begin, end, hiddenSize, vocabSize, smem, epilogue);
    }
    else
    {
        streamVocabFma<T, ROWS, VEC>(smemHidden, lmHead, begin, end, hiddenSize, epilogue);
    }
}

//! The row of the block a lane's epilogue serves, or -1: FMA lane r -> r (r < ROWS); MMA lane l
//! -> l % ROWS (ROWS = 16: two lanes per row).
template <int ROWS, bool MMA>
__device__ __forceinline__ int laneBlockRow(int lane)
{
    if constexpr (MMA)
    {
        return lane % ROWS;
    }
    return lane < ROWS ? lane : -1;
}

//! Lane stride between the lanes that served one row (merged at the end).
template <int ROWS, bool MMA>
__host__ __device__ constexpr int laneStride()
{
    return MMA && ROWS == 16 ? 16 : 32;
}

} // namespace flashspec
