#include "verifyResamplePlugin.h"

using namespace nvinfer1;

namespace flashspec
{
namespace plugin
{
namespace
{
// inputs: hidden [N, R, H], lm_head [V, H], draft_tokens [N, R - 1] int64, temperature [N] float,
// seed [N] int64, positions [N] int64; outputs: tokens [N, R] int64, num_emitted [N] int64,
// logprobs [N, R] float (only with return_logprobs = 1)
constexpr int32_t kHidden = 0;
constexpr int32_t kLmHead = 1;
constexpr int32_t kDrafts = 2;
constexpr int32_t kTemperature = 3;
constexpr int32_t kSeed = 4;
constexpr int32_t kPositions = 5;
constexpr int32_t kNbInputs = 6;
} // namespace

VerifyResamplePlugin::VerifyResamplePlugin(int32_t vocabSize, int32_t numSplits, int32_t returnLogprobs)
    : FlashspecOpPlugin(vocabSize, numSplits, kReturnField, returnLogprobs)
{
}

int32_t VerifyResamplePlugin::getOutputDataTypes(
    nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* /* inputTypes */, int32_t nbInputs) const noexcept
{
    if (nbInputs != kNbInputs || nbOutputs != getNbOutputs())
    {
        return -1;
    }
    outputTypes[0] = nvinfer1::DataType::kINT64;
    outputTypes[1] = nvinfer1::DataType::kINT64;
    if (mReturnLast != 0)
    {
        outputTypes[2] = nvinfer1::DataType::kFLOAT;
    }
    return 0;
}

int32_t VerifyResamplePlugin::getOutputShapes(DimsExprs const* inputs, int32_t nbInputs,
    DimsExprs const* /* shapeInputs */, int32_t /* nbShapeInputs */, DimsExprs* outputs, int32_t nbOutputs,
    IExprBuilder& /* exprBuilder */) noexcept
{
    if (nbInputs != kNbInputs || nbOutputs != getNbOutputs() || inputs[kHidden].nbDims != 3
        || inputs[kLmHead].nbDims != 2 || inputs[kDrafts].nbDims != 2)
    {
        logError("VerifyResample: expected hidden [N, R, H], lm_head [V, H], draft_tokens [N, R - 1]");
        return -1;
    }
    IDimensionExpr const* n = inputs[kHidden].d[0];
    IDimensionExpr const* rows = inputs[kHidden].d[1];
    outputs[0].nbDims = 2; // tokens [N, R]
    outputs[0].d[0] = n;
    outputs[0].d[1] = rows;
    outputs[1].nbDims = 1; // num_emitted [N]
    outputs[1].d[0] = n;
    if (mReturnLast != 0)
    {
        outputs[2] = outputs[0]; // logprobs [N, R]
    }
    return 0;
}

bool VerifyResamplePlugin::supportsFormatCombination(
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
    case kTemperature: return desc.type == nvinfer1::DataType::kFLOAT;
    case kDrafts:
    case kSeed:
    case kPositions:
    case kNbInputs + 0: // tokens
    case kNbInputs + 1: // num_emitted
        return desc.type == nvinfer1::DataType::kINT64;
    case kNbInputs + 2: return mReturnLast != 0 && desc.type == nvinfer1::DataType::kFLOAT; // logprobs
    default: return false;
    }
}

size_t VerifyResamplePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t /* nbInputs */,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    // Every shape <= max, with the split count enqueue launches.
    int64_t const maxRows = inputs[kHidden].max.d[0] * inputs[kHidden].max.d[1];
    auto const hiddenSize = static_cast<int32_t>(inputs[kHidden].max.d[2]);
    return getVerifyResampleWorkspaceSize(static_cast<int32_t>(maxRows), workspaceSplits(), hiddenSize);
}

int32_t VerifyResamplePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    Dims const& hidden = inputDesc[kHidden].dims;
    Dims const* dims[kNbInputs];
    for (int32_t i = 0; i < kNbInputs; ++i)
    {
        dims[i] = &inputDesc[i].dims;
    }
    if (!shapesFit(dims, kNbInputs)) // TensorRT's shape inference cannot catch these: no output
    {                                // depends on H of lm_head or the per-sequence lengths
        return -1;
    }
    VerifyResampleParams params{};
    params.hidden = inputs[kHidden];
    params.lmHead = inputs[kLmHead];
    params.draftTokens = static_cast<int64_t const*>(inputs[kDrafts]);
    params.temperature = static_cast<float const*>(inputs[kTemperature]);
    params.seed = static_cast<int64_t const*>(inputs[kSeed]);
    params.positions = static_cast<int64_t const*>(inputs[kPositions]);
    params.tokens = static_cast<int64_t*>(outputs[0]);
    params.numEmitted = static_cast<int64_t*>(outputs[1]);
    // Without logprobs the kernels skip the LSE (no max / sum-exp / l(y) per tile, a finalizer
    // without them: nullptr is the library's "not asked for").
    params.logprobs = mReturnLast != 0 ? static_cast<float*>(outputs[2]) : nullptr;
    params.workspace = workspace;
    params.batch = static_cast<int32_t>(hidden.d[0]);
    params.gamma = static_cast<int32_t>(hidden.d[1] - 1);
    params.hiddenSize = static_cast<int32_t>(hidden.d[2]);
    params.vocabSize = mVocabSize;
    params.dtype = kernelDtype(inputDesc[kHidden].type);
    params.numSplits = mNumSplits; // fixed at build (configurePlugin); 0: resolved here
    cudaError_t const status = invokeVerifyResample(params, stream);
    if (status != cudaSuccess)
    {
        logLaunchError("VerifyResample", status);
        return -1;
    }
    return 0;
}

} // namespace plugin
} // namespace flashspec
