/*
 * The entry points TensorRT looks for when it loads libflashspec_plugins.so (trtexec
 * --dynamicPlugins, IPluginRegistry::loadLibrary): the creator of every FlashSpec plugin, one per
 * op of flashspec_export/ops/specs.py (tests/test_op_faces.py checks the list against the specs),
 * and the logger hook.
 */
#include "../common/flashspecPlugin.h"
#include "../tiledArgmax/tiledArgmaxPlugin.h"
#include "../verifyResample/verifyResamplePlugin.h"

extern "C"
{

__attribute__((visibility("default"))) void setLoggerFinder(nvinfer1::ILoggerFinder* finder)
{
    flashspec::plugin::setLoggerFinder(finder);
}

__attribute__((visibility("default"))) nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators)
{
    using flashspec::plugin::FlashspecPluginCreator;
    nbCreators = 0;
    return flashspec::plugin::guarded<nvinfer1::IPluginCreatorInterface* const*>("getCreators", nullptr, [&] {
        static FlashspecPluginCreator<flashspec::plugin::TiledArgmaxPlugin> tiledArgmax;
        static FlashspecPluginCreator<flashspec::plugin::VerifyResamplePlugin> verifyResample;
        static nvinfer1::IPluginCreatorInterface* const creators[] = {&tiledArgmax, &verifyResample};
        nbCreators = static_cast<int32_t>(sizeof(creators) / sizeof(creators[0]));
        return creators;
    });
}

} // extern "C"
