#include "flashspecCApi.h"
#include "flashspecKernels.h"
#include "launch.cuh"
#include "tritonAot.h"

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <initializer_list>

using namespace flashspec;

extern "C"
{

int32_t flashspecAbiVersion(void)
{
    return FLASHSPEC_ABI_VERSION;
}

int32_t flashspecDtypeCode(char const* name)
{
    struct Entry
    {
        char const* name;
        int32_t code;
    };
    static constexpr Entry kCodes[] = {
        {"float32", FLASHSPEC_FLOAT32}, {"float16", FLASHSPEC_FLOAT16}, {"bfloat16", FLASHSPEC_BFLOAT16}};
    for (Entry const& e : kCodes)
    {
        if (name != nullptr && std::strcmp(name, e.name) == 0)
        {
            return e.code;
        }
    }
    return -1;
}

int32_t flashspecNoise(void const* params, void* stream)
{
    return static_cast<int32_t>(
        invokeNoise(*static_cast<NoiseParams const*>(params), static_cast<cudaStream_t>(stream)));
}

int32_t flashspecResolveNumSplits(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested)
{
    return resolveNumSplits(op, numRows, hiddenSize, vocabSize, dtype, requested);
}

int32_t flashspecMaxNumSplits(int32_t vocabSize)
{
    return maxNumSplits(vocabSize);
}

int32_t flashspecTableSplits(int32_t row, int32_t numRows, int32_t vocabSize, int32_t sms)
{
    return row < 0 ? -1 : aot::tableSplits(static_cast<size_t>(row), numRows, vocabSize, sms);
}

int32_t flashspecCheckShapes(int32_t op, int32_t const* nbDims, int64_t const* dims, int32_t nbInputs,
    int32_t vocabSize, char* message, size_t capacity)
{
    TensorShape shapes[kMaxOpInputs]{};
    if (nbInputs < 0)
    {
        return -1;
    }
    // checkShapes refuses a count outside the op's before it reads a shape: it names it
    for (int32_t i = 0; i < std::min(nbInputs, kMaxOpInputs); ++i)
    {
        shapes[i].nbDims = std::min(nbDims[i], 8);
        for (int32_t j = 0; j < shapes[i].nbDims; ++j)
        {
            shapes[i].d[j] = dims[8 * i + j];
        }
    }
    return checkShapes(op, shapes, nbInputs, vocabSize, message, capacity);
}

int64_t flashspecStagedSmemBytes(int32_t numRows, int32_t hiddenSize, int32_t dtype, int64_t optinBytes)
{
    size_t const limit = hiddenSmemLimit(static_cast<size_t>(std::max<int64_t>(optinBytes, 0)));
    if (!validDtype(dtype) || !hiddenFits(hiddenSize, dtype, limit))
    {
        return -1;
    }
    return int64_t{rowsPerBlock(numRows, hiddenSize, dtype, limit)} * hiddenSize * static_cast<int64_t>(elementSize(dtype));
}

int32_t flashspecKernelPath(int32_t op, void const* params)
{
    switch (op)
    {
    case FLASHSPEC_OP_TILED_ARGMAX: return tiledArgmaxPath(*static_cast<TiledArgmaxParams const*>(params));
    case FLASHSPEC_OP_VERIFY_RESAMPLE: return verifyResamplePath(*static_cast<VerifyResampleParams const*>(params));
    default: return -1;
    }
}

int32_t flashspecPrepareKernels(void)
{
    return static_cast<int32_t>(prepareKernels());
}

int32_t flashspecTritonAotArch(void)
{
    return aot::kTable.numKernels > 0 ? aot::kTable.arch : 0;
}

size_t flashspecTiledArgmaxWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize)
{
    return getTiledArgmaxWorkspaceSize(numRows, numSplits, hiddenSize);
}

size_t flashspecVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize)
{
    return getVerifyResampleWorkspaceSize(numRows, numSplits, hiddenSize);
}

size_t flashspecVerifyResampleTruncatedWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize, int32_t vocabSize)
{
    return getVerifyResampleTruncatedWorkspaceSize(numRows, numSplits, hiddenSize, vocabSize);
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

int32_t flashspecParamsLayout(int32_t op, size_t* offsets, int32_t capacity)
{
    auto write = [&](std::initializer_list<size_t> values) -> int32_t {
        if (static_cast<int32_t>(values.size()) > capacity)
        {
            return -1;
        }
        int32_t i = 0;
        for (size_t v : values)
        {
            offsets[i++] = v;
        }
        return i;
    };
    using A = TiledArgmaxParams;
    using V = VerifyResampleParams;
    using N = NoiseParams;
    switch (op)
    {
    case FLASHSPEC_OP_TILED_ARGMAX:
        return write({offsetof(A, hidden), offsetof(A, lmHead), offsetof(A, tokens), offsetof(A, maxLogit),
            offsetof(A, workspace), offsetof(A, numRows), offsetof(A, hiddenSize), offsetof(A, vocabSize),
            offsetof(A, dtype), offsetof(A, numSplits), sizeof(A)});
    case FLASHSPEC_OP_VERIFY_RESAMPLE:
        return write({offsetof(V, hidden), offsetof(V, lmHead), offsetof(V, draftTokens), offsetof(V, temperature),
            offsetof(V, seed), offsetof(V, positions), offsetof(V, tokens), offsetof(V, numEmitted),
            offsetof(V, logprobs), offsetof(V, workspace), offsetof(V, batch), offsetof(V, gamma),
            offsetof(V, hiddenSize), offsetof(V, vocabSize), offsetof(V, dtype), offsetof(V, numSplits),
            offsetof(V, topK), offsetof(V, topP), offsetof(V, allowedTokens), offsetof(V, unsettled), sizeof(V)});
    case FLASHSPEC_OP_NOISE:
        return write({offsetof(N, seed), offsetof(N, position), offsetof(N, token), offsetof(N, bits),
            offsetof(N, uniform), offsetof(N, gumbel), offsetof(N, count), offsetof(N, stream), sizeof(N)});
    default: return -1;
    }
}

} // extern "C"
