/*
 * TensorRT plugin "TiledArgmax" (namespace "flashspec", version "1"): a thin IPluginV3 adapter
 * over invokeTiledArgmax. I/O and limits: README.md beside this file.
 */
#pragma once

#include "../common/flashspecPlugin.h"

namespace flashspec
{
namespace plugin
{

class TiledArgmaxPlugin : public FlashspecOpPlugin<TiledArgmaxPlugin>
{
public:
    static constexpr char const* kName = "TiledArgmax";
    static constexpr int32_t kNbOutputs = 2;
    static constexpr char const* kReturnField = nullptr; // both outputs required
    static constexpr int32_t kOp = FLASHSPEC_OP_TILED_ARGMAX;

    TiledArgmaxPlugin(int32_t vocabSize, int32_t numSplits);

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
