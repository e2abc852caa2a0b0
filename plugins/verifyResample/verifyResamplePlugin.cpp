#include "verifyResamplePlugin.h"

using namespace nvinfer1;

namespace flashspec
{
namespace plugin
{
namespace
{
// inputs: hidden [N, R, H], lm_head [V, H], draft_tokens [N, R - 1] int64, temperature [N] float,
// seed [N] int64, positions [N] int64, then the optional inputs the node has, in this order:
// top_k [N] int64, top_p [N] float, allowed_tokens [N, R, ceil(V / 32)] int32;
// outputs: tokens [N, R] int64, num_emitted [N] int64, logprobs [N, R] float (only with
// return_logprobs = 1)
constexpr int32_t kHidden = 0;
constexpr int32_t kLmHead = 1;
constexpr int32_t kDrafts = 2;
constexpr int32_t kTemperature = 3;
constexpr int32_t kSeed = 4;
constexpr int32_t kPositions = 5;
constexpr int32_t kNbRequired = 6;
constexpr int32_t kMostInputs = 9;

struct Optional
{
    int32_t bit;
    nvinfer1::DataType type;
};
constexpr Optional kOptional[3] = {{VerifyResamplePlugin::kTopK, nvinfer1::DataType::kINT64},
    {VerifyResamplePlugin::kTopP, nvinfer1::DataType::kFLOAT},
    {VerifyResamplePlugin::kAllowedTokens, nvinfer1::DataType::kINT32}};

int32_t countBits(int32_t mask)
{
    return (mask & 1) + ((mask >> 1) & 1) + ((mask >> 2) & 1);
}

//! The input index of optional input `bit` under `mask`, or -1 where it is absent.
int32_t inputIndex(int32_t mask, int32_t bit)
{
    return (mask & bit) == 0 ? -1 : kNbRequired + countBits(mask & (bit - 1));
}

//! Whether optional inputs kNbRequired .. pos of these types are an ordered subset of top_k, top_p,
//! allowed_tokens (each input's type says which it is).
bool optionalTypeFits(int32_t pos, nvinfer1::DataType const* types)
{
    int32_t slot = 0;
    for (int32_t i = kNbRequired; i <= pos; ++i)
    {
        while (slot < 3 && kOptional[slot].type != types[i])
        {
            ++slot;
        }
        if (slot == 3)
        {
            return false;
        }
        ++slot;
    }
    return true;
}
} // namespace

VerifyResamplePlugin::VerifyResamplePlugin(int32_t vocabSize, int32_t numSplits, int32_t returnLogprobs, int32_t optionalInputs)
    : FlashspecOpPlugin(vocabSize, numSplits, kReturnField, returnLogprobs, kInputsField, optionalInputs)
{
}

int32_t VerifyResamplePlugin::resolveOptionalInputs(nvinfer1::DataType const* types, int32_t nbInputs) const noexcept
{
    int32_t const mask = optionalInputsOf(types, nbInputs);
    if (mask < 0)
    {
        logError("VerifyResample: inputs 7 to %d must be some of top_k (int64), top_p (float), allowed_tokens "
                 "(int32), in this order; got %d inputs",
            kMostInputs, nbInputs);
        return -1;
    }
    if (mOptionalInputs >= 0 && mask != mOptionalInputs)
    {
        logError("VerifyResample: field optional_inputs is %d, the inputs are %d", mOptionalInputs, mask);
        return -1;
    }
    return mask;
}

int32_t VerifyResamplePlugin::getOutputDataTypes(
    nvinfer1::DataType* outputTypes, int32_t nbOutputs, nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept
{
    if (nbOutputs != getNbOutputs() || resolveOptionalInputs(inputTypes, nbInputs) < 0)
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
    if (nbInputs < kNbRequired || nbInputs > kMostInputs || nbOutputs != getNbOutputs() || inputs[kHidden].nbDims != 3
        || inputs[kLmHead].nbDims != 2 || inputs[kDrafts].nbDims != 2)
    {
        logError("VerifyResample: expected hidden [N, R, H], lm_head [V, H], draft_tokens [N, R - 1], and 6 to 9 inputs");
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
    int32_t pos, DynamicPluginTensorDesc const* inOut, int32_t nbInputs, int32_t /* nbOutputs */) noexcept
{
    PluginTensorDesc const& desc = inOut[pos].desc;
    if (desc.format != TensorFormat::kLINEAR)
    {
        return false;
    }
    if (pos >= kNbRequired && pos < nbInputs) // an optional input: its type says which it is
    {
        nvinfer1::DataType types[kMostInputs]{};
        for (int32_t i = kNbRequired; i <= pos && i < kMostInputs; ++i)
        {
            types[i] = inOut[i].desc.type;
        }
        return pos < kMostInputs && optionalTypeFits(pos, types);
    }
    switch (pos < nbInputs ? pos : kMostInputs + pos - nbInputs)
    {
    case kHidden: return isFloatType(desc.type);
    case kLmHead: return desc.type == inOut[kHidden].desc.type;
    case kTemperature: return desc.type == nvinfer1::DataType::kFLOAT;
    case kDrafts:
    case kSeed:
    case kPositions:
    case kMostInputs + 0: // tokens
    case kMostInputs + 1: // num_emitted
        return desc.type == nvinfer1::DataType::kINT64;
    case kMostInputs + 2: return mReturnLast != 0 && desc.type == nvinfer1::DataType::kFLOAT; // logprobs
    default: return false;
    }
}

int32_t VerifyResamplePlugin::configurePlugin(
    DynamicPluginTensorDesc const* in, int32_t nbInputs, DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept
{
    nvinfer1::DataType types[kMostInputs]{};
    for (int32_t i = 0; i < nbInputs && i < kMostInputs; ++i)
    {
        types[i] = in[i].desc.type;
    }
    int32_t const mask = resolveOptionalInputs(types, nbInputs);
    if (mask < 0)
    {
        return -1;
    }
    mOptionalInputs = mask; // serialized: the engine's enqueue knows its inputs
    return FlashspecPlugin::configurePlugin(in, nbInputs, out, nbOutputs);
}

int32_t VerifyResamplePlugin::onShapeChange(
    PluginTensorDesc const* in, int32_t nbInputs, PluginTensorDesc const* /* out */, int32_t /* nbOutputs */) noexcept
{
    nvinfer1::DataType types[kMostInputs]{};
    for (int32_t i = 0; i < nbInputs && i < kMostInputs; ++i)
    {
        types[i] = in[i].type;
    }
    int32_t const mask = resolveOptionalInputs(types, nbInputs);
    if (mask < 0)
    {
        return -1;
    }
    mOptionalInputs = mask; // an engine serialized before the field: known from here on
    return 0;
}

size_t VerifyResamplePlugin::getWorkspaceSize(DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
    DynamicPluginTensorDesc const* /* outputs */, int32_t /* nbOutputs */) const noexcept
{
    // Every shape <= max, with the split count enqueue launches; top-k / top-p add the per-split
    // candidates and the exact recompute's [rows, V] fp32 logits.
    int64_t const maxRows = inputs[kHidden].max.d[0] * inputs[kHidden].max.d[1];
    auto const hiddenSize = static_cast<int32_t>(inputs[kHidden].max.d[2]);
    nvinfer1::DataType types[kMostInputs]{};
    for (int32_t i = 0; i < nbInputs && i < kMostInputs; ++i)
    {
        types[i] = inputs[i].desc.type;
    }
    int32_t const mask = optionalInputsOf(types, nbInputs);
    if (mask > 0 && (mask & (kTopK | kTopP)) != 0)
    {
        return getVerifyResampleTruncatedWorkspaceSize(static_cast<int32_t>(maxRows), workspaceSplits(), hiddenSize, mVocabSize);
    }
    return getVerifyResampleWorkspaceSize(static_cast<int32_t>(maxRows), workspaceSplits(), hiddenSize);
}

int32_t VerifyResamplePlugin::enqueue(PluginTensorDesc const* inputDesc, PluginTensorDesc const* /* outputDesc */,
    void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept
{
    int32_t const mask = mOptionalInputs > 0 ? mOptionalInputs : 0;
    int32_t const nbInputs = kNbRequired + countBits(mask);
    Dims const& hidden = inputDesc[kHidden].dims;
    Dims const* dims[kMostInputs];
    for (int32_t i = 0; i < nbInputs; ++i)
    {
        dims[i] = &inputDesc[i].dims;
    }
    if (!shapesFit(dims, nbInputs)) // TensorRT's shape inference cannot catch these: no output
    {                               // depends on H of lm_head, the per-sequence lengths or the mask's
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
    // The optional inputs present (nullptr: off), where the mask places them.
    int32_t const topK = inputIndex(mask, kTopK);
    int32_t const topP = inputIndex(mask, kTopP);
    int32_t const allowed = inputIndex(mask, kAllowedTokens);
    params.topK = topK >= 0 ? static_cast<int64_t const*>(inputs[topK]) : nullptr;
    params.topP = topP >= 0 ? static_cast<float const*>(inputs[topP]) : nullptr;
    params.allowedTokens = allowed >= 0 ? static_cast<int32_t const*>(inputs[allowed]) : nullptr;
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
