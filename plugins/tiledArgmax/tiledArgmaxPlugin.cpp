#include "tiledArgmaxPlugin.h"

using namespace nvinfer1;

namespace flashspec
{
namespace plugin
{
namespace
{
// inputs: hidden [N, H], lm_head [V, H]; outputs: token [N] int64, max_logit [N] float
constexpr int32_t kHidden = 0;
constexpr int32_t kLmHead = 1;
constexpr int32_t kToken = 2;
constexpr int32_t kMaxLogit = 3;
} // namespace

TiledArgmaxPlugin::TiledArgmaxPlugin(int32_t vocabSize, int32_t numSplits)
    : FlashspecOpPlugin(vocabSize, numSplits)
{
}

int32_t TiledArgmaxPlugin::getOutputDataTypes(
    nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* /* inputTypes */, int32_t nbInputs) const noexcept
{
    if (nbInputs != 2 || nbOutputs != 2)
    {
        return -1;
    }
    outputTypes[0] = nvinfer1::DataType::kINT64;
    outputTypes[1] = nvinfer1::DataType::kFLOAT;
    return 0;
}

int32_t TiledArgmaxPlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs, DimsExprs const* /* shapeInputs */,
    int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs, IExprBuilder& /* exprBuilder */) noexcept
{
    if (nbInputs != 2 || nbOutputs != 2 || inputs[kHidden].nbDims != 2 || inputs[kLmHead].nbDims != 2)
    {
        logError("TiledArgmax: expected hidden [N, H] and lm_head [V, H]");
        return -1;
    }
    for (int32_t i = 0; i < 2; ++i)
    {
        outputs[i].nbDims = 1;
        outputs[i].d[0] = inputs[kHidden].d[0];
    }
    return 0;
}

bool TiledArgmaxPlugin::supportsFormatCombination(
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t /* nbInputs */, int32_t /* nbOutputs */) noexcept
{
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    switch (pos)
    {
    case kHidden: return isFloatType(desc.type);
    case kLmHead: return desc.type == inOut[kHidden].desc.type;
    case kToken: return desc.type == nvinfer1::DataType::kINT64;
    case kMaxLogit: return desc.type == nvinfer1::DataType::kFLOAT;
    default: return false;
    }
}

size_t TiledArgmaxPlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t /* nbInputs */,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    // Every N <= max N, with the split count enqueue launches.
    int32_t const maxRows = static_cast<int32_t>(inputs[kHidden].max.d[0]);
    auto const hiddenSize = static_cast<int32_t>(inputs[kHidden].max.d[1]);
    return getTiledArgmaxWorkspaceSize(maxRows, workspaceSplits(), hiddenSize);
}

int32_t TiledArgmaxPlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    Dims const* dims[] = {&inputDesc[kHidden].dims, &inputDesc[kLmHead].dims};
    if (!shapesFit(dims, 2))
    {
        return -1;
    }
    TiledArgmaxParams params{};
    params.hidden = inputs[kHidden];
    params.lmHead = inputs[kLmHead];
    params.tokens = static_cast<int64_t*>(outputs[0]);
    params.maxLogit = static_cast<float*>(outputs[1]);
    params.workspace = workspace;
    params.numRows = static_cast<int32_t>(inputDesc[kHidden].dims.d[0]);
    params.hiddenSize = static_cast<int32_t>(inputDesc[kHidden].dims.d[1]);
    params.vocabSize = mVocabSize;
    params.dtype = kernelDtype(inputDesc[kHidden].type);
    params.numSplits = mNumSplits; // fixed at build (configurePlugin); 0: resolved here
    cudaError_t const status = invokeTiledArgmax(params, stream);
    if (status != cudaSuccess)
    {
        logLaunchError("TiledArgmax", status);
        return -1;
    }
    return 0;
}

} // namespace plugin
} // namespace flashspec
