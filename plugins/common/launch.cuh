/*
 * Launch geometry shared by the kernels: rows per CTA (ROWS, staged in shared memory), the
 * vocabulary split count, and the dispatch over (dtype, ROWS) template instances.
 */
#pragma once

#include "flashspecKernels.h"
#include "vocabStream.cuh"

#include <algorithm>
#include <type_traits>

namespace flashspec
{

//! The staged hidden block's cap, where the device allows more (Hopper: the measured row choice).
constexpr size_t kHiddenSmemCap = 160 * 1024;
//! The tile kernels' static shared memory beside the staged block: warp summaries (at most 5 KB)
//! and VerifyResample's chunk of sampled logits and block samples (at most 17 KB).
constexpr size_t kStaticSmemReserve = 26 * 1024;

//! Dynamic shared memory the staged hidden block may take where a CTA may opt in to optinBytes
//! (cudaDevAttrMaxSharedMemoryPerBlockOptin): 160 KB on Hopper (227 KB), 137 KB on A100 (163 KB),
//! 73 KB on sm_86 / 89 / 120 (99 KB).
inline size_t hiddenSmemLimit(size_t optinBytes)
{
    return std::min(kHiddenSmemCap, optinBytes > kStaticSmemReserve ? optinBytes - kStaticSmemReserve : 0);
}

//! The limit on the current device (queried per launch, so an engine built on one GPU runs right
//! on another); the Hopper cap where no device answers.
inline size_t hiddenSmemLimit()
{
    int device = 0;
    int optin = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device) != cudaSuccess)
    {
        cudaGetLastError(); // clear it: no device is not this launch's error
        return kHiddenSmemCap;
    }
    return hiddenSmemLimit(static_cast<size_t>(optin));
}

inline size_t elementSize(int32_t dtype)
{
    return static_cast<DataType>(dtype) == DataType::kFLOAT ? 4 : 2;
}

inline bool validDtype(int32_t dtype)
{
    return dtype >= FLASHSPEC_FLOAT32 && dtype <= FLASHSPEC_BFLOAT16;
}

//! ROWS: the smallest of 1, 2, 4, 8, 16 covering numRows whose block fits limitBytes.
inline int32_t rowsPerBlock(int32_t numRows, int32_t hiddenSize, int32_t dtype, size_t limitBytes)
{
    int32_t rows = 1;
    while (rows < numRows && rows < 16
        && 2 * rows * static_cast<size_t>(hiddenSize) * elementSize(dtype) <= limitBytes)
    {
        rows *= 2;
    }
    return rows;
}

inline bool hiddenFits(int32_t hiddenSize, int32_t dtype, size_t limitBytes)
{
    return static_cast<size_t>(hiddenSize) * elementSize(dtype) <= limitBytes;
}

inline bool aligned16(void const* p)
{
    return reinterpret_cast<uintptr_t>(p) % 16 == 0;
}

//! What a launch does: vocabulary splits, rows per CTA, and the streaming path.
struct LaunchPlan
{
    int32_t splits;
    int32_t rows;
    bool vectorised; // FMA path: 16-byte loads
    bool mma;        // tensor-core path
};

//! Calls f.template operator()<T, ROWS, VEC, MMA>() for the runtime choice: the tensor-core path
//! (ROWS = 16, VEC unused) when mma, else the FMA path with VEC = 16 bytes of T when
//! vectorised (H and the pointers allow 16-byte loads), else 1.
template <typename F>
cudaError_t dispatch(int32_t dtype, LaunchPlan const& plan, F&& f)
{
    auto byVec = [&]<typename T, int ROWS>() -> cudaError_t {
        return plan.vectorised ? f.template operator()<T, ROWS, 16 / sizeof(T), false>()
                          : f.template operator()<T, ROWS, 1, false>();
    };
    auto byRows = [&](auto tag) -> cudaError_t {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, float>)
        {
            if (plan.mma)
            {
                return plan.rows <= 16 ? f.template operator()<T, 16, 1, true>() : f.template operator()<T, 32, 1, true>();
            }
        }
        switch (plan.rows)
        {
        case 1: return byVec.template operator()<T, 1>();
        case 2: return byVec.template operator()<T, 2>();
        case 4: return byVec.template operator()<T, 4>();
        case 8: return byVec.template operator()<T, 8>();
        case 16: return byVec.template operator()<T, 16>();
        default: return cudaErrorInvalidValue;
        }
    };
    switch (static_cast<DataType>(dtype))
    {
    case DataType::kFLOAT: return byRows(float{});
    case DataType::kHALF: return byRows(__half{});
    case DataType::kBF16: return byRows(__nv_bfloat16{});
    }
    return cudaErrorInvalidValue;
}

