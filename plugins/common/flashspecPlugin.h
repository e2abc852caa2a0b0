/*
 * The shared part of the FlashSpec TensorRT plugins (IPluginV3, "one" capability set): the
 * namespace / version, the fields (`vocab_size` from the ONNX node, `num_splits` fixed at build
 * time and serialized, and for an op whose last output is optional its `return_<output>` switch,
 * from the ONNX node, default 1), serialization and the creator. Each op's plugin adds only its I/O
 * contract and its enqueue (a call to invoke<Op>). The creator list is api/flashspecCreators.cpp.
 * Built only where TensorRT headers exist (CMake option TENSORRT_INCLUDE_DIR).
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
constexpr char const* kVersion = "2"; // 2: the two-level sample (ops/specs.py PLUGIN_VERSION)

//! The kernels' dtype code of a TensorRT type, or -1.
int32_t kernelDtype(nvinfer1::DataType type) noexcept;
bool isFloatType(nvinfer1::DataType type) noexcept;
//! printf-style error to TensorRT's logger; formats into a fixed buffer, so it never allocates.
void logError(char const* format, ...) noexcept __attribute__((format(printf, 1, 2)));
void setLoggerFinder(nvinfer1::ILoggerFinder* finder) noexcept;
//! The error of a failed invoke<Op> in `op`'s enqueue, with what to do where the stream was being
//! captured before the kernels were loaded into its CUDA context (prepareKernels).
void logLaunchError(char const* op, cudaError_t status) noexcept;

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
    //! returnField: the name of the 0/1 field that switches the last output off ("return_logprobs"),
    //! or nullptr for an op whose outputs are all required; returnLast: its value. inputsField: the
    //! name of the field that says which optional inputs the node has ("optional_inputs", a bit
    //! mask; -1 until the inputs are seen), or nullptr for an op without optional inputs.
    FlashspecPlugin(int32_t vocabSize, int32_t numSplits, char const* returnField = nullptr, int32_t returnLast = 1,
        char const* inputsField = nullptr, int32_t optionalInputs = -1);
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
    //! checkShapes (flashspecKernels.h) over the inputs' dims, the message logged; false if a
    //! dimension breaks the op's contract (configurePlugin: dims of the profile, -1 where dynamic;
    //! enqueue: the call's).
    bool shapesFit(nvinfer1::Dims const* const* dims, int32_t nbInputs) const noexcept;
    //! The vocabulary splits the workspace is sized for (and enqueue launches, once resolved).
    int32_t workspaceSplits() const noexcept;
    //! The op's FlashspecOp code (its launch table decides the split count).
    virtual int32_t kernelOp() const noexcept = 0;
    //! The op whose launch table fixes the split count (resolveNumSplits): kernelOp's by default.
    virtual int32_t splitsOp() const noexcept
    {
        return kernelOp();
    }

    int32_t mVocabSize;
    int32_t mNumSplits; // 0 until configurePlugin resolves it (then serialized)
    char const* mReturnField; // nullptr: every output is required
    int32_t mReturnLast;      // 0: the optional last output is not produced (nor computed)
    char const* mInputsField; // nullptr: every input is required
    int32_t mOptionalInputs;  // the optional inputs present (the op's bit mask); -1: not known yet

private:
    std::vector<nvinfer1::PluginField> mFields;
    nvinfer1::PluginFieldCollection mFieldCollection{};
};

//! What every op's plugin P derives from: the clone / name / output count / kernel op TensorRT
//! and the launch table ask for, from P::kName, P::kNbOutputs (with the optional last output),
//! P::kReturnField (the field that switches that output off, or nullptr) and P::kOp.
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
        return mReturnLast != 0 ? P::kNbOutputs : P::kNbOutputs - 1;
    }

protected:
    int32_t kernelOp() const noexcept override
    {
        return P::kOp;
    }
};

//! The integer field `name` (INT32 or INT64, one element) of fc, or `fallback` when absent.
inline int64_t intField(nvinfer1::PluginFieldCollection const* fc, char const* name, int64_t fallback) noexcept
{
    for (int32_t i = 0; fc != nullptr && i < fc->nbFields; ++i)
    {
        nvinfer1::PluginField const& field = fc->fields[i];
        if (field.name == nullptr || std::strcmp(field.name, name) != 0 || field.length != 1)
        {
            continue;
        }
        if (field.type == nvinfer1::PluginFieldType::kINT32)
        {
            return *static_cast<int32_t const*>(field.data);
        }
        if (field.type == nvinfer1::PluginFieldType::kINT64)
        {
            return *static_cast<int64_t const*>(field.data);
        }
    }
    return fallback;
}

//! Creator of a plugin class P (P::kName, P(int32_t vocabSize, int32_t numSplits), and with a
//! P::kReturnField P(vocabSize, numSplits, returnLast, optionalInputs)): reads `vocab_size`, the
//! optional `num_splits`, the optional P::kReturnField (0 or 1, default 1: an engine serialized
//! before the field existed keeps every output) and the optional P::kInputsField (a mask of
//! P::kOptionalInputsMask, or -1 / absent: taken from the inputs TensorRT describes), INT32 or
//! INT64, as the ONNX parser or a serialized engine hands them over.
template <typename P>
class FlashspecPluginCreator : public nvinfer1::IPluginCreatorV3One
{
public:
    FlashspecPluginCreator()
    {
        mFields.emplace_back("vocab_size", nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        mFields.emplace_back("num_splits", nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        if constexpr (P::kReturnField != nullptr)
        {
            mFields.emplace_back(P::kReturnField, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
            mFields.emplace_back(P::kInputsField, nullptr, nvinfer1::PluginFieldType::kINT32, 1);
        }
        mFieldCollection.nbFields = static_cast<int32_t>(mFields.size());
        mFieldCollection.fields = mFields.data();
    }

    nvinfer1::IPluginV3* createPlugin(
        char const* name, nvinfer1::PluginFieldCollection const* fc, nvinfer1::TensorRTPhase phase) noexcept override
    {
        int64_t const vocabSize = intField(fc, "vocab_size", -1);
        if (vocabSize <= 0 || vocabSize > INT32_MAX)
        {
            logError("%s: attribute vocab_size must be an integer in [1, 2^31), got %lld", P::kName,
                static_cast<long long>(vocabSize));
            return nullptr;
        }
        int64_t const numSplits = intField(fc, "num_splits", 0);
        if (numSplits < 0 || numSplits > maxNumSplits(static_cast<int32_t>(vocabSize)))
        {
            logError("%s: field num_splits must be in [0, %d] (0: resolved at build), got %lld", P::kName,
                maxNumSplits(static_cast<int32_t>(vocabSize)), static_cast<long long>(numSplits));
            return nullptr;
        }
        (void) name;
        (void) phase;
        if constexpr (P::kReturnField != nullptr)
        {
            int64_t const returnLast = intField(fc, P::kReturnField, 1);
            if (returnLast != 0 && returnLast != 1)
            {
                logError("%s: attribute %s must be 0 or 1, got %lld", P::kName, P::kReturnField,
                    static_cast<long long>(returnLast));
                return nullptr;
            }
            int64_t const optionalInputs = intField(fc, P::kInputsField, -1);
            if (optionalInputs < -1 || optionalInputs > P::kOptionalInputsMask)
            {
                logError("%s: field %s must be a mask in [0, %d] or -1 (from the inputs), got %lld", P::kName,
                    P::kInputsField, P::kOptionalInputsMask, static_cast<long long>(optionalInputs));
                return nullptr;
            }
            return guarded<nvinfer1::IPluginV3*>(P::kName, nullptr, [&] {
                return new P(static_cast<int32_t>(vocabSize), static_cast<int32_t>(numSplits),
                    static_cast<int32_t>(returnLast), static_cast<int32_t>(optionalInputs));
            });
        }
        else
        {
            return guarded<nvinfer1::IPluginV3*>(P::kName, nullptr,
                [&] { return new P(static_cast<int32_t>(vocabSize), static_cast<int32_t>(numSplits)); });
        }
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
