/*
 * The Triton kernels of kernels/ compiled ahead of time into the library (cubins for one GPU
 * architecture) and their launcher. The table kTable is generated at build time by
 * `python -m flashspec_export.kernels.aot` (CMake option FLASHSPEC_TRITON_AOT) from the Triton
 * launch tables kernels/tiles.py TUNED, TUNED_BY_DEVICE and HOPPER_TUNED; without it the table is
 * empty (tritonAotEmpty.cpp) and every call runs the native CUDA kernels.
 *
 * invokeTiledArgmax / invokeVerifyResample ask plan*() first: a plan exists when the current
 * device has the table's architecture, a tile kernel is compiled for (op, dtype, H, rows) — a
 * row of the GPU's own (its name, cudaDeviceProp::name, contains the row's) before any GPU's —, a
 * finalize kernel covers the split count (and γ + 1 for verify), and hidden / lm_head are 16-byte
 * aligned (the compiled specialisation). On sm_90 the table names, from 17 rows, the Hopper
 * kernel (kernels/hopper_tiles.py), which splits the vocabulary into its tiles (HOPPER_TUNED's
 * block_v ids) and needs the driver's cuTensorMapEncodeTiled. The workspace starts with the
 * native kernels' layout, so the workspace size functions cover both paths for a given split
 * count; the verify workspace goes on with the Hopper kernel's row scratch (kRowScratchBytes),
 * and both end with a whole row block of hidden rows (wholeBlockBytes).
 */
#pragma once

#include "flashspecKernels.h"
#include "tritonAotTable.h"

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

