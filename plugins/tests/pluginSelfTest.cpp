/*
 * Self-test of the TensorRT adapters, built with the plugins (needs only TensorRT's headers, no
 * TensorRT library): the creators TensorRT finds through getCreators, the attribute handling,
 * and each plugin's I/O contract as TensorRT queries it at build time. With a CUDA device it
 * also runs each plugin's enqueue as TensorRT would (descriptors, workspace from
 * getWorkspaceSize) and checks its outputs equal a direct invoke<Op> call on the same inputs:
 * the adapter's plumbing (the kernels themselves are tested against the reference in Python).
 * Prints one line per check; exit status 0 when all pass.
 */
#include "../common/flashspecPlugin.h"
#include "../verifyResample/verifyResamplePlugin.h"

#include <cuda_runtime.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

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

//! A VerifyResample as the ONNX parser creates it from a node with `return_logprobs` (INT64).
IPluginV3* createVerify(int64_t returnLogprobs)
{
    int32_t const vocab = 1000;
    PluginField fields[2] = {PluginField("vocab_size", &vocab, PluginFieldType::kINT32, 1),
        PluginField("return_logprobs", &returnLogprobs, PluginFieldType::kINT64, 1)};
    PluginFieldCollection fc{2, fields};
    return creator("VerifyResample")->createPlugin("node", &fc, TensorRTPhase::kBUILD);
}

DynamicPluginTensorDesc desc(DataType type)
{
    DynamicPluginTensorDesc d{};
    d.desc.type = type;
    d.desc.format = TensorFormat::kLINEAR;
    return d;
}

