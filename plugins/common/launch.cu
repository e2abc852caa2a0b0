#include "launch.cuh"
#include "tritonAot.h"

namespace flashspec
{

namespace
{
//! The native kernels: no split narrower than one pass of all warps.
int32_t maxNativeSplits(int32_t vocabSize)
{
    return std::max(1, vocabSize / (kWarps * kUnroll * 4));
}
} // namespace

int32_t maxNumSplits(int32_t vocabSize)
{
    // The compiled Triton table: one split per tile at most; its narrowest tiles (64 ids) give
    // more splits than the native kernels do.
    return std::max(maxNativeSplits(vocabSize), aot::maxTableSplits(vocabSize));
}

int32_t resolveNumSplits(
    int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested)
{
    if (requested > 0)
    {
        return requested;
    }
    // Where the compiled Triton kernels serve the shape, their launch table's count.
    int32_t const tuned = aot::tunedSplits(op, numRows, hiddenSize, vocabSize, dtype);
    if (tuned > 0)
    {
        return tuned;
    }
    int device = 0;
    int smCount = 132;
    if (cudaGetDevice(&device) == cudaSuccess)
    {
        cudaDeviceGetAttribute(&smCount, cudaDevAttrMultiProcessorCount, device);
    }
    int32_t const rows = blockRows(numRows, hiddenSize, dtype, mmaShape(hiddenSize, dtype));
    int32_t const rowBlocks = (numRows + rows - 1) / rows;
    // Two CTAs per SM over all row blocks, no split narrower than one pass of all warps.
    int32_t const bySm = std::max(1, (2 * smCount + rowBlocks - 1) / rowBlocks);
    return std::min(bySm, maxNativeSplits(vocabSize));
}

} // namespace flashspec
