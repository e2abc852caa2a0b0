/*
 * The Triton kernels of kernels/ compiled ahead of time into the library (cubins for one GPU
 * architecture) and their launcher. The table kTable is generated at build time by
 * `python -m flashspec_export.kernels.aot` (CMake option FLASHSPEC_TRITON_AOT) from the Triton
 * launch table kernels/tiles.py TUNED; without it the table is empty (tritonAotEmpty.cpp) and
 * every call runs the native CUDA kernels.
 *
 * invokeTiledArgmax / invokeVerifyResample ask plan*() first: a plan exists when the current
 * device has the table's architecture, a tile kernel is compiled for (op, dtype, H, rows), a
 * finalize kernel covers the split count (and γ + 1 for verify), and hidden / lm_head are 16-byte
 * aligned (the compiled specialisation). On sm_90 the table names, from 33 (verify) or 129
 * (argmax) rows, the Hopper kernel (kernels/hopper_tiles.py), which splits the vocabulary into
 * its 128-id tiles and needs the driver's cuTensorMapEncodeTiled. The workspace layout is the
 * native kernels' one, so the workspace size functions cover both paths for a given split count;
 * the verify workspace ends with the Hopper kernel's row scratch (kRowScratchBytes).
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
//! 3 x BLOCK_N (<= 128) int32 (the rows' noise keys and temperatures).
constexpr int32_t kMaxPersistentCtas = 256;
constexpr size_t kRowScratchBytes = size_t{kMaxPersistentCtas} * 3 * 128 * sizeof(int32_t);

//! The row scratch's offset in a verify workspace of numRows x numSplits summaries: after them,
//! 16-byte aligned.
inline size_t rowScratchOffset(int32_t numRows, int32_t numSplits)
{
    size_t const summaries = static_cast<size_t>(numRows) * numSplits * (4 * sizeof(float) + sizeof(int32_t));
    return (summaries + 15) / 16 * 16;
}

//! A launch on the compiled kernels.
struct Plan
{
    TileConfig const* tile;
    FinalizeConfig const* finalize;
    int32_t splits;
    int32_t sms; // the device's SM count (the Hopper kernel's CTAs)
};

//! The FlashspecKernelPath of a plan.
inline int32_t pathOf(Plan const& plan)
{
    return plan.tile->blockK > 0 ? FLASHSPEC_PATH_TRITON_AOT_HOPPER : FLASHSPEC_PATH_TRITON_AOT;
}

//! The split count the Triton launch table chooses on the current device (tiles.num_splits), or
//! 0 where no compiled kernels serve (op, numRows, hiddenSize, dtype) here.
int32_t tunedSplits(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype);

//! A plan for the call, or false: the native kernels run it.
bool planTiledArgmax(TiledArgmaxParams const& params, Plan& plan);
bool planVerifyResample(VerifyResampleParams const& params, Plan& plan);

cudaError_t launchTiledArgmax(TiledArgmaxParams const& params, Plan const& plan, cudaStream_t stream);
cudaError_t launchVerifyResample(VerifyResampleParams const& params, Plan const& plan, cudaStream_t stream);

} // namespace aot
} // namespace flashspec