//! A tensor of fixed dims (min = opt = max) of ``type``.
DynamicPluginTensorDesc fixedDesc(DataType type, std::initializer_list<int64_t> dims)
{
    DynamicPluginTensorDesc d = desc(type);
    d.desc.dims.nbDims = d.min.nbDims = d.max.nbDims = static_cast<int32_t>(dims.size());
    int32_t i = 0;
    for (int64_t x : dims)
    {
        d.desc.dims.d[i] = d.min.d[i] = d.max.d[i] = x;
        ++i;
    }
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

void checkCommon(char const* name, int32_t op, int32_t nbOutputs)
{
    IPluginCreatorV3One* c = creator(name);
    check(c != nullptr, std::string(name) + ": getCreators lists it");
    if (c == nullptr)
    {
        return;
    }
    check(std::strcmp(c->getPluginNamespace(), "flashspec") == 0 && std::strcmp(c->getPluginVersion(), "2") == 0,
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
    auto intAt = [](PluginFieldCollection const* fc, int32_t i) { return *static_cast<int32_t const*>(fc->fields[i].data); };
    PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    bool const verify = op == FLASHSPEC_OP_VERIFY_RESAMPLE;
    check(fields->nbFields == (verify ? 4 : 2) && std::strcmp(fields->fields[0].name, "vocab_size") == 0
            && intAt(fields, 0) == 1000 && std::strcmp(fields->fields[1].name, "num_splits") == 0
            && intAt(fields, 1) == 0
            && (!verify
                || (std::strcmp(fields->fields[2].name, "return_logprobs") == 0 && intAt(fields, 2) == 1
                    && std::strcmp(fields->fields[3].name, "optional_inputs") == 0 && intAt(fields, 3) == -1)),
        std::string(name) + ": serializes vocab_size = 1000 and num_splits = 0 (unresolved) before the build"
            + (verify ? ", return_logprobs = 1 by default, optional_inputs = -1 (from the inputs)" : ""));
    // configurePlugin (build time) fixes the split count for the largest shape (64 rows of H = 256:
    // TiledArgmax [64, 256], VerifyResample [16, 4, 256]); it is serialized.
    std::vector<DynamicPluginTensorDesc> inputs;
    auto input = [&](DataType type, std::initializer_list<int64_t> dims) { inputs.push_back(fixedDesc(type, dims)); };
    input(DataType::kBF16, verify ? std::initializer_list<int64_t>{16, 4, 256} : std::initializer_list<int64_t>{64, 256});
    input(DataType::kBF16, {1024, 256});
    if (verify)
    {
        input(DataType::kINT64, {16, 3});
        input(DataType::kFLOAT, {16});
        input(DataType::kINT64, {16});
        input(DataType::kINT64, {16});
    }
    check(build->configurePlugin(inputs.data(), static_cast<int32_t>(inputs.size()), nullptr, 0) == 0,
        std::string(name) + ": configures");
    check(build->configurePlugin(inputs.data(), 1, nullptr, 0) != 0,
        std::string(name) + ": refuses to configure without all its inputs");
    int32_t const splits = intAt(runtime->getFieldsToSerialize(), 1);
    check(splits == flashspec::resolveNumSplits(op, 64, 256, 1000, FLASHSPEC_BFLOAT16, 0) && splits > 0
            && splits <= flashspec::maxNumSplits(1000),
        std::string(name) + ": num_splits resolved at build for 64 rows of H = 256");
    IPluginV3* restored = c->createPlugin("node", runtime->getFieldsToSerialize(), TensorRTPhase::kRUNTIME);
    check(restored != nullptr, std::string(name) + ": deserializes from its own fields");
    if (restored != nullptr)
    {
        auto* back = static_cast<IPluginV3OneRuntime*>(restored->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        check(intAt(back->getFieldsToSerialize(), 1) == splits, std::string(name) + ": num_splits survives a round trip");
    }
    int32_t const tooMany = flashspec::maxNumSplits(1000) + 1;
    int32_t const vocab = 1000;
    PluginField bad[2] = {PluginField("vocab_size", &vocab, PluginFieldType::kINT32, 1),
        PluginField("num_splits", &tooMany, PluginFieldType::kINT32, 1)};
    PluginFieldCollection badFc{2, bad};
    check(c->createPlugin("node", &badFc, TensorRTPhase::kRUNTIME) == nullptr,
        std::string(name) + ": num_splits above maxNumSplits is refused");
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
//! A device copy of a host vector (freed at exit: a test process).
template <typename T>
T* toDevice(std::vector<T> const& host)
{
    T* device = nullptr;
    cudaMalloc(&device, host.size() * sizeof(T));
    cudaMemcpy(device, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
    return device;
}

template <typename T>
std::vector<T> toHost(T const* device, size_t count)
{
    std::vector<T> host(count);
    cudaMemcpy(host.data(), device, count * sizeof(T), cudaMemcpyDeviceToHost);
    return host;
}

PluginTensorDesc tensor(DataType type, std::initializer_list<int64_t> dims)
{
    PluginTensorDesc d{};
    d.type = type;
    d.format = TensorFormat::kLINEAR;
    d.dims.nbDims = static_cast<int32_t>(dims.size());
    int32_t i = 0;
    for (int64_t x : dims)
    {
        d.dims.d[i++] = x;
    }
    return d;
}

std::vector<DynamicPluginTensorDesc> dynamic(std::vector<PluginTensorDesc> const& descs)
{
    std::vector<DynamicPluginTensorDesc> out;
    for (PluginTensorDesc const& d : descs)
    {
        DynamicPluginTensorDesc x{};
        x.desc = d;
        x.min = x.opt = x.max = d.dims;
        out.push_back(x);
    }
    return out;
}

//! Run a plugin's enqueue the way TensorRT does (`plugin`, taken over, or one created from
//! vocab_size alone); returns its status.
int32_t enqueue(char const* name, int32_t vocab, std::vector<PluginTensorDesc> const& in,
    std::vector<PluginTensorDesc> const& out, std::vector<void const*> const& inputs, std::vector<void*> const& outputs,
    IPluginV3* plugin = nullptr)
{
    plugin = plugin != nullptr ? plugin : create(creator(name), vocab, PluginFieldType::kINT32);
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    auto dynIn = dynamic(in);
    auto dynOut = dynamic(out);
    // As TensorRT before a run with new shapes (and the only place an engine's plugin sees its
    // inputs' count at run time)
    int32_t const shaped = runtime->onShapeChange(
        in.data(), static_cast<int32_t>(in.size()), out.data(), static_cast<int32_t>(out.size()));
    if (shaped != 0)
    {
        delete plugin;
        return shaped;
    }
    size_t const bytes = build->getWorkspaceSize(dynIn.data(), static_cast<int32_t>(in.size()), dynOut.data(),
        static_cast<int32_t>(out.size()));
    void* workspace = nullptr;
    cudaMalloc(&workspace, bytes > 0 ? bytes : 16);
    int32_t const status = runtime->enqueue(in.data(), out.data(), inputs.data(), outputs.data(), workspace, nullptr);
    cudaDeviceSynchronize();
    delete plugin;
    return status;
}

void gpuChecks()
{
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    {
        std::printf("SKIP enqueue checks: no CUDA device\n");
        return;
    }
    int64_t const n = 3, rows = 4, hidden = 64, vocab = 1000, padded = 1024;
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    std::vector<float> h(n * rows * hidden), w(padded * hidden);
    for (float& x : h) x = normal(rng);
    for (float& x : w) x = normal(rng) * 0.75f;
    std::vector<int64_t> drafts(n * (rows - 1));
    for (int64_t& d : drafts) d = static_cast<int64_t>(rng() % vocab);
    std::vector<float> temps = {0.0f, 0.7f, 1.0f};
    std::vector<int64_t> seeds = {1, 2, (int64_t{1} << 62) + 5}, positions = {0, 5, 9};
    float* dh = toDevice(h);
    float* dw = toDevice(w);
    int64_t* dd = toDevice(drafts);
    float* dt = toDevice(temps);
    int64_t* ds = toDevice(seeds);
    int64_t* dp = toDevice(positions);

    // VerifyResample through the plugin ...
    std::vector<int64_t> zeros(n * rows, 0);
    std::vector<float> fzeros(n * rows, 0.0f);
    int64_t* tokens = toDevice(zeros);
    int64_t* emitted = toDevice(std::vector<int64_t>(n, 0));
    float* logprobs = toDevice(fzeros);
    int32_t const status = enqueue("VerifyResample", vocab,
        {tensor(DataType::kFLOAT, {n, rows, hidden}), tensor(DataType::kFLOAT, {padded, hidden}),
            tensor(DataType::kINT64, {n, rows - 1}), tensor(DataType::kFLOAT, {n}), tensor(DataType::kINT64, {n}),
            tensor(DataType::kINT64, {n})},
        {tensor(DataType::kINT64, {n, rows}), tensor(DataType::kINT64, {n}), tensor(DataType::kFLOAT, {n, rows})},
        {dh, dw, dd, dt, ds, dp}, {tokens, emitted, logprobs});
    check(status == 0, "VerifyResample: enqueue succeeds");
    // ... and directly.
    int64_t* tokens2 = toDevice(zeros);
    int64_t* emitted2 = toDevice(std::vector<int64_t>(n, 0));
    float* logprobs2 = toDevice(fzeros);
    int32_t const splits = flashspec::resolveNumSplits(FLASHSPEC_OP_VERIFY_RESAMPLE, n * rows, hidden, vocab, 0, 0);
    void* ws = nullptr;
    cudaMalloc(&ws, flashspec::getVerifyResampleWorkspaceSize(n * rows, splits, hidden));
    flashspec::VerifyResampleParams params{dh, dw, dd, dt, ds, dp, tokens2, emitted2, logprobs2, ws,
        static_cast<int32_t>(n), static_cast<int32_t>(rows - 1), static_cast<int32_t>(hidden),
        static_cast<int32_t>(vocab), 0, splits};
    check(flashspec::invokeVerifyResample(params, nullptr) == cudaSuccess, "VerifyResample: direct invoke succeeds");
    cudaDeviceSynchronize();
    auto t1 = toHost(tokens, n * rows), t2 = toHost(tokens2, n * rows);
    auto e1 = toHost(emitted, n), e2 = toHost(emitted2, n);
    auto l1 = toHost(logprobs, n * rows), l2 = toHost(logprobs2, n * rows);
    check(t1 == t2 && e1 == e2 && l1 == l2, "VerifyResample: plugin outputs equal the direct call's");
    bool valid = true;
    for (int64_t i = 0; i < n; ++i)
    {
        valid = valid && e1[i] >= 1 && e1[i] <= rows && t1[i * rows + e1[i] - 1] >= 0 && t1[i * rows + e1[i] - 1] < vocab;
    }
    check(valid, "VerifyResample: num_emitted in 1..R, last emitted token in the vocabulary");
    // ... and without logprobs (return_logprobs = 0: two outputs, the kernels skip the LSE).
    int64_t* tokens3 = toDevice(zeros);
    int64_t* emitted3 = toDevice(std::vector<int64_t>(n, 0));
    check(enqueue("VerifyResample", vocab,
              {tensor(DataType::kFLOAT, {n, rows, hidden}), tensor(DataType::kFLOAT, {padded, hidden}),
                  tensor(DataType::kINT64, {n, rows - 1}), tensor(DataType::kFLOAT, {n}),
                  tensor(DataType::kINT64, {n}), tensor(DataType::kINT64, {n})},
              {tensor(DataType::kINT64, {n, rows}), tensor(DataType::kINT64, {n})}, {dh, dw, dd, dt, ds, dp},
              {tokens3, emitted3}, createVerify(0))
            == 0,
        "VerifyResample: enqueue without logprobs succeeds");
    check(toHost(tokens3, n * rows) == t1 && toHost(emitted3, n) == e1,
        "VerifyResample: without logprobs, the tokens and counts of the plugin with them");

    // ... with top_k, top_p and allowed_tokens (the ONNX node's optional inputs 7 to 9): the
    // plugin's outputs equal a direct call's with the same truncation, and a top-k 1 row emits the
    // largest allowed logit (greedy).
    int64_t const words = (vocab + 31) / 32;
    std::vector<int64_t> topK = {1, 5, 0};
    std::vector<float> topP = {1.0f, 0.5f, 0.9f};
    std::vector<int32_t> allowed(n * rows * words, -1);
    for (size_t i = 0; i < allowed.size(); i += 3)
    {
        allowed[i] = static_cast<int32_t>(0x5A5A5A5Au); // every third word allows half its tokens
    }
    int64_t* dk = toDevice(topK);
    float* dpp = toDevice(topP);
    int32_t* da = toDevice(allowed);
    int64_t* tokens4 = toDevice(zeros);
    int64_t* emitted4 = toDevice(std::vector<int64_t>(n, 0));
    float* logprobs4 = toDevice(fzeros);
    check(enqueue("VerifyResample", vocab,
              {tensor(DataType::kFLOAT, {n, rows, hidden}), tensor(DataType::kFLOAT, {padded, hidden}),
                  tensor(DataType::kINT64, {n, rows - 1}), tensor(DataType::kFLOAT, {n}),
                  tensor(DataType::kINT64, {n}), tensor(DataType::kINT64, {n}), tensor(DataType::kINT64, {n}),
                  tensor(DataType::kFLOAT, {n}), tensor(DataType::kINT32, {n, rows, words})},
              {tensor(DataType::kINT64, {n, rows}), tensor(DataType::kINT64, {n}), tensor(DataType::kFLOAT, {n, rows})},
              {dh, dw, dd, dt, ds, dp, dk, dpp, da}, {tokens4, emitted4, logprobs4})
            == 0,
        "VerifyResample: enqueue with top_k, top_p and allowed_tokens succeeds");
    int64_t* tokens5 = toDevice(zeros);
    int64_t* emitted5 = toDevice(std::vector<int64_t>(n, 0));
    float* logprobs5 = toDevice(fzeros);
    void* ws5 = nullptr;
    cudaMalloc(&ws5, flashspec::getVerifyResampleTruncatedWorkspaceSize(n * rows, splits, hidden, vocab));
    flashspec::VerifyResampleParams truncated = params;
    truncated.tokens = tokens5;
    truncated.numEmitted = emitted5;
    truncated.logprobs = logprobs5;
    truncated.workspace = ws5;
    truncated.topK = dk;
    truncated.topP = dpp;
    truncated.allowedTokens = da;
    check(flashspec::invokeVerifyResample(truncated, nullptr) == cudaSuccess,
        "VerifyResample: direct invoke with truncation succeeds");
    cudaDeviceSynchronize();
    auto t4 = toHost(tokens4, n * rows), t5 = toHost(tokens5, n * rows);
    check(t4 == t5 && toHost(emitted4, n) == toHost(emitted5, n)
            && toHost(logprobs4, n * rows) == toHost(logprobs5, n * rows),
        "VerifyResample: plugin outputs with truncation equal the direct call's");
    float best = -INFINITY; // sequence 0, row 0 (top_k 1): the largest allowed logit, lowest id
    int64_t arg = -1;
    for (int64_t v = 0; v < vocab; ++v)
    {
        if (((static_cast<uint32_t>(allowed[v / 32]) >> (v % 32)) & 1u) == 0)
        {
            continue;
        }
        float dot = 0.0f;
        for (int64_t k = 0; k < hidden; ++k)
        {
            dot += h[k] * w[v * hidden + k];
        }
        if (dot > best)
        {
            best = dot;
            arg = v;
        }
    }
    check(t4[0] == arg, "VerifyResample: top_k 1 emits the largest allowed logit");

    // TiledArgmax on the first row of each sequence.
    int64_t* token = toDevice(std::vector<int64_t>(n, -2));
    float* maxLogit = toDevice(std::vector<float>(n, 0.0f));
    std::vector<float> first(n * hidden);
    for (int64_t i = 0; i < n; ++i)
    {
        std::copy(h.begin() + i * rows * hidden, h.begin() + (i * rows + 1) * hidden, first.begin() + i * hidden);
    }
    float* df = toDevice(first);
    check(enqueue("TiledArgmax", vocab, {tensor(DataType::kFLOAT, {n, hidden}), tensor(DataType::kFLOAT, {padded, hidden})},
              {tensor(DataType::kINT64, {n}), tensor(DataType::kFLOAT, {n})}, {df, dw}, {token, maxLogit})
            == 0,
        "TiledArgmax: enqueue succeeds");
    auto tok = toHost(token, n);
    bool argmaxOk = true;
    for (int64_t i = 0; i < n; ++i) // a host fp32 argmax: tokens may differ only at near-ties
    {
        float best = -1e30f;
        int64_t arg = -1;
        for (int64_t v = 0; v < vocab; ++v)
        {
            float dot = 0.0f;
            for (int64_t k = 0; k < hidden; ++k)
            {
                dot += first[i * hidden + k] * w[v * hidden + k];
            }
            if (dot > best)
            {
                best = dot;
                arg = v;
            }
        }
        argmaxOk = argmaxOk && tok[i] == arg;
    }
    check(argmaxOk, "TiledArgmax: plugin tokens equal a host fp32 argmax");
}
//! return_logprobs = 0 (a node that leaves logprobs out): two outputs, typed and shaped, the field
//! serialized and restored; absent (an engine serialized before the field): three; 2 refused.
void checkWithoutLogprobs()
{
    IPluginV3* plugin = createVerify(0);
    check(plugin != nullptr, "VerifyResample: created with return_logprobs = 0");
    if (plugin == nullptr)
    {
        return;
    }
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    check(build->getNbOutputs() == 2, "VerifyResample: return_logprobs = 0 reports 2 outputs");
    DataType types[3] = {DataType::kBOOL, DataType::kBOOL, DataType::kBOOL};
    DataType const in[6] = {DataType::kBF16, DataType::kBF16, DataType::kINT64, DataType::kFLOAT, DataType::kINT64,
        DataType::kINT64};
    check(build->getOutputDataTypes(types, 2, in, 6) == 0 && types[0] == DataType::kINT64
            && types[1] == DataType::kINT64 && types[2] == DataType::kBOOL,
        "VerifyResample: return_logprobs = 0 outputs int64 tokens, int64 num_emitted, nothing more");
    check(build->getOutputDataTypes(types, 3, in, 6) != 0, "VerifyResample: return_logprobs = 0 refuses 3 outputs");
    check(accepts(build,
              {DataType::kHALF, DataType::kHALF, DataType::kINT64, DataType::kFLOAT, DataType::kINT64, DataType::kINT64,
                  DataType::kINT64, DataType::kINT64},
              6),
        "VerifyResample: return_logprobs = 0 accepts the I/O types without logprobs");
    PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    check(fields->nbFields == 4 && std::strcmp(fields->fields[2].name, "return_logprobs") == 0
            && *static_cast<int32_t const*>(fields->fields[2].data) == 0,
        "VerifyResample: serializes return_logprobs = 0");
    IPluginV3* restored = creator("VerifyResample")->createPlugin("node", fields, TensorRTPhase::kRUNTIME);
    IPluginV3* copy = plugin->clone();
    auto nbOutputs = [](IPluginV3* p) {
        return static_cast<IPluginV3OneBuild*>(p->getCapabilityInterface(PluginCapabilityType::kBUILD))->getNbOutputs();
    };
    check(restored != nullptr && nbOutputs(restored) == 2 && copy != nullptr && nbOutputs(copy) == 2,
        "VerifyResample: return_logprobs = 0 survives a round trip and a clone");
    IPluginV3* old = createVerify(1);
    check(old != nullptr && nbOutputs(old) == 3, "VerifyResample: return_logprobs = 1 reports 3 outputs");
    check(createVerify(2) == nullptr, "VerifyResample: return_logprobs = 2 is refused");
    delete old;
    delete copy;
    delete restored;
    delete plugin;
}
//! The optional inputs top_k, top_p, allowed_tokens (inputs 7 to 9, in this order; any subset in
//! order, told apart by type): types, formats, the mask fixed at configure and serialized, a field
//! that disagrees refused, the workspace of the exact recompute, and their shapes checked.
void checkOptionalInputs()
{
    using V = flashspec::plugin::VerifyResamplePlugin;
    DataType const h = DataType::kHALF;
    DataType const i64 = DataType::kINT64;
    DataType const f32 = DataType::kFLOAT;
    DataType const i32 = DataType::kINT32;
    auto mask = [&](std::initializer_list<DataType> extra) {
        std::vector<DataType> types = {h, h, i64, f32, i64, i64};
        types.insert(types.end(), extra);
        return V::optionalInputsOf(types.data(), static_cast<int32_t>(types.size()));
    };
    check(mask({}) == 0 && mask({i64}) == V::kTopK && mask({i64, f32}) == (V::kTopK | V::kTopP)
            && mask({i64, f32, i32}) == V::kOptionalInputsMask && mask({f32}) == V::kTopP
            && mask({i32}) == V::kAllowedTokens && mask({i64, i32}) == (V::kTopK | V::kAllowedTokens),
        "VerifyResample: optional inputs told apart by type (a prefix, as the ONNX parser hands them, or any "
        "subset in order)");
    check(mask({f32, i64}) < 0 && mask({i64, i64}) < 0 && mask({i32, f32}) < 0 && mask({i64, f32, i32, i32}) < 0
            && mask({DataType::kBOOL}) < 0,
        "VerifyResample: refuses optional inputs out of order, repeated, of another type, or a tenth input");

    IPluginV3* plugin = createVerify(1);
    auto* build = static_cast<IPluginV3OneBuild*>(plugin->getCapabilityInterface(PluginCapabilityType::kBUILD));
    auto* runtime = static_cast<IPluginV3OneRuntime*>(plugin->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
    DataType outTypes[3];
    DataType const nine[9] = {h, h, i64, f32, i64, i64, i64, f32, i32};
    check(build->getOutputDataTypes(outTypes, 3, nine, 9) == 0 && outTypes[2] == f32,
        "VerifyResample: outputs with 9 inputs");
    check(accepts(build, {h, h, i64, f32, i64, i64, i64, f32, i32, i64, i64, f32}, 9),
        "VerifyResample: accepts top_k int64, top_p float, allowed_tokens int32 and the outputs after them");
    check(accepts(build, {h, h, i64, f32, i64, i64, i64, i64, i64, f32}, 7),
        "VerifyResample: accepts top_k alone (7 inputs)");
    check(!accepts(build, {h, h, i64, f32, i64, i64, i32, f32, i64, i64, i64, f32}, 9),
        "VerifyResample: refuses allowed_tokens before top_p");
    int64_t const n = 16, r = 4, hs = 256, vocab = 1000, words = (vocab + 31) / 32;
    std::vector<DynamicPluginTensorDesc> in;
    auto input = [&](DataType type, std::initializer_list<int64_t> dims) { in.push_back(fixedDesc(type, dims)); };
    input(h, {n, r, hs});
    input(h, {1024, hs});
    input(i64, {n, r - 1});
    input(f32, {n});
    input(i64, {n});
    input(i64, {n});
    input(i64, {n});
    input(f32, {n});
    input(i32, {n, r, words});
    check(build->configurePlugin(in.data(), 9, nullptr, 0) == 0, "VerifyResample: configures with 9 inputs");
    PluginFieldCollection const* fields = runtime->getFieldsToSerialize();
    check(fields->nbFields == 4 && std::strcmp(fields->fields[3].name, "optional_inputs") == 0
            && *static_cast<int32_t const*>(fields->fields[3].data) == V::kOptionalInputsMask,
        "VerifyResample: serializes optional_inputs = 7 after configuring with top_k, top_p, allowed_tokens");
    IPluginV3* restored = creator("VerifyResample")->createPlugin("node", fields, TensorRTPhase::kRUNTIME);
    IPluginV3* copy = plugin->clone();
    auto maskOf = [](IPluginV3* p) {
        auto* rt = static_cast<IPluginV3OneRuntime*>(p->getCapabilityInterface(PluginCapabilityType::kRUNTIME));
        return *static_cast<int32_t const*>(rt->getFieldsToSerialize()->fields[3].data);
    };
    check(restored != nullptr && maskOf(restored) == V::kOptionalInputsMask && copy != nullptr
            && maskOf(copy) == V::kOptionalInputsMask,
        "VerifyResample: optional_inputs survives a round trip and a clone");
    auto* restoredBuild
        = static_cast<IPluginV3OneBuild*>(restored->getCapabilityInterface(PluginCapabilityType::kBUILD));
    check(restoredBuild->getOutputDataTypes(outTypes, 3, nine, 7) != 0,
        "VerifyResample: a plugin of 3 optional inputs refuses 7 inputs");
    size_t const plain = build->getWorkspaceSize(in.data(), 6, nullptr, 0); // the splits resolved at configure
    size_t const truncating = build->getWorkspaceSize(in.data(), 9, nullptr, 0);
    check(truncating >= plain + static_cast<size_t>(n * r * vocab) * sizeof(float),
        "VerifyResample: with top_k / top_p the workspace holds the exact recompute's [rows, V] logits");
    check(build->getWorkspaceSize(in.data(), 7, nullptr, 0) == truncating
            && build->getWorkspaceSize(in.data(), 6, nullptr, 0) < truncating,
        "VerifyResample: top_k alone needs it too; without top_k / top_p, the plain workspace");
    in[8].desc.dims.d[2] = in[8].min.d[2] = in[8].max.d[2] = words + 1;
    check(build->configurePlugin(in.data(), 9, nullptr, 0) != 0,
        "VerifyResample: refuses allowed_tokens of ceil(V / 32) + 1 words");
    int32_t const vocab32 = 1000;
    int64_t const badMask = 8;
    PluginField bad[2] = {PluginField("vocab_size", &vocab32, PluginFieldType::kINT32, 1),
        PluginField("optional_inputs", &badMask, PluginFieldType::kINT64, 1)};
    PluginFieldCollection badFc{2, bad};
    check(creator("VerifyResample")->createPlugin("node", &badFc, TensorRTPhase::kRUNTIME) == nullptr,
        "VerifyResample: optional_inputs 8 is refused");
    int64_t const topKOnly = V::kTopK;
    PluginField one[2] = {PluginField("vocab_size", &vocab32, PluginFieldType::kINT32, 1),
        PluginField("optional_inputs", &topKOnly, PluginFieldType::kINT64, 1)};
    PluginFieldCollection oneFc{2, one};
    IPluginV3* fixed = creator("VerifyResample")->createPlugin("node", &oneFc, TensorRTPhase::kBUILD);
    in[8].desc.dims.d[2] = in[8].min.d[2] = in[8].max.d[2] = words;
    check(fixed != nullptr
            && static_cast<IPluginV3OneBuild*>(fixed->getCapabilityInterface(PluginCapabilityType::kBUILD))
                    ->configurePlugin(in.data(), 9, nullptr, 0)
                != 0,
        "VerifyResample: a node whose optional_inputs (top_k) disagrees with its 9 inputs is refused");
    delete fixed;
    delete copy;
    delete restored;
    delete plugin;
}
} // namespace

int main()
{
    gpuChecks();
    checkCommon("TiledArgmax", FLASHSPEC_OP_TILED_ARGMAX, 2);
    checkCommon("VerifyResample", FLASHSPEC_OP_VERIFY_RESAMPLE, 3);

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
    checkWithoutLogprobs();
    checkOptionalInputs();
    std::printf("%d failure(s)\n", gFailures);
    return gFailures == 0 ? 0 : 1;
}
