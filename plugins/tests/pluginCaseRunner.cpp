/*
 * Runs a FlashSpec plugin the way a TensorRT engine with a dynamic profile does, on inputs a test
 * wrote to files, and writes its outputs back: tests/test_trt_plugins.py compares them with the
 * PyTorch reference (no TensorRT library is needed, only its headers; a CUDA device is).
 *
 *   pluginCaseRunner DIR
 *
 * DIR/cases.txt (one item per line):
 *   op VerifyResample | TiledArgmax
 *   dtype float32 | float16 | bfloat16     (hidden and lm_head)
 *   hidden H
 *   vocab V padded P                        (lm_head is DIR/lm_head.bin, [P, H])
 *   profile N R                             (the largest shape: N sequences of R = gamma + 1 rows;
 *                                            TiledArgmax: N rows, R = 1)
 *   case NAME N R                           (one per shape, in DIR/NAME/)
 *   optional K                              (VerifyResample, optional: its first K of top_k, top_p,
 *                                            allowed_tokens as inputs; default 0)
 * Inputs per case (raw little-endian arrays): hidden.bin [N, R, H] (TiledArgmax [N, H]) and, for
 * VerifyResample, draft_tokens.bin [N, R - 1] int64, temperature.bin [N] float32, seed.bin and
 * positions.bin [N] int64, then top_k.bin [N] int64, top_p.bin [N] float32 and allowed_tokens.bin
 * [N, R, ceil(V / 32)] int32 as `optional` asks. Outputs: VerifyResample tokens.bin [N, R] int64, num_emitted.bin [N]
 * int64, logprobs.bin [N, R] float32; TiledArgmax token.bin [N] int64, max_logit.bin [N] float32.
 *
 * As TensorRT does: the plugin is created for the build, configured with the profile's ranges
 * (min 1 for N and R), its workspace sized for them; its serialized fields create the runtime
 * plugin, attached to an execution context; each case then runs onShapeChange and enqueue at its
 * own shape with the one workspace. Exit status 0 when every enqueue succeeded.
 */
#include "../common/flashspecPlugin.h"

#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <vector>

extern "C" nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators);

using namespace nvinfer1;

