/*
 * TiledArgmax: token[n] = argmax_v hidden[n] . lmHead[v] over v < vocabSize (lowest v on ties),
 * without writing logits. Stage 1 (grid: vocabulary splits x row blocks) streams the LM head
 * once per row block and leaves a (max, index) per (row, split) in the workspace; stage 2 (one
 * thread per row) reduces the splits in order. Memory traffic: the LM head once, plus
 * numRows x numSplits x 8 bytes of workspace.
 */
#include "../common/launch.cuh"
#include "../common/flashspecKernels.h"
#include "../common/tritonAot.h"

#include <cmath>

namespace flashspec
{
namespace
{

struct ArgmaxWorkspace
{
    float* best;   // [numRows, numSplits]
    int32_t* index; // [numRows, numSplits]
};

ArgmaxWorkspace argmaxWorkspace(void* workspace, int32_t numRows, int32_t numSplits)
{
    size_t const count = static_cast<size_t>(numRows) * numSplits;
    auto* best = static_cast<float*>(workspace);
    return {best, reinterpret_cast<int32_t*>(best + count)};
}

template <typename T, int ROWS, int VEC, bool MMA>
__global__ void __launch_bounds__(kThreads) argmaxTilesKernel(
    T const* hidden, T const* lmHead, ArgmaxWorkspace ws, int numRows, int hiddenSize, int vocabSize)
{
    extern __shared__ __align__(128) unsigned char smemRaw[];
    __shared__ float warpBest[kWarps][32];
    __shared__ int32_t warpIndex[kWarps][32];
    T* smemHidden = reinterpret_cast<T*>(smemRaw);
    int const row0 = blockIdx.x * ROWS; // row blocks run fastest: they share LM-head tiles in L2
    if constexpr (!MMA)
    {
        stageHidden<T, ROWS>(smemHidden, hidden, row0, numRows, hiddenSize);
    }

    int begin, end;
    splitRange(vocabSize, gridDim.y, blockIdx.y, begin, end);
    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    float best = -INFINITY; // of the row laneBlockRow(lane)
    int32_t bestIndex = -1;
    streamVocab<T, ROWS, VEC, MMA>(hidden, smemHidden, smemRaw, lmHead, row0, numRows, begin, end, hiddenSize, vocabSize, [&](int v, float dot) {
        float const logit = isnan(dot) ? -INFINITY : dot; // a NaN logit counts as -inf (reference no_nan)
        if (logit > best || bestIndex < 0) // ids ascend per lane: strict > keeps the lowest
        {
            best = logit;
            bestIndex = v;
        }
    });
    warpBest[warp][lane] = best;
    warpIndex[warp][lane] = bestIndex;
    __syncthreads();
    if (warp == 0 && lane < ROWS && row0 + lane < numRows)
    {
        float b = -INFINITY;
        int32_t bi = -1;
        for (int w = 0; w < kWarps; ++w)
        {
            for (int l = lane; l < 32; l += laneStride<ROWS, MMA>()) // the lanes that served this row
            {
                float const x = warpBest[w][l];
                int32_t const i = warpIndex[w][l];
                if (i >= 0 && (bi < 0 || x > b || (x == b && i < bi)))
                {
                    b = x;
                    bi = i;
                }
            }
        }
        size_t const slot = static_cast<size_t>(row0 + lane) * gridDim.y + blockIdx.y;
        ws.best[slot] = b;
        ws.index[slot] = bi;
    }
}

__global__ void argmaxFinalizeKernel(ArgmaxWorkspace ws, int64_t* tokens, float* maxLogit, int numRows, int numSplits)
{
    int const row = blockIdx.x * blockDim.x + threadIdx.x;
    if (row >= numRows)
    {
        return;
    }
    float b = -INFINITY;
    int32_t bi = -1;
    for (int s = 0; s < numSplits; ++s) // splits ascend: strict > keeps the lowest id
    {
        size_t const slot = static_cast<size_t>(row) * numSplits + s;
        int32_t const i = ws.index[slot];
        if (i >= 0 && (bi < 0 || ws.best[slot] > b))
        {
            b = ws.best[slot];
            bi = i;
        }
    }
    tokens[row] = bi;
    maxLogit[row] = b;
}

bool validParams(TiledArgmaxParams const& p)
{
    return p.numRows > 0 && p.hiddenSize > 0 && p.vocabSize > 0 && validDtype(p.dtype) && p.numSplits >= 0;
}

} // namespace

int32_t tiledArgmaxPath(TiledArgmaxParams const& p)
{
    aot::Plan plan;
    return validParams(p) && aot::planTiledArgmax(p, plan) ? aot::pathOf(plan) : FLASHSPEC_PATH_NATIVE;
}

size_t getTiledArgmaxWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize)
{
    return aot::argmaxBlockOffset(numRows, numSplits) + aot::wholeBlockBytes(hiddenSize);
}

cudaError_t invokeTiledArgmax(TiledArgmaxParams const& p, cudaStream_t stream)
{
    if (!validParams(p))
    {
        return cudaErrorInvalidValue;
    }
    if (aot::Plan aotPlan; aot::planTiledArgmax(p, aotPlan))
    {
        return aot::launchTiledArgmax(p, aotPlan, stream); // the compiled Triton kernels
    }
    aot::warnNative(FLASHSPEC_OP_TILED_ARGMAX, p.dtype, p.hiddenSize);
    LaunchPlan const plan = planLaunch(
        FLASHSPEC_OP_TILED_ARGMAX, p.hidden, p.lmHead, p.numRows, p.hiddenSize, p.vocabSize, p.dtype, p.numSplits);
    if (!plan.mma && !hiddenFits(p.hiddenSize, p.dtype, hiddenSmemLimit()))
    {
        return cudaErrorInvalidValue; // the FMA path stages hidden rows in shared memory; the tensor-core path does not
    }
    int32_t const splits = plan.splits;
    ArgmaxWorkspace const ws = argmaxWorkspace(p.workspace, p.numRows, splits);
    cudaError_t const status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
        return launchTiles<T, ROWS, MMA>(argmaxTilesKernel<T, ROWS, VEC, MMA>, p.numRows, p.hiddenSize, splits, stream,
            static_cast<T const*>(p.hidden), static_cast<T const*>(p.lmHead), ws, static_cast<int>(p.numRows),
            static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
    });
    if (status != cudaSuccess)
    {
        return status;
    }
    argmaxFinalizeKernel<<<(p.numRows + 127) / 128, 128, 0, stream>>>(ws, p.tokens, p.maxLogit, p.numRows, splits);
    return cudaGetLastError();
}

} // namespace flashspec
