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
 * aligned (the compiled specialisation). The workspace layout is the native kernels' one, so the
 * workspace size functions cover both paths for a given split count.
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

//! A launch on the compiled kernels.
struct Plan
{
    TileConfig const* tile;
    FinalizeConfig const* finalize;
    int32_t splits;
};

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
