/*
 * Host-side self-test of the TensorRT adapters, built with the plugins (needs only TensorRT's
 * headers, no TensorRT library and no GPU): the creators TensorRT finds through getCreators,
 * the attribute handling, and each plugin's I/O contract as TensorRT queries it at build time.
 * Prints one line per check; exit status 0 when all pass.
 */
#include "../common/flashspecPlugin.h"

#include <cstdio>
#include <cstring>
#include <string>

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

using namespace nvinfer1;

namespace
{
int gFailures = 0;

void check(bool ok, std::string const& what)
{
    std::printf("%s %s\n", ok ? "PASS" : "FAIL", what.c_str());
    gFailures += ok ? 0 : 1;
}

IPluginCreatorV3One* creator(char const* name)
{
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    for (int32_t i = 0; i < count; ++i)
    {
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (std::strcmp(c->getPluginName(), name) == 0)
        {
            return c;
        }
    }
    return nullptr;
}

IPluginV3* create(IPluginCreatorV3One* c, int64_t vocab, PluginFieldType type)
{
    int32_t v32 = static_cast<int32_t>(vocab);
    PluginField field("vocab_size", type == PluginFieldType::kINT32 ? static_cast<void const*>(&v32) : &vocab, type, 1);
    PluginFieldCollection fc{1, &field};
    return c->createPlugin("node", &fc, TensorRTPhase::kBUILD);
}

DynamicPluginTensorDesc desc(DataType type)
{
    DynamicPluginTensorDesc d{};
    d.desc.type = type;
    d.desc.format = TensorFormat::kLINEAR;
    return d;
}

//! Does the plugin accept exactly these types at every position (and refuse a wrong one)?
bool accepts(IPluginV3OneBuild* build, std::initializer_list<DataType> types, int32_t nbInputs)
{
    std::vector<DynamicPluginTensorDesc> io;
    for (DataType t : types)
    {
        io.push_back(desc(t));
    }
    int32_t const nbOutputs = static_cast<int32_t>(io.size()) - nbInputs;
    for (int32_t pos = 0; pos < static_cast<int32_t>(io.size()); ++pos)
    {
        if (!build->supportsFormatCombination(pos, io.data(), nbInputs, nbOutputs))
        {
            return false;
        }
    }
    return true;
}

void checkCommon(char const* name, int32_t nbOutputs)
{
    IPluginCreatorV3One* c = creator(name);
    check(c != nullptr, std::string(name) + ": getCreators lists it");
    if (c == nullptr)
    {
        return;
    }
    check(std::strcmp(c->getPluginNamespace(), "flashspec") == 0 && std::strcmp(c->getPluginVersion(), "1") == 0,
        std::string(name) + ": namespace flashspec, version 1 (the ONNX node's plugin attributes)");
    check(create(c, 0, PluginFieldType::kINT32) == nullptr, std::string(name) + ": vocab_size 0 is refused");
    check(create(c, int64_t{1} << 31, PluginFieldType::kINT64) == nullptr,
        std::string(name) + ": vocab_size 2^31 is refused");
    IPluginV3* plugin = create(c, 1000, PluginFieldType::kINT64);
    check(plugin != nullptr, std::string(name) + ": created from an INT64 vocab_size");
    if (plugin == nullptr)
    {
        return;
    }
    auto* core = static_cast<IPluginV3OneCore*>(plugin->getCapabilityInterface(PluginCapabilityType::kCORE));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    check(std::strcmp(core->getPluginName(), name) == 0, std::string(name) + ": core capability names it");
    PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    check(fields->nbFields == 1 && std::strcmp(fields->fields[0].name, "vocab_size") == 0
            && *static_cast<int32_t const*>(fields->fields[0].data) == 1000,
        std::string(name) + ": serializes vocab_size = 1000");
    IPluginV3* restored = c->createPlugin("node", fields, TensorRTPhase::kRUNTIME);
    check(restored != nullptr, std::string(name) + ": deserializes from its own fields");
    check(build->getNbOutputs() == nbOutputs, std::string(name) + ": output count");
    IPluginV3* copy = plugin->clone();
    check(copy != nullptr && copy != plugin, std::string(name) + ": clones");
    delete copy;
    delete restored;
    delete plugin;
}

IPluginV3OneBuild* buildOf(char const* name)
{
    IPluginV3* plugin = create(creator(name), 1000, PluginFieldType::kINT32);
    return static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
}
} // namespace

int main()
{
    checkCommon("TiledArgmax", 2);
    checkCommon("VerifyResample", 3);

    IPluginV3OneBuild* argmax = buildOf("TiledArgmax");
    DataType outTypes[3];
    DataType const argmaxIn[2] = {DataType::kBF16, DataType::kBF16};
    check(argmax->getOutputDataTypes(outTypes, 2, argmaxIn, 2) == 0 && outTypes[0] == DataType::kINT64
            && outTypes[1] == DataType::kFLOAT,
        "TiledArgmax: outputs int64 token, float max_logit");
    for (DataType t : {DataType::kFLOAT, DataType::kHALF, DataType::kBF16})
    {
        check(accepts(argmax, {t, t, DataType::kINT64, DataType::kFLOAT}, 2), "TiledArgmax: accepts a float type pair");
    }
    check(!accepts(argmax, {DataType::kHALF, DataType::kBF16, DataType::kINT64, DataType::kFLOAT}, 2),
        "TiledArgmax: refuses hidden and lm_head of different types");
    check(!accepts(argmax, {DataType::kINT8, DataType::kINT8, DataType::kINT64, DataType::kFLOAT}, 2),
        "TiledArgmax: refuses int8");

    IPluginV3OneBuild* verify = buildOf("VerifyResample");
    DataType const verifyIn[6] = {DataType::kBF16, DataType::kBF16, DataType::kINT64, DataType::kFLOAT,
        DataType::kINT64, DataType::kINT64};
    check(verify->getOutputDataTypes(outTypes, 3, verifyIn, 6) == 0 && outTypes[0] == DataType::kINT64
            && outTypes[1] == DataType::kINT64 && outTypes[2] == DataType::kFLOAT,
        "VerifyResample: outputs int64 tokens, int64 num_emitted, float logprobs");
    check(accepts(verify,
              {DataType::kHALF, DataType::kHALF, DataType::kINT64, DataType::kFLOAT, DataType::kINT64, DataType::kINT64,
                  DataType::kINT64, DataType::kINT64, DataType::kFLOAT},
              6),
        "VerifyResample: accepts the schema's I/O types (fp16)");
    check(!accepts(verify,
              {DataType::kHALF, DataType::kHALF, DataType::kINT32, DataType::kFLOAT, DataType::kINT64, DataType::kINT64,
                  DataType::kINT64, DataType::kINT64, DataType::kFLOAT},
              6),
        "VerifyResample: refuses int32 draft tokens");
    check(!accepts(verify,
              {DataType::kHALF, DataType::kHALF, DataType::kINT64, DataType::kHALF, DataType::kINT64, DataType::kINT64,
                  DataType::kINT64, DataType::kINT64, DataType::kFLOAT},
              6),
        "VerifyResample: refuses a half temperature");
    std::printf("%d failure(s)\n", gFailures);
    return gFailures == 0 ? 0 : 1;
}
