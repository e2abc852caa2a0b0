#include "flashspecPlugin.h"

#include <algorithm>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <mutex>

namespace flashspec
{
namespace plugin
{
namespace
{
nvinfer1::ILoggerFinder* gLoggerFinder{nullptr};
std::mutex gLoggerMutex;
} // namespace

int32_t kernelDtype(nvinfer1::DataType type) noexcept
{
    switch (type)
    {
    case nvinfer1::DataType::kFLOAT: return FLASHSPEC_FLOAT32;
    case nvinfer1::DataType::kHALF: return FLASHSPEC_FLOAT16;
    case nvinfer1::DataType::kBF16: return FLASHSPEC_BFLOAT16;
    default: return -1;
    }
}

bool isFloatType(nvinfer1::DataType type) noexcept
{
    return kernelDtype(type) >= 0;
}

void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept
{
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    gLoggerFinder = finder;
}

void logError(char const* format, ...) noexcept
{
    char message[512] = "flashspec: ";
    size_t const prefix = std::strlen(message);
    va_list args;
    va_start(args, format);
    std::vsnprintf(message + prefix, sizeof(message) - prefix, format, args);
    va_end(args);
    std::lock_guard<std::mutex> lock(gLoggerMutex);
    nvinfer1::ILogger* logger = gLoggerFinder != nullptr ? gLoggerFinder->findLogger() : nullptr;
    if (logger != nullptr)
    {
        logger->log(nvinfer1::ILogger::Severity::kERROR, message);
    }
}

void logLaunchError(char const* op, cudaError_t status) noexcept
{
    if (status == cudaErrorStreamCaptureUnsupported)
    {
        logError("%s: %s: its compiled kernels are not loaded in this CUDA context and are never loaded during "
                 "CUDA-graph capture; create the execution context on this CUDA context, or run enqueueV3 once, "
                 "before capturing",
            op, cudaGetErrorString(status));
        return;
    }
    logError("%s: %s", op, cudaGetErrorString(status));
}

FlashspecPlugin::FlashspecPlugin(int32_t vocabSize, int32_t numSplits, char const* returnField, int32_t returnLast,
    char const* inputsField, int32_t optionalInputs)
    : mVocabSize(vocabSize)
    , mNumSplits(numSplits)
    , mReturnField(returnField)
    , mReturnLast(returnField != nullptr ? returnLast : 1)
    , mInputsField(inputsField)
    , mOptionalInputs(inputsField != nullptr ? optionalInputs : 0)
{
    mFields.emplace_back("vocab_size", &mVocabSize, nvinfer1::PluginFieldType::kINT32, 1);
    mFields.emplace_back("num_splits", &mNumSplits, nvinfer1::PluginFieldType::kINT32, 1);
    if (mReturnField != nullptr)
    {
        mFields.emplace_back(mReturnField, &mReturnLast, nvinfer1::PluginFieldType::kINT32, 1);
    }
    if (mInputsField != nullptr)
    {
        mFields.emplace_back(mInputsField, &mOptionalInputs, nvinfer1::PluginFieldType::kINT32, 1);
    }
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

FlashspecPlugin::FlashspecPlugin(FlashspecPlugin const& other)
    : FlashspecPlugin(other.mVocabSize, other.mNumSplits, other.mReturnField, other.mReturnLast, other.mInputsField,
        other.mOptionalInputs)
{
}

nvinfer1::IPluginCapability* FlashspecPlugin::getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept
{
    switch (type)
    {
    case nvinfer1::PluginCapabilityType::kBUILD: return static_cast<nvinfer1::IPluginV3OneBuild*>(this);
    case nvinfer1::PluginCapabilityType::kRUNTIME: return static_cast<nvinfer1::IPluginV3OneRuntime*>(this);
    case nvinfer1::PluginCapabilityType::kCORE: return static_cast<nvinfer1::IPluginV3OneCore*>(this);
    }
    return nullptr;
}

char const* FlashspecPlugin::getPluginVersion() const noexcept
{
    return kVersion;
}

char const* FlashspecPlugin::getPluginNamespace() const noexcept
{
    return kNamespace;
}

bool FlashspecPlugin::shapesFit(nvinfer1::Dims const* const* dims, int32_t nbInputs) const noexcept
{
    TensorShape shapes[kMaxOpInputs]{};
    for (int32_t i = 0; i < nbInputs && i < kMaxOpInputs; ++i)
    {
        shapes[i].nbDims = std::min(dims[i]->nbDims, 8);
        for (int32_t j = 0; j < shapes[i].nbDims; ++j)
        {
            shapes[i].d[j] = dims[i]->d[j];
        }
    }
    char message[256] = "";
    if (checkShapes(kernelOp(), shapes, std::min(nbInputs, kMaxOpInputs + 1), mVocabSize, message, sizeof(message)) != 0)
    {
        logError("%s", message);
        return false;
    }
    return true;
}

int32_t FlashspecPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
    nvinfer1::DynamicPluginTensorDesc const* /* out */, int32_t /* nbOutputs */) noexcept
{
    nvinfer1::Dims const* dims[kMaxOpInputs]{};
    for (int32_t i = 0; i < nbInputs && i < kMaxOpInputs; ++i)
    {
        dims[i] = &in[i].desc.dims;
    }
    if (!shapesFit(dims, nbInputs))
    {
        return -1;
    }
    // The builder's timing runs enqueue: the kernels are loaded here, outside any capture. A
    // failure (no GPU: a CPU-only builder) is enqueue's to report.
    static_cast<void>(prepareKernels());
    // The split count is fixed here, at build time, for the largest shape of the profile (input 0
    // is hidden [..., H]: its leading dims are the rows), and serialized with the plugin: the
    // workspace and every enqueue use this one value on whatever GPU runs the engine (the same
    // splits, the same log-probabilities to the last ulp).
    if (mNumSplits > 0 || nbInputs < 1 || in[0].max.nbDims < 2)
    {
        return 0;
    }
    nvinfer1::Dims const& max = in[0].max;
    int64_t rows = 1;
    for (int32_t i = 0; i + 1 < max.nbDims; ++i)
    {
        rows *= max.d[i];
    }
    int32_t const dtype = kernelDtype(in[0].desc.type);
    if (rows <= 0 || rows > INT32_MAX || dtype < 0)
    {
        return 0; // shapes TensorRT has not bounded yet: enqueue resolves the splits
    }
    mNumSplits = resolveNumSplits(splitsOp(),
        static_cast<int32_t>(rows), static_cast<int32_t>(max.d[max.nbDims - 1]), mVocabSize, dtype, 0);
    return 0;
}

int32_t FlashspecPlugin::workspaceSplits() const noexcept
{
    // Unresolved (0): the bound of the count enqueue may resolve on any GPU.
    return mNumSplits > 0 ? mNumSplits : maxNumSplits(mVocabSize);
}

int32_t FlashspecPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* /* in */, int32_t /* nbInputs */,
    nvinfer1::PluginTensorDesc const* /* out */, int32_t /* nbOutputs */) noexcept
{
    return 0;
}

nvinfer1::IPluginV3* FlashspecPlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    // A new execution context, on the CUDA context it will run in: the kernels are loaded here, not
    // in an enqueue that may be captured into a CUDA graph. (onShapeChange is no such place:
    // TensorRT calls it from inside enqueueV3.) A failure is enqueue's to report; it loads them
    // outside capture or refuses (prepareKernels).
    static_cast<void>(prepareKernels());
    return clone();
}

nvinfer1::PluginFieldCollection const* FlashspecPlugin::getFieldsToSerialize() noexcept
{
    return &mFieldCollection;
}

} // namespace plugin
} // namespace flashspec