namespace
{

struct Case
{
    std::string name;
    int64_t n;
    int64_t rows;
};

struct Spec
{
    std::string op;
    DataType dtype = DataType::kFLOAT;
    int64_t hidden = 0;
    int64_t vocab = 0;
    int64_t padded = 0;
    int64_t maxN = 0;
    int64_t maxRows = 0;
    int32_t optional = 0; // VerifyResample: how many of top_k, top_p, allowed_tokens it takes
    std::vector<Case> cases;
};

[[noreturn]] void fail(std::string const& what)
{
    std::fprintf(stderr, "pluginCaseRunner: %s\n", what.c_str());
    std::exit(2);
}

Spec readSpec(std::string const& dir)
{
    std::ifstream file(dir + "/cases.txt");
    if (!file)
    {
        fail(dir + "/cases.txt: cannot be read");
    }
    Spec spec;
    std::string line;
    while (std::getline(file, line))
    {
        std::istringstream words(line);
        std::string key;
        words >> key;
        if (key == "op")
        {
            words >> spec.op;
        }
        else if (key == "dtype")
        {
            std::string name;
            words >> name;
            spec.dtype = name == "bfloat16" ? DataType::kBF16 : name == "float16" ? DataType::kHALF : DataType::kFLOAT;
        }
        else if (key == "hidden")
        {
            words >> spec.hidden;
        }
        else if (key == "vocab")
        {
            std::string padded;
            words >> spec.vocab >> padded >> spec.padded;
        }
        else if (key == "profile")
        {
            words >> spec.maxN >> spec.maxRows;
        }
        else if (key == "optional")
        {
            words >> spec.optional;
        }
        else if (key == "case")
        {
            Case c;
            words >> c.name >> c.n >> c.rows;
            spec.cases.push_back(c);
        }
    }
    if (spec.hidden <= 0 || spec.vocab <= 0 || spec.padded < spec.vocab || spec.maxN <= 0 || spec.cases.empty()
        || spec.optional < 0 || spec.optional > 3)
    {
        fail(dir + "/cases.txt: needs op, hidden, vocab .. padded .., profile and at least one case");
    }
    return spec;
}

//! A device buffer holding the bytes of `path` (which must hold exactly `bytes`).
void* deviceFile(std::string const& path, size_t bytes)
{
    std::ifstream file(path, std::ios::binary);
    std::vector<char> host((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
    if (!file.good() && !file.eof())
    {
        fail(path + ": cannot be read");
    }
    if (host.size() != bytes)
    {
        fail(path + ": " + std::to_string(host.size()) + " bytes, expected " + std::to_string(bytes));
    }
    void* device = nullptr;
    cudaMalloc(&device, bytes);
    cudaMemcpy(device, host.data(), bytes, cudaMemcpyHostToDevice);
    return device;
}

void writeDevice(std::string const& path, void const* device, size_t bytes)
{
    std::vector<char> host(bytes);
    cudaMemcpy(host.data(), device, bytes, cudaMemcpyDeviceToHost);
    std::ofstream(path, std::ios::binary).write(host.data(), static_cast<std::streamsize>(bytes));
}

Dims dims(std::initializer_list<int64_t> values)
{
    Dims d{};
    d.nbDims = static_cast<int32_t>(values.size());
    int32_t i = 0;
    for (int64_t v : values)
    {
        d.d[i++] = v;
    }
    return d;
}

PluginTensorDesc tensor(DataType type, Dims const& shape)
{
    PluginTensorDesc d{};
    d.type = type;
    d.format = TensorFormat::kLINEAR;
    d.dims = shape;
    return d;
}

DynamicPluginTensorDesc ranged(DataType type, Dims const& low, Dims const& high)
{
    DynamicPluginTensorDesc d{};
    d.desc = tensor(type, high);
    for (int32_t i = 0; i < high.nbDims; ++i)
    {
        d.desc.dims.d[i] = low.d[i] == high.d[i] ? high.d[i] : -1; // -1: dynamic, as TensorRT passes it
    }
    d.min = low;
    d.opt = high;
    d.max = high;
    return d;
}

size_t elementBytes(DataType type)
{
    return type == DataType::kFLOAT ? 4 : 2;
}

size_t typeBytes(DataType type)
{
    return type == DataType::kINT64 ? 8 : type == DataType::kFLOAT || type == DataType::kINT32 ? 4 : 2;
}

//! The op's input and output descriptors at N sequences of R rows.
void shapes(Spec const& s, int64_t n, int64_t rows, std::vector<Dims>& in, std::vector<Dims>& out)
{
    if (s.op == "TiledArgmax")
    {
        in = {dims({n, s.hidden}), dims({s.padded, s.hidden})};
        out = {dims({n}), dims({n})};
        return;
    }
    in = {dims({n, rows, s.hidden}), dims({s.padded, s.hidden}), dims({n, rows - 1}), dims({n}), dims({n}), dims({n})};
    std::vector<Dims> const optional = {dims({n}), dims({n}), dims({n, rows, (s.vocab + 31) / 32})};
    in.insert(in.end(), optional.begin(), optional.begin() + s.optional);
    out = {dims({n, rows}), dims({n}), dims({n, rows})};
}

std::vector<DataType> inputTypes(Spec const& s)
{
    if (s.op == "TiledArgmax")
    {
        return {s.dtype, s.dtype};
    }
    std::vector<DataType> types = {s.dtype, s.dtype, DataType::kINT64, DataType::kFLOAT, DataType::kINT64,
        DataType::kINT64, DataType::kINT64, DataType::kFLOAT, DataType::kINT32};
    types.resize(6 + s.optional);
    return types;
}

std::vector<DataType> outputTypes(Spec const& s)
{
    if (s.op == "TiledArgmax")
    {
        return {DataType::kINT64, DataType::kFLOAT};
    }
    return {DataType::kINT64, DataType::kINT64, DataType::kFLOAT};
}

IPluginCreatorV3One* creator(std::string const& name)
{
    int32_t count = 0;
    IPluginCreatorInterface* const* creators = getCreators(count);
    for (int32_t i = 0; i < count; ++i)
    {
        auto* c = static_cast<IPluginCreatorV3One*>(creators[i]);
        if (name == c->getPluginName())
        {
            return c;
        }
    }
    fail("no plugin named " + name);
}

size_t volume(Dims const& d)
{
    size_t v = 1;
    for (int32_t i = 0; i < d.nbDims; ++i)
    {
        v *= static_cast<size_t>(d.d[i]);
    }
    return v;
}

} // namespace

int main(int argc, char** argv)
{
    if (argc != 2)
    {
        fail("usage: pluginCaseRunner DIR");
    }
    std::string const dir = argv[1];
    Spec const spec = readSpec(dir);
    IPluginCreatorV3One* c = creator(spec.op);
    int32_t const vocab = static_cast<int32_t>(spec.vocab);
    PluginField field("vocab_size", &vocab, PluginFieldType::kINT32, 1);
    PluginFieldCollection fc{1, &field};

    // Build: the profile's ranges, the workspace for them, the serialized fields.
    IPluginV3* built = c->createPlugin("node", &fc, TensorRTPhase::kBUILD);
    if (built == nullptr)
    {
        fail("createPlugin (build) failed");
    }
    auto* build = static_cast<IPluginV3OneBuild*>(built->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* fields = static_cast<IPluginV3OneRuntime*>(built->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    std::vector<Dims> lowIn, lowOut, highIn, highOut;
    shapes(spec, 1, spec.op == "TiledArgmax" ? 1 : 2, lowIn, lowOut);
    shapes(spec, spec.maxN, spec.maxRows, highIn, highOut);
    if (spec.op != "TiledArgmax")
    {
        lowIn[0].d[1] = 1; // R = 1 (gamma 0) ... maxRows
        lowIn[2].d[1] = 0;
        if (spec.optional == 3)
        {
            lowIn[8].d[1] = 1; // allowed_tokens [N, R, words]
        }
        lowOut[0].d[1] = lowOut[2].d[1] = 1;
    }
    std::vector<DataType> const inTypes = inputTypes(spec), outTypes = outputTypes(spec);
    std::vector<DynamicPluginTensorDesc> dynIn, dynOut;
    for (size_t i = 0; i < inTypes.size(); ++i)
    {
        dynIn.push_back(ranged(inTypes[i], lowIn[i], highIn[i]));
    }
    for (size_t i = 0; i < outTypes.size(); ++i)
    {
        dynOut.push_back(ranged(outTypes[i], lowOut[i], highOut[i]));
    }
    auto const nbIn = static_cast<int32_t>(dynIn.size()), nbOut = static_cast<int32_t>(dynOut.size());
    if (build->configurePlugin(dynIn.data(), nbIn, dynOut.data(), nbOut) != 0)
    {
        fail("configurePlugin refused the profile");
    }
    size_t const workspaceBytes = build->getWorkspaceSize(dynIn.data(), nbIn, dynOut.data(), nbOut);
    IPluginV3* restored = c->createPlugin("node", fields->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
    if (restored == nullptr)
    {
        fail("createPlugin (runtime) refused the serialized fields");
    }
    auto* attached = static_cast<IPluginV3OneRuntime*>(restored->getCapabilityInterface(PluginCapabilityType::kRUNTIME))
                         ->attachToContext(nullptr);
    auto* runtime = static_cast<IPluginV3OneRuntime*>(attached->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    void* workspace = nullptr;
    cudaMalloc(&workspace, workspaceBytes > 0 ? workspaceBytes : 16);
    void* lmHead = deviceFile(dir + "/lm_head.bin", volume(highIn[1]) * elementBytes(spec.dtype));

    int failures = 0;
    for (Case const& k : spec.cases)
    {
        std::vector<Dims> in, out;
        shapes(spec, k.n, k.rows, in, out);
        std::string const at = dir + "/" + k.name + "/";
        std::vector<void const*> inputs;
        std::vector<std::string> const inNames = spec.op == "TiledArgmax"
            ? std::vector<std::string>{"hidden"}
            : std::vector<std::string>{"hidden", "", "draft_tokens", "temperature", "seed", "positions", "top_k",
                "top_p", "allowed_tokens"};
        for (size_t i = 0; i < in.size(); ++i)
        {
            size_t const bytes = volume(in[i]) * (i < 2 ? elementBytes(spec.dtype) : typeBytes(inTypes[i]));
            inputs.push_back(i == 1 ? lmHead : deviceFile(at + inNames[i == 1 ? 0 : i] + ".bin", bytes));
        }
        std::vector<void*> outputs;
        std::vector<size_t> outBytes;
        for (size_t i = 0; i < out.size(); ++i)
        {
            outBytes.push_back(volume(out[i]) * (outTypes[i] == DataType::kFLOAT ? 4 : 8));
            void* buffer = nullptr;
            cudaMalloc(&buffer, outBytes.back() > 0 ? outBytes.back() : 16);
            outputs.push_back(buffer);
        }
        std::vector<PluginTensorDesc> inDesc, outDesc;
        for (size_t i = 0; i < in.size(); ++i)
        {
            inDesc.push_back(tensor(inTypes[i], in[i]));
        }
        for (size_t i = 0; i < out.size(); ++i)
        {
            outDesc.push_back(tensor(outTypes[i], out[i]));
        }
        int32_t status = runtime->onShapeChange(inDesc.data(), nbIn, outDesc.data(), nbOut);
        if (status == 0)
        {
            status = runtime->enqueue(inDesc.data(), outDesc.data(), inputs.data(), outputs.data(), workspace, nullptr);
        }
        cudaError_t const sync = cudaDeviceSynchronize();
        bool const ok = status == 0 && sync == cudaSuccess;
        std::printf("%s %s: N %lld, R %lld%s\n", ok ? "PASS" : "FAIL", k.name.c_str(), static_cast<long long>(k.n),
            static_cast<long long>(k.rows), ok ? "" : (std::string(", ") + cudaGetErrorString(sync)).c_str());
        failures += ok ? 0 : 1;
        std::vector<std::string> const outNames = spec.op == "TiledArgmax"
            ? std::vector<std::string>{"token", "max_logit"}
            : std::vector<std::string>{"tokens", "num_emitted", "logprobs"};
        for (size_t i = 0; i < out.size(); ++i)
        {
            writeDevice(at + outNames[i] + ".bin", outputs[i], outBytes[i]);
            cudaFree(outputs[i]);
        }
        for (size_t i = 0; i < inputs.size(); ++i)
        {
            if (i != 1)
            {
                cudaFree(const_cast<void*>(inputs[i]));
            }
        }
    }
    std::printf("%d failure(s)\n", failures);
    delete attached;
    delete restored;
    delete built;
    return failures == 0 ? 0 : 1;
}
