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
    static constexpr int32_t kOp = FLASHSPEC_OP_VERIFY_RESAMPLE;

    VerifyResamplePlugin(int32_t vocabSize, int32_t numSplits, int32_t returnLogprobs = 1);

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
};

} // namespace plugin
} // namespace flashspec
