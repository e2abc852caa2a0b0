/*
 * TensorRT plugin "VerifyResample" (namespace "flashspec", version "1"): a thin IPluginV3 adapter
 * over invokeVerifyResample. I/O and limits: README.md beside this file.
 */
#pragma once

#include "../common/flashspecPlugin.h"

namespace flashspec
{
namespace plugin
{

class VerifyResamplePlugin : public FlashspecOpPlugin<VerifyResamplePlugin>
{
public:
    static constexpr char const* kName = "VerifyResample";
    static constexpr int32_t kNbOutputs = 3; // with logprobs
    //! 0: no logprobs output, and the kernels skip the log-sum-exp (the ONNX node's attribute,
    //! set when the node leaves logprobs out; absent: 1)
    static constexpr char const* kReturnField = "return_logprobs";
    //! Which of the optional inputs top_k, top_p, allowed_tokens (after positions, in this order)
    //! the node has: a mask of kTopK | kTopP | kAllowedTokens. The ONNX node may carry it; else (-1)
    //! it is read off the inputs TensorRT describes (their count and types: int64 top_k, float
    //! top_p, int32 allowed_tokens) in configurePlugin, and serialized with the engine.
    static constexpr char const* kInputsField = "optional_inputs";
    static constexpr int32_t kTopK = 1;
    static constexpr int32_t kTopP = 2;
    static constexpr int32_t kAllowedTokens = 4;
    static constexpr int32_t kOptionalInputsMask = kTopK | kTopP | kAllowedTokens;
    static constexpr int32_t kOp = FLASHSPEC_OP_VERIFY_RESAMPLE;

    VerifyResamplePlugin(int32_t vocabSize, int32_t numSplits, int32_t returnLogprobs = 1, int32_t optionalInputs = -1);

    //! The mask of optional inputs that inputs 6 .. nbInputs - 1 of these types are (types of the
    //! first nbInputs inputs), or -1 where they are no ordered subset of top_k (int64), top_p
    //! (float), allowed_tokens (int32).
    static int32_t optionalInputsOf(nvinfer1::DataType const* types, int32_t nbInputs) noexcept
    {
        constexpr nvinfer1::DataType kTypes[3] = {nvinfer1::DataType::kINT64, nvinfer1::DataType::kFLOAT,
            nvinfer1::DataType::kINT32}; // of top_k, top_p, allowed_tokens (bits 0, 1, 2)
        if (nbInputs < 6 || nbInputs > 9)
        {
            return -1;
        }
        int32_t mask = 0;
        int32_t slot = 0;
        for (int32_t i = 6; i < nbInputs; ++i)
        {
            while (slot < 3 && kTypes[slot] != types[i])
            {
                ++slot;
            }
            if (slot == 3)
            {
                return -1;
            }
            mask |= 1 << slot++;
        }
        return mask;
    }

    int32_t configurePlugin(nvinfer1::DynamicPluginTensorDesc const* in, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* out, int32_t nbOutputs) noexcept override;
    int32_t onShapeChange(nvinfer1::PluginTensorDesc const* in, int32_t nbInputs, nvinfer1::PluginTensorDesc const* out,
        int32_t nbOutputs) noexcept override;

    int32_t getOutputDataTypes(nvinfer1::DataType* outputTypes, int32_t nbOutputs,
        nvinfer1::DataType const* inputTypes, int32_t nbInputs) const noexcept override;
    int32_t getOutputShapes(nvinfer1::DimsExprs const* inputs, int32_t nbInputs, nvinfer1::DimsExprs const* shapeInputs,
        int32_t nbShapeInputs, nvinfer1::DimsExprs* outputs, int32_t nbOutputs,
        nvinfer1::IExprBuilder& exprBuilder) noexcept override;
    bool supportsFormatCombination(int32_t pos, nvinfer1::DynamicPluginTensorDesc const* inOut, int32_t nbInputs,
        int32_t nbOutputs) noexcept override;
    size_t getWorkspaceSize(nvinfer1::DynamicPluginTensorDesc const* inputs, int32_t nbInputs,
        nvinfer1::DynamicPluginTensorDesc const* outputs, int32_t nbOutputs) const noexcept override;
    int32_t enqueue(nvinfer1::PluginTensorDesc const* inputDesc, nvinfer1::PluginTensorDesc const* outputDesc,
        void const* const* inputs, void* const* outputs, void* workspace, cudaStream_t stream) noexcept override;

protected:
    //! With top_k or top_p inputs the truncating launch table fixes the split count.
    int32_t splitsOp() const noexcept override
    {
        return mOptionalInputs > 0 && (mOptionalInputs & (kTopK | kTopP)) != 0 ? FLASHSPEC_OP_VERIFY_TRUNCATED : kOp;
    }

private:
    //! The mask of these inputs (optionalInputsOf), checked against the field where it is set; -1
    //! with the error logged where they do not fit.
    int32_t resolveOptionalInputs(nvinfer1::DataType const* types, int32_t nbInputs) const noexcept;
};

} // namespace plugin
} // namespace flashspec