//! The tensor-core path applies to the shape: half / bf16 and H a multiple of the k chunk.
inline bool mmaShape(int32_t hiddenSize, int32_t dtype)
{
    return validDtype(dtype) && static_cast<DataType>(dtype) != DataType::kFLOAT && hiddenSize % kGemmK == 0;
}

//! ... and to these tensors: 16-byte aligned bases (cp.async).
inline bool useMma(void const* hidden, void const* lmHead, int32_t hiddenSize, int32_t dtype)
{
    return mmaShape(hiddenSize, dtype) && aligned16(hidden) && aligned16(lmHead);
}

//! Rows per CTA of a launch: 16 or 32 on the tensor-core path, else rowsPerBlock (the FMA path).
inline int32_t blockRows(int32_t numRows, int32_t hiddenSize, int32_t dtype, bool mma, size_t limitBytes)
{
    return mma ? (numRows <= 16 ? 16 : 32) : rowsPerBlock(numRows, hiddenSize, dtype, limitBytes);
}

//! 16-byte vector loads are possible: H a multiple of 16 bytes and both bases 16-byte aligned.
inline bool vectorisable(void const* hidden, void const* lmHead, int32_t hiddenSize, int32_t dtype)
{
    return hiddenSize % (16 / elementSize(dtype)) == 0 && aligned16(hidden) && aligned16(lmHead);
}

inline LaunchPlan planLaunch(int32_t op, void const* hidden, void const* lmHead, int32_t numRows,
    int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requestedSplits)
{
    bool const mma = useMma(hidden, lmHead, hiddenSize, dtype);
    return {resolveNumSplits(op, numRows, hiddenSize, vocabSize, dtype, requestedSplits),
        blockRows(numRows, hiddenSize, dtype, mma, hiddenSmemLimit()), vectorisable(hidden, lmHead, hiddenSize, dtype),
        mma};
}

//! Opt a kernel into more than 48 KB of dynamic shared memory (once per instance).
template <typename Kernel>
cudaError_t allowSmem(Kernel kernel, size_t bytes)
{
    if (bytes <= 48 * 1024)
    {
        return cudaSuccess;
    }
    return cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(bytes));
}

} // namespace flashspec

namespace flashspec
{

//! Launch a stage-1 kernel instance: the dynamic shared memory of its path (at least minSmem,
//! which the kernel reuses once its stream is done), grid (row blocks, splits) with the row
//! blocks fastest.
template <typename T, int ROWS, bool MMA, typename Kernel, typename... Args>
cudaError_t launchTilesSmem(Kernel kernel, size_t minSmem, int32_t numRows, int32_t hiddenSize, int32_t splits,
    cudaStream_t stream, Args... args)
{
    size_t smem = static_cast<size_t>(ROWS) * hiddenSize * sizeof(T);
    if constexpr (MMA)
    {
        smem = gemmSmemBytes<T, ROWS>();
    }
    smem = std::max(smem, minSmem);
    cudaError_t const attr = allowSmem(kernel, smem);
    if (attr != cudaSuccess)
    {
        return attr;
    }
    dim3 const grid((numRows + ROWS - 1) / ROWS, splits);
    kernel<<<grid, kThreads, smem, stream>>>(args...);
    return cudaGetLastError();
}

template <typename T, int ROWS, bool MMA, typename Kernel, typename... Args>
cudaError_t launchTiles(Kernel kernel, int32_t numRows, int32_t hiddenSize, int32_t splits, cudaStream_t stream, Args... args)
{
    return launchTilesSmem<T, ROWS, MMA>(kernel, 0, numRows, hiddenSize, splits, stream, args...);
}

} // namespace flashspec
