#include "flashspecPlugin.h"

#include "../tiledArgmax/tiledArgmaxPlugin.h"
#include "../verifyResample/verifyResamplePlugin.h"

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
    case nvinfer1::DataType::kFLOAT: return 0;
    case nvinfer1::DataType::kHALF: return 1;
    case nvinfer1::DataType::kBF16: return 2;
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

FlashspecPlugin::FlashspecPlugin(int32_t vocabSize)
    : mVocabSize(vocabSize)
{
    mFields.emplace_back("vocab_size", &mVocabSize, nvinfer1::PluginFieldType::kINT32, 1);
    mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
    mFieldCollection.fields = mFields.data();
}

FlashspecPlugin::FlashspecPlugin(FlashspecPlugin const& other)
    : FlashspecPlugin(other.mVocabSize)
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

int32_t FlashspecPlugin::configurePlugin(nvinfer1::DynamicPluginTensorDesc const* /* in */, int32_t /* nbInputs */,
    nvinfer1::DynamicPluginTensorDesc const* /* out */, int32_t /* nbOutputs */) noexcept
{
    return 0;
}

int32_t FlashspecPlugin::onShapeChange(nvinfer1::PluginTensorDesc const* /* in */, int32_t /* nbInputs */,
    nvinfer1::PluginTensorDesc const* /* out */, int32_t /* nbOutputs */) noexcept
{
    return 0;
}

nvinfer1::IPluginV3* FlashspecPlugin::attachToContext(nvinfer1::IPluginResourceContext* /* context */) noexcept
{
    return clone();
}

nvinfer1::PluginFieldCollection const* FlashspecPlugin::getFieldsToSerialize() noexcept
{
    return &mFieldCollection;
}

} // namespace plugin
} // namespace flashspec

// Entry points TensorRT looks for when it loads this library (trtexec --dynamicPlugins,
// IPluginRegistry::loadLibrary, polygraphy --plugins).
extern "C"
{

__attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    flashspec::plugin::setLoggerFinder(finder);
}

__attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    nbCreators = 0;
    return flashspec::plugin::guarded<nvinfer1::IPluginCreatorInterface* const*>("getCreators", nullptr, [&] {
        static flashspec::plugin::FlashspecPluginCreator<flashspec::plugin::TiledArgmaxPlugin> tiledArgmax;
        static flashspec::plugin::FlashspecPluginCreator<flashspec::plugin::VerifyResamplePlugin> verifyResample;
        static nvinfer1::IPluginCreatorInterface* const creators[] = {&tiledArgmax, &verifyResample};
        nbCreators = 2;
        return creators;
    });
}

} // extern "C"