namespace flashspec
{
namespace aot
{

//! Most CTAs of a Hopper-kernel launch (one per SM up to this), and its per-CTA row scratch:
//! 9 x BLOCK_N (<= 128) int32 (the rows' temperatures, and the Gumbel and uniform of each of a
//! tile's at most four 64-id blocks: hopper_tiles.SCRATCH_PER_ROW).
constexpr int32_t kMaxPersistentCtas = 256;
constexpr int32_t kScratchPerRow = 9;
constexpr size_t kRowScratchBytes = size_t{kMaxPersistentCtas} * kScratchPerRow * 128 * sizeof(int32_t);

//! Most rows of a Hopper row block. A launch with fewer rows than its row block first copies them
//! into a whole block at the end of the workspace: TMA fills a box that reaches past the last
//! row more slowly (hopper_tiles._whole_row_block). 16-bit elements: the Hopper kernel's dtypes.
constexpr int32_t kMaxBlockRows = 128;

inline size_t align16(size_t bytes)
{
    return (bytes + 15) / 16 * 16;
}

//! The whole row block's bytes in a workspace for hidden size H.
inline size_t wholeBlockBytes(int32_t hiddenSize)
{
    return size_t{kMaxBlockRows} * hiddenSize * 2;
}

//! The row scratch's offset in a verify workspace of numRows x numSplits summaries: after them,
//! 16-byte aligned.
inline size_t rowScratchOffset(int32_t numRows, int32_t numSplits)
{
    return align16(static_cast<size_t>(numRows) * numSplits * (4 * sizeof(float) + sizeof(int32_t)));
}

//! The whole row block's offset in a verify workspace: after the row scratch.
inline size_t verifyBlockOffset(int32_t numRows, int32_t numSplits)
{
    return rowScratchOffset(numRows, numSplits) + kRowScratchBytes;
}

//! The whole row block's offset in an argmax workspace: after the summaries (max and index).
inline size_t argmaxBlockOffset(int32_t numRows, int32_t numSplits)
{
    return align16(static_cast<size_t>(numRows) * numSplits * (sizeof(float) + sizeof(int32_t)));
}

//! A launch on the compiled kernels.
struct Plan
{
    TileConfig const* tile;
    FinalizeConfig const* finalize;
    int32_t splits;
    int32_t sms;                      // the device's SM count (the Hopper kernel's CTAs)
    // top-k / top-p: the hand-in's sampled logits and threshold kernels, and stage 2
    SampledConfig const* sampled = nullptr;
    ThresholdConfig const* threshold = nullptr;
    SettleConfig const* settle = nullptr;
};

//! A top-k / top-p call's buffers: the native workspace's truncated and unsettled flags
//! (truncation.cuh), then the hand-in's own region (handInBytes, at handInAt).
struct HandInBuffers
{
    int32_t* truncated; //!< [batch] out: 1 where top-k or top-p applies
    int32_t* unsettled; //!< [numRows] out: 1 where the hand-in does not settle the kept set
    float* partials;    //!< [kSplits, numRows, ceil(V / kHandInStride)]: the sampled logits
    float* thresholds;  //!< [numRows]: the dot each row hands in from
    int32_t* counts;    //!< [numRows]: keys each row handed in
    int64_t* keys;      //!< [numRows, kHandInCap]: the handed-in keys
    int64_t* selected;  //!< [numRows, kSelected]: stage 2's scratch
};

//! The hand-in region's bytes for numRows rows of a vocabulary of vocabSize ids.
inline size_t handInBytes(int32_t numRows, int32_t vocabSize)
{
    size_t const rows = static_cast<size_t>(numRows);
    size_t const sampled = static_cast<size_t>((vocabSize + kHandInStride - 1) / kHandInStride);
    return align16(kMaxSampledSplits * rows * sampled * sizeof(float)) + 2 * align16(rows * sizeof(float))
        + align16(rows * kHandInCap * sizeof(int64_t)) + rows * kSelected * sizeof(int64_t);
}

//! The hand-in buffers in a region of handInBytes at `base` (16-byte aligned: each buffer is).
inline HandInBuffers handInAt(void* base, int32_t numRows, int32_t vocabSize, int32_t* truncated, int32_t* unsettled)
{
    size_t const rows = static_cast<size_t>(numRows);
    size_t const sampled = static_cast<size_t>((vocabSize + kHandInStride - 1) / kHandInStride);
    auto* p = static_cast<char*>(base);
    HandInBuffers b{truncated, unsettled};
    b.partials = reinterpret_cast<float*>(p);
    p += align16(kMaxSampledSplits * rows * sampled * sizeof(float));
    b.thresholds = reinterpret_cast<float*>(p);
    p += align16(rows * sizeof(float));
    b.counts = reinterpret_cast<int32_t*>(p);
    p += align16(rows * sizeof(int32_t));
    b.keys = reinterpret_cast<int64_t*>(p);
    p += align16(rows * kHandInCap * sizeof(int64_t));
    b.selected = reinterpret_cast<int64_t*>(p);
    return b;
}


//! The FlashspecKernelPath of a plan.
inline int32_t pathOf(Plan const& plan)
{
    return plan.tile->blockK > 0 ? FLASHSPEC_PATH_TRITON_AOT_HOPPER : FLASHSPEC_PATH_TRITON_AOT;
}

//! The split count the Triton launch table chooses on the current device (tiles.num_splits), or
//! 0 where no compiled kernels serve (op, numRows, hiddenSize, dtype) here.
int32_t tunedSplits(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype);

//! The split count row `row` of the compiled table gives numRows rows of a vocabulary of
//! vocabSize ids on a GPU with `sms` SMs (tiles.num_splits), or -1 past the table's end.
int32_t tableSplits(size_t row, int32_t numRows, int32_t vocabSize, int32_t sms);

//! The most splits any row of the compiled table gives a vocabulary of vocabSize ids on any GPU
//! (one split per tile at most: cdiv(V, the smallest BLOCK_V)); 0 for an empty table.
int32_t maxTableSplits(int32_t vocabSize);

//! Loads the compiled kernels into the current CUDA context (once per context; the current
//! device's primary context where none is current). Call it outside CUDA-graph capture, before a
//! launch that may be captured: a launch on a capturing stream never loads them and fails with
//! cudaErrorStreamCaptureUnsupported where they are not loaded (tritonAot.cu says why). Success
//! without loading anything where no kernels are compiled in or the device is not the table's
//! architecture; cudaErrorNoDevice without a CUDA driver, cudaErrorInsufficientDriver with one
//! older than CUDA 12.0.
cudaError_t prepare();

//! Once per (op, dtype, H) and process, a line on stderr where a call runs the native kernels on
//! a GPU the library has compiled kernels for but not for this (dtype, H) — or on sm_90 (the
//! default build's architecture) in a library built without them: never silently slow.
void warnNative(int32_t op, int32_t dtype, int32_t hiddenSize);

//! A plan for the call, or false: the native kernels run it. A top-k / top-p call plans on the
//! hand-in rows (op FLASHSPEC_OP_VERIFY_TRUNCATED), the hand-in's sampled logits and threshold
//! kernels and a stage-2 kernel for its splits.
bool planTiledArgmax(TiledArgmaxParams const& params, Plan& plan);
bool planVerifyResample(VerifyResampleParams const& params, Plan& plan);

cudaError_t launchTiledArgmax(TiledArgmaxParams const& params, Plan const& plan, cudaStream_t stream);
cudaError_t launchVerifyResample(VerifyResampleParams const& params, Plan const& plan, cudaStream_t stream);

//! A top-k / top-p call up to its finalize (its plan has the hand-in's kernels), the Triton
//! backend's launches (verify_resample): the sampled logits, the thresholds (which also write
//! `buffers.truncated` and zero the counts), the tile pass handing in every dot at or above its
//! row's threshold, then stage 2, which rewrites the summaries of the rows it settles and flags
//! the others in `buffers.unsettled` (the caller recomputes them before launchVerifyFinalize).
cudaError_t launchVerifyTruncated(
    VerifyResampleParams const& params, Plan const& plan, HandInBuffers const& buffers, cudaStream_t stream);
//! The finalize of a verify plan: acceptance, the emitted tokens and log-probabilities.
cudaError_t launchVerifyFinalize(VerifyResampleParams const& params, Plan const& plan, cudaStream_t stream);

} // namespace aot
} // namespace flashspec
