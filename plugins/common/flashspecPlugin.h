/*
 * The shared part of the FlashSpec TensorRT plugins (IPluginV3, "one" capability set): the
 * namespace / version, the one attribute `vocab_size`, serialization and the creator. Each op's
 * plugin adds only its I/O contract and its enqueue (a call to invoke<Op>). Built only where
 * TensorRT headers exist (CMake option TENSORRT_INCLUDE_DIR).
 */
#pragma once

#include "flashspecKernels.h"

#include <NvInferRuntime.h>

#include <cstdint>
#include <cstring>
#include <exception>
#include <vector>

namespace flashspec
{
namespace plugin
{

constexpr char const* kNamespace = "flashspec";
constexpr char const* kVersion = "1";

//! The kernels' dtype code of a TensorRT type, or -1.
int32_t kernelDtype(nvinfer1::DataType type) noexcept;
bool isFloatType(nvinfer1::DataType type) noexcept;
//! printf-style error to TensorRT's logger; formats into a fixed buffer, so it never allocates.
void logError(char const* format, ...) noexcept __attribute__((format(printf, 1, 2)));
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;

//! The exception barrier of a noexcept entry point that may allocate: f()'s result, or
//! `fallback` with the exception logged (nothing escapes into TensorRT).
template <typename R, typename F>
R guarded(char const* where, R fallback, F&& f) noexcept
{
    try
    {
        return f();
    }
    catch (std::exception const& e)
    {
        logError("%s: %s", where, e.what());
    }
    catch (...)
    {
        logError("%s: unknown exception", where);
    }
    return fallback;
}

class FlashspecPlugin : public nvinfer1::IPluginV3,
                        public nvinfer1::IPluginV3OneCore,
                        public nvinfer1::IPluginV3OneBuild,
                        public nvinfer1::IPluginV3OneRuntime
{
public:
    explicit FlashspecPlugin(int32_t vocabSize);
    FlashspecPlugin(FlashspecPlugin const& other);
    FlashspecPlugin& operator=(FlashspecPlugin const&) = delete;
    ~FlashspecPlugin() override = default;

    // IPluginV3
    nvinfer1::IPluginCapability* getCapabilityInterface(nvinfer1::PluginCapabilityType type) noexcept override;

    // IPluginV3OneCore
    char const* getPluginVersion() const noexcept override;
    char const* getPluginNamespace() const noexcept override;

    // IPluginV3OneBuild
    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;

    // IPluginV3OneRuntime
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;
    nvinfer1::IPluginV3* attachToContext(nvinfer1::IPluginResourceContext* context) noexcept override;
    nvinfer1::PluginFieldCollection const* getFieldsToSerialize() noexcept override;

protected:
    int32_t mVocabSize;

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

//! What every op's plugin P derives from: the clone / name / output count TensorRT asks for,
//! from P::kName and P::kNbOutputs.
template <typename P>
class FlashspecOpPlugin : public FlashspecPlugin
{
public:
    using FlashspecPlugin::FlashspecPlugin;

    nvinfer1::IPluginV3* clone() noexcept override
    {
        return guarded<nvinfer1::IPluginV3*>(P::kName, nullptr, [&] { return new P(static_cast<P const&>(*this)); });
    }
    char const* getPluginName() const noexcept override
    {
        return P::kName;
    }
    int32_t getNbOutputs() const noexcept override
    {
        return P::kNbOutputs;
    }
};

//! Creator of a plugin class P (P::kName, P(int32_t vocabSize)): reads `vocab_size` (INT32 or
//! INT64, as the ONNX parser or a serialized engine hands it over).
template <typename P>
class FlashspecPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    FlashspecPluginCreator()
    {
        mFields.emplace_back("vocab_size", nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
        mFieldCollection.fields = mFields.data();
    }

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override
    {
        int64_t vocabSize = -1;
        for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
        {
            nvinfer1::PluginField const& field = fc->fields[i];
            if (field.name == nullptr || std::strcmp(field.name, "vocab_size") != 0 || field.length != 1)
            {
                continue;
            }
            if (field.type == nvinfer1::PluginFieldType::kINT32)
            {
                vocabSize = *static_cast<int32_t const*>(field.data);
            }
            else if (field.type == nvinfer1::PluginFieldType::kINT64)
            {
                vocabSize = *static_cast<int64_t const*>(field.data);
            }
        }
        if (vocabSize <= 0 || vocabSize > INT32_MAX)
        {
            logError("%s: attribute vocab_size must be an integer in [1, 2^31), got %lld", P::kName,
                static_cast<long long>(vocabSize));
            return nullptr;
        }
        (void) name;
        (void) phase;
        return guarded<nvinfer1::IPluginV3*>(
            P::kName, nullptr, [&] { return new P(static_cast<int32_t>(vocabSize)); });
    }

    nvinfer1::PluginFieldCollection const* getFieldNames() noexcept override
    {
        return &mFieldCollection;
    }
    char const* getPluginName() const noexcept override
    {
        return P::kName;
    }
    char const* getPluginVersion() const noexcept override
    {
        return kVersion;
    }
    char const* getPluginNamespace() const noexcept override
    {
        return kNamespace;
    }

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

} // namespace plugin
} // namespace flashspec
