#include "flashspecCApi.h"
#include "flashspecKernels.h"

using namespace flashspec;

extern "C"
{

int32_t flashspecAbiVersion(void)
{
    return 1;
}

int32_t flashspecResolveNumSplits(int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested)
{
    return resolveNumSplits(numRows, hiddenSize, vocabSize, dtype, requested);
}

size_t flashspecTiledArgmaxWorkspaceSize(int32_t numRows, int32_t numSplits)
{
    return getTiledArgmaxWorkspaceSize(numRows, numSplits);
}

size_t flashspecVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits)
{
    return getVerifyResampleWorkspaceSize(numRows, numSplits);
}

int32_t flashspecTiledArgmax(void const* params, void* stream)
{
    return static_cast<int32_t>(
        invokeTiledArgmax(*static_cast<TiledArgmaxParams const*>(params), static_cast<cudaStream_t>(stream)));
}

int32_t flashspecVerifyResample(void const* params, void* stream)
{
    return static_cast<int32_t>(
        invokeVerifyResample(*static_cast<VerifyResampleParams const*>(params), static_cast<cudaStream_t>(stream)));
}

char const* flashspecErrorString(int32_t status)
{
    return cudaGetErrorString(static_cast<cudaError_t>(status));
}

} // extern "C"
