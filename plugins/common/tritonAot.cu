/*
 * Launcher of the ahead-of-time compiled Triton kernels (tritonAot.h). The CUDA driver API is
 * reached through dlopen("libcuda.so.1"), as Triton's own launcher does, so the library still
 * loads on a machine without a driver (CI loads it on CPU for the ABI tests).
 *
 * Module loading, and the capture rule: every kernel of the table is loaded into a CUDA context
 * at once, by prepare() (C ABI flashspecPrepareKernels; the plugins call it from configurePlugin
 * and attachToContext, flashspec_export/ops/cuda.py before a launch outside capture), or by the
 * first launch in the context. Loading a module is not a stream operation and may allocate, so
 * it must not happen while a CUDA graph is being captured: a launch on a capturing stream in a
 * context without the kernels loads nothing and fails with cudaErrorStreamCaptureUnsupported.
 * The cache is keyed by the context's ID (cuCtxGetId, CUDA 12.0 drivers on), which the driver
 * never hands out twice, not by the CUcontext handle, which a context created after another was
 * destroyed may get again. A destroyed context's modules went with it (the driver unloads them);
 * its entry is dropped when a later context turns up with its handle.
 *
 * Argument order per kernel: kernels/aot.py RUNTIME_ARGS (checked there against the kernels'
 * signatures), then the global and profile scratch pointers Triton 3.x appends (null: the
 * generator refuses kernels that need scratch). A tensor-descriptor argument of the Hopper kernel
 * is its CUtensorMap (by value), then the tensor's shape (2 x int32) and strides (2 x int64, in
 * elements), as Triton's own launcher passes it.
 */
#include "launch.cuh"
#include "tritonAot.h"

#include <cuda.h>
#include <dlfcn.h>

#include <algorithm>
#include <cstdio>
#include <iterator>
#include <mutex>
#include <string>
#include <type_traits>
#include <unordered_map>
#include <vector>

namespace flashspec
{
namespace aot
{
namespace
{

struct Driver
{
    bool opened = false; // libcuda.so.1 was found
    decltype(&::cuCtxGetCurrent) ctxGetCurrent = nullptr;
    decltype(&::cuCtxGetId) ctxGetId = nullptr; // CUDA 12.0 drivers on
    decltype(&::cuModuleLoadData) moduleLoadData = nullptr;
    decltype(&::cuModuleUnload) moduleUnload = nullptr;
    decltype(&::cuModuleGetFunction) moduleGetFunction = nullptr;
    decltype(&::cuFuncSetAttribute) funcSetAttribute = nullptr;
    decltype(&::cuLaunchKernel) launchKernel = nullptr;
    decltype(&::cuTensorMapEncodeTiled) tensorMapEncodeTiled = nullptr; // CUDA 12 drivers on: the Hopper kernel

    bool loaded() const
    {
        return ctxGetCurrent && ctxGetId && moduleLoadData && moduleUnload && moduleGetFunction && funcSetAttribute
            && launchKernel;
    }
};

Driver const& driver()
{
    static Driver const instance = [] {
        Driver d;
        void* handle = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (handle == nullptr)
        {
            return d;
        }
        d.opened = true;
        auto resolve = [&](auto& fn, char const* name) { fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name)); };
        resolve(d.ctxGetCurrent, "cuCtxGetCurrent");
        resolve(d.ctxGetId, "cuCtxGetId");
        resolve(d.moduleLoadData, "cuModuleLoadData");
        resolve(d.moduleUnload, "cuModuleUnload");
        resolve(d.moduleGetFunction, "cuModuleGetFunction");
        resolve(d.funcSetAttribute, "cuFuncSetAttribute");
        resolve(d.launchKernel, "cuLaunchKernel");
        resolve(d.tensorMapEncodeTiled, "cuTensorMapEncodeTiled");
        return d;
    }();
    return instance;
}

cudaError_t toCudaError(CUresult result)
{
    switch (result)
    {
    case CUDA_SUCCESS: return cudaSuccess;
    case CUDA_ERROR_INVALID_VALUE: return cudaErrorInvalidValue;
    case CUDA_ERROR_OUT_OF_MEMORY: return cudaErrorMemoryAllocation;
    case CUDA_ERROR_INVALID_IMAGE: return cudaErrorInvalidKernelImage;
    case CUDA_ERROR_NO_BINARY_FOR_GPU: return cudaErrorNoKernelImageForDevice;
    case CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES: return cudaErrorLaunchOutOfResources;
    case CUDA_ERROR_INVALID_HANDLE: return cudaErrorInvalidResourceHandle;
    case CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED: return cudaErrorStreamCaptureUnsupported;
    default: return cudaErrorUnknown;
    }
}

//! The current CUDA context (where none is current, the current device's primary context, made
//! current) and its ID, unique over the process's lifetime.
cudaError_t currentContext(CUcontext& context, unsigned long long& id)
{
    Driver const& d = driver();
    if (!d.opened)
    {
        return cudaErrorNoDevice;
    }
    if (!d.loaded())
    {
        return cudaErrorInsufficientDriver;
    }
    context = nullptr;
    if (d.ctxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
    {
        // No current context yet: the runtime's primary context of the current device.
        int device = 0;
        cudaError_t status = cudaGetDevice(&device);
        if (status == cudaSuccess)
        {
            status = cudaSetDevice(device);
        }
        if (status != cudaSuccess)
        {
            return status;
        }
        if (d.ctxGetCurrent(&context) != CUDA_SUCCESS || context == nullptr)
        {
            return cudaErrorInitializationError;
        }
    }
    return toCudaError(d.ctxGetId(context, &id));
}

//! The table's kernels loaded into one context.
struct ContextKernels
{
    CUcontext handle;                  // a later context with this handle: this one is gone
    std::vector<CUfunction> functions; // [kTable.numKernels]
};

//! Loaded kernels by context ID. Allocated once and never destroyed: a launch may still run on
//! another thread while static destructors run at exit.
struct KernelCache
{
    std::mutex mutex;
    std::unordered_map<unsigned long long, ContextKernels> byContext;
};

KernelCache& kernelCache()
{
    static auto* const instance = new KernelCache;
    return *instance;
}

//! Loads every kernel of the table into the current context: `functions` [kTable.numKernels], or
//! an error with nothing left loaded.
cudaError_t loadKernels(std::vector<CUfunction>& functions)
{
    Driver const& d = driver();
    std::vector<CUmodule> modules;
    functions.assign(kTable.numKernels, nullptr);
    CUresult result = CUDA_SUCCESS;
    for (size_t i = 0; i < kTable.numKernels && result == CUDA_SUCCESS; ++i)
    {
        Kernel const& k = kTable.kernels[i];
        CUmodule module = nullptr;
        result = d.moduleLoadData(&module, k.cubin);
        if (result != CUDA_SUCCESS)
        {
            break;
        }
        modules.push_back(module);
        result = d.moduleGetFunction(&functions[i], module, k.name);
        if (result == CUDA_SUCCESS && k.sharedBytes > 48 * 1024)
        {
            result = d.funcSetAttribute(functions[i], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES, k.sharedBytes);
        }
    }
    if (result != CUDA_SUCCESS)
    {
        for (CUmodule module : modules)
        {
            d.moduleUnload(module);
        }
        functions.clear();
    }
    return toCudaError(result);
}

//! The table's kernels in the current context (`functions`: kTable.numKernels of them), loaded
//! here where they are not yet. `launchStream`: the stream of the launch that asks, or nullptr
//! (prepare): a launch on a capturing stream loads nothing (the capture rule at the top).
cudaError_t contextKernels(cudaStream_t launchStream, bool launching, CUfunction const*& functions)
{
    CUcontext context = nullptr;
    unsigned long long id = 0;
    cudaError_t status = currentContext(context, id);
    if (status != cudaSuccess)
    {
        return status;
    }
    KernelCache& cache = kernelCache();
    std::lock_guard<std::mutex> const lock(cache.mutex);
    auto found = cache.byContext.find(id);
    if (found == cache.byContext.end())
    {
        cudaStreamCaptureStatus capture = cudaStreamCaptureStatusNone;
        if (launching
            && (cudaStreamIsCapturing(launchStream, &capture) != cudaSuccess
                || capture != cudaStreamCaptureStatusNone))
        {
            return cudaErrorStreamCaptureUnsupported;
        }
        // A context destroyed since: the driver unloaded its modules with it.
        for (auto it = cache.byContext.begin(); it != cache.byContext.end();)
        {
            it = it->second.handle == context ? cache.byContext.erase(it) : std::next(it);
        }
        ContextKernels entry{context, {}};
        status = loadKernels(entry.functions);
        if (status != cudaSuccess)
        {
            return status;
        }
        found = cache.byContext.emplace(id, std::move(entry)).first;
    }
    functions = found->second.functions.data();
    return cudaSuccess;
}

//! Launch kernel `index` on grid (gridX, gridY); args: the addresses of its runtime arguments, the
//! two scratch pointers not included.
template <size_t N>
cudaError_t launch(
    int32_t index, unsigned gridX, unsigned gridY, void* (&&args)[N], cudaStream_t stream, unsigned gridZ = 1)
{
    CUfunction const* functions = nullptr;
    cudaError_t const status = contextKernels(stream, true, functions);
    if (status != cudaSuccess)
    {
        return status;
    }
    CUfunction const fn = functions[index];
    CUdeviceptr globalScratch = 0;
    CUdeviceptr profileScratch = 0;
    void* params[N + 2];
    for (size_t i = 0; i < N; ++i)
    {
        params[i] = args[i];
    }
    params[N] = &globalScratch;
    params[N + 1] = &profileScratch;
    Kernel const& k = kTable.kernels[index];
    return toCudaError(driver().launchKernel(fn, gridX, gridY, gridZ, 32 * k.numWarps, 1, 1, k.sharedBytes,
        reinterpret_cast<CUstream>(stream), params, nullptr));
}

int32_t cdiv(int64_t a, int64_t b)
{
    return static_cast<int32_t>((a + b - 1) / b);
}

//! The current device's compute capability (major * 10 + minor) and SM count.
bool currentDevice(int32_t& arch, int32_t& sms, int& device)
{
    int major = 0;
    int minor = 0;
    int count = 0;
    if (cudaGetDevice(&device) != cudaSuccess
        || cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess
        || cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device) != cudaSuccess
        || cudaDeviceGetAttribute(&count, cudaDevAttrMultiProcessorCount, device) != cudaSuccess)
    {
        return false;
    }
    arch = major * 10 + minor;
    sms = count;
    return true;
}

//! cudaDeviceProp::name of `device`, read once per device ("" if it cannot be read).
std::string const& deviceName(int device)
{
    static std::mutex lock;
    static std::unordered_map<int, std::string> names;
    std::lock_guard<std::mutex> const guard(lock);
    auto found = names.find(device);
    if (found == names.end())
    {
        cudaDeviceProp prop{};
        std::string name = cudaGetDeviceProperties(&prop, device) == cudaSuccess ? prop.name : "";
        found = names.emplace(device, std::move(name)).first;
    }
    return found->second;
}

//! The launch-table row of (op, dtype, H) for numRows on this GPU (tiles.tuned_row: the first
//! row whose bound covers numRows, the GPU's own rows first), or nullptr when none is compiled in
//! or the device is not the table's architecture.
TileConfig const* findTile(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t dtype, int32_t& sms)
{
    int32_t arch = 0;
    int device = 0;
    if (kTable.numTiles == 0 || !currentDevice(arch, sms, device) || arch != kTable.arch)
    {
        return nullptr;
    }
    std::string const& name = deviceName(device);
    for (size_t i = 0; i < kTable.numTiles; ++i)
    {
        TileConfig const& t = kTable.tiles[i];
        bool const serves = t.op == op && t.dtype == dtype && t.hiddenSize == hiddenSize
            && (t.maxRows < 0 || numRows <= t.maxRows);
        if (serves && (t.device[0] == '\0' || name.find(t.device) != std::string::npos))
        {
            return &t;
        }
    }
    return nullptr;
}

//! tiles.num_splits: `waves` programs per SM over all row blocks, at most one per tile, or one
//! tile per program (waves = 0); then evened out so that no split is empty.
int32_t numSplits(TileConfig const& t, int32_t numRows, int32_t vocabSize, int32_t sms)
{
    int32_t const tiles = cdiv(vocabSize, t.blockV);
    int32_t const rowBlocks = cdiv(numRows, t.blockN);
    int32_t splits = tiles;
    if (t.waves > 0)
    {
        splits = std::max(1, std::min(tiles, cdiv(static_cast<int64_t>(t.waves) * sms, rowBlocks)));
    }
    return cdiv(tiles, cdiv(tiles, splits));
}

//! The smallest finalize kernel covering `splits` (and, for verify, `width` = γ + 1 positions).
FinalizeConfig const* findFinalize(int32_t op, int32_t splits, int32_t width, bool logprobs)
{
    FinalizeConfig const* best = nullptr;
    for (size_t i = 0; i < kTable.numFinalizes; ++i)
    {
        FinalizeConfig const& f = kTable.finalizes[i];
        bool const fits = f.op == op && f.blockS >= splits && (f.logprobs != 0) == logprobs
            && (op != FLASHSPEC_OP_VERIFY_RESAMPLE || f.blockR >= width);
        if (fits && (best == nullptr || f.blockR * f.blockS < best->blockR * best->blockS))
        {
            best = &f;
        }
    }
    return best;
}

//! The truncation's stage-2 kernel for `splits` (at most its blockS: the Triton JIT's constexprs
//! for every such count), the call's top_k / top_p inputs and log-probabilities output, or nullptr.
SettleConfig const* findSettle(int32_t splits, bool topK, bool topP, bool logprobs)
{
    for (size_t i = 0; i < kTable.numSettles; ++i)
    {
        SettleConfig const& s = kTable.settles[i];
        if ((s.topK != 0) == topK && (s.topP != 0) == topP && (s.logprobs != 0) == logprobs && s.blockS >= splits)
        {
            return &s;
        }
    }
    return nullptr;
}

//! The hand-in's sampled-logits kernel for `numRows` rows of `dtype` (SAMPLED_TUNED), or nullptr.
SampledConfig const* findSampled(int32_t dtype, int32_t numRows)
{
    for (size_t i = 0; i < kTable.numSampled; ++i)
    {
        SampledConfig const& s = kTable.sampled[i];
        if (s.dtype == dtype && (s.maxRows < 0 || numRows <= s.maxRows))
        {
            return &s;
        }
    }
    return nullptr;
}

//! The smallest hand-in threshold kernel for the call's top_k / top_p / mask inputs whose block
//! holds ceil(V / kHandInStride) sampled logits, or nullptr.
ThresholdConfig const* findThreshold(bool topK, bool topP, bool masked, int32_t vocabSize)
{
    int32_t const sampled = cdiv(vocabSize, kHandInStride);
    ThresholdConfig const* best = nullptr;
    for (size_t i = 0; i < kTable.numThresholds; ++i)
    {
        ThresholdConfig const& t = kTable.thresholds[i];
        bool const fits = (t.topK != 0) == topK && (t.topP != 0) == topP && (t.masked != 0) == masked
            && t.block >= sampled;
        if (fits && (best == nullptr || t.block < best->block))
        {
            best = &t;
        }
    }
    return best;
}

//! The common conditions of a plan: the compiled specialisation (16-byte aligned matrices), and
//! the kernels' int32 workspace offsets (4 planes of numRows x splits floats). The Hopper kernel
//! splits the vocabulary into its tiles (no other split count), needs the driver's TMA
//! descriptor encoder, and row blocks the workspace's whole block holds (kMaxBlockRows).
bool fitsSpecialisation(
    TileConfig const& tile, void const* hidden, void const* lmHead, int32_t numRows, int32_t vocabSize, int32_t splits)
{
    bool const fitsHopper = tile.blockK == 0
        || (splits == cdiv(vocabSize, tile.blockV) && tile.blockN <= kMaxBlockRows
            && driver().tensorMapEncodeTiled != nullptr);
    return fitsHopper && aligned16(hidden) && aligned16(lmHead) && splits > 0
        && 4 * static_cast<int64_t>(numRows) * splits < (int64_t{1} << 31);
}

//! A TMA-described operand of the Hopper kernel: the descriptor of a row-major [rows, H] matrix,
//! read in boxes of [boxRows, blockK], then the shape and strides that follow it as arguments.
struct TmaOperand
{
    CUtensorMap map;
    int32_t shape[2];
    int64_t strides[2];
};

cudaError_t encodeOperand(
    TmaOperand& out, void const* base, int32_t rows, int32_t hiddenSize, int32_t boxRows, TileConfig const& t)
{
    cuuint64_t const dims[2] = {static_cast<cuuint64_t>(hiddenSize), static_cast<cuuint64_t>(rows)}; // innermost first
    cuuint64_t const rowBytes[1] = {static_cast<cuuint64_t>(hiddenSize) * 2};                        // 16-bit elements
    cuuint32_t const box[2] = {static_cast<cuuint32_t>(t.blockK), static_cast<cuuint32_t>(boxRows)};
    cuuint32_t const elementStrides[2] = {1, 1};
    CUtensorMapDataType const type
        = t.dtype == FLASHSPEC_BFLOAT16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16;
    out.shape[0] = rows;
    out.shape[1] = hiddenSize;
    out.strides[0] = hiddenSize;
    out.strides[1] = 1;
    return toCudaError(driver().tensorMapEncodeTiled(&out.map, type, 2, const_cast<void*>(base), dims, rowBytes, box,
        elementStrides, CU_TENSOR_MAP_INTERLEAVE_NONE, static_cast<CUtensorMapSwizzle>(t.tmaSwizzle),
        CU_TENSOR_MAP_L2_PROMOTION_L2_128B, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE));
}

//! The Hopper kernel's arguments past the two matrices (kernels/hopper_tiles.py
//! hopper_tiles_kernel): the op's row inputs (any pointer for the argmax: never read), the
//! summaries (best score and index; with log-probabilities also the logit, max and sum-exp) and
//! the row scratch.
struct HopperArgs
{
    float const* temperature;
    int64_t const* seed;
    int64_t const* positions;
    float* bestScore;
    int32_t* bestIndex;
    float* bestLogit;
    float* max;
    float* sumExp;
    int32_t* rowScratch;
    int32_t gamma;
    int32_t const* allowedTokens = nullptr; //!< [numRows, ceil(V / 32)]: read by the MASKED kernels only
    // top-k / top-p (the HAND_IN kernels; never read by the others): HandInBuffers
    int32_t const* truncated = nullptr;
    float const* thresholds = nullptr;
    int32_t* counts = nullptr;
    int64_t* keys = nullptr;
};

//! Stage 1 by the Hopper kernel `kernel` over hidden [numRows, H] and lm_head [vocabSize, H]: one
//! persistent CTA per SM (at most kMaxPersistentCtas, the row scratch's capacity). Fewer rows than
//! one row block are read from a copy in `wholeBlock` (wholeBlockBytes(H) of the workspace), the
//! rows past numRows zeroed.
cudaError_t launchHopper(Plan const& plan, int32_t kernel, void const* hidden, void const* lmHead, int32_t numRows,
    int32_t hiddenSize, int32_t vocabSize, HopperArgs a, void* wholeBlock, cudaStream_t stream)
{
    TileConfig const& t = *plan.tile;
    cudaError_t status = cudaSuccess;
    int32_t tmaRows = numRows;
    if (numRows < t.blockN)
    {
        size_t const rowBytes = static_cast<size_t>(hiddenSize) * 2;
        size_t const live = rowBytes * numRows;
        status = cudaMemcpyAsync(wholeBlock, hidden, live, cudaMemcpyDeviceToDevice, stream);
        if (status == cudaSuccess)
        {
            status = cudaMemsetAsync(static_cast<char*>(wholeBlock) + live, 0, rowBytes * t.blockN - live, stream);
        }
        hidden = wholeBlock;
        tmaRows = t.blockN;
    }
    TmaOperand rowsOperand;
    TmaOperand headOperand;
    if (status == cudaSuccess)
    {
        status = encodeOperand(rowsOperand, hidden, tmaRows, hiddenSize, t.blockN, t);
    }
    if (status == cudaSuccess)
    {
        status = encodeOperand(headOperand, lmHead, vocabSize, hiddenSize, t.blockV, t);
    }
    if (status != cudaSuccess)
    {
        return status;
    }
    int64_t const tiles = static_cast<int64_t>(cdiv(vocabSize, t.blockV)) * cdiv(numRows, t.blockN);
    auto const ctas = static_cast<unsigned>(std::min<int64_t>({tiles, plan.sms, kMaxPersistentCtas}));
    int32_t numWords = cdiv(vocabSize, 32);
    return launch(kernel, ctas, 1,
        {&rowsOperand.map, &rowsOperand.shape[0], &rowsOperand.shape[1], &rowsOperand.strides[0],
            &rowsOperand.strides[1], &headOperand.map, &headOperand.shape[0], &headOperand.shape[1],
            &headOperand.strides[0], &headOperand.strides[1], &a.temperature, &a.seed, &a.positions, &a.bestScore,
            &a.bestIndex, &a.bestLogit, &a.max, &a.sumExp, &a.rowScratch, &numRows, &a.gamma, &vocabSize,
            &a.allowedTokens, &numWords, &a.truncated, &a.thresholds, &a.counts, &a.keys},
        stream);
}

} // namespace

cudaError_t prepare()
{
    if (kTable.numKernels == 0)
    {
        return cudaSuccess;
    }
    CUcontext context = nullptr;
    unsigned long long id = 0;
    cudaError_t const status = currentContext(context, id); // a clear status without a driver
    if (status != cudaSuccess)
    {
        return status;
    }
    int32_t arch = 0;
    int32_t sms = 0;
    int device = 0;
    if (!currentDevice(arch, sms, device))
    {
        return cudaErrorInitializationError;
    }
    if (arch != kTable.arch)
    {
        return cudaSuccess; // the native kernels run every call here: nothing to load
    }
    CUfunction const* functions = nullptr;
    return contextKernels(nullptr, false, functions);
}

int32_t tableSplits(size_t row, int32_t numRows, int32_t vocabSize, int32_t sms)
{
    return row < kTable.numTiles ? numSplits(kTable.tiles[row], numRows, vocabSize, sms) : -1;
}

int32_t maxTableSplits(int32_t vocabSize)
{
    int32_t most = 0;
    for (size_t i = 0; i < kTable.numTiles; ++i)
    {
        most = std::max(most, cdiv(vocabSize, kTable.tiles[i].blockV));
    }
    return most;
}

int32_t tunedSplits(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype)
{
    int32_t sms = 0;
    TileConfig const* tile = numRows > 0 && vocabSize > 0 ? findTile(op, numRows, hiddenSize, dtype, sms) : nullptr;
    if (tile == nullptr)
    {
        return 0;
    }
    int32_t const splits = numSplits(*tile, numRows, vocabSize, sms);
    // Some finalize kernel must take it (γ unknown here: the narrowest verify width), and for
    // top-k / top-p a stage 2 (top-k's: the same blocks as the others').
    if (op == FLASHSPEC_OP_VERIFY_TRUNCATED)
    {
        bool const settles = findSettle(splits, true, false, false) != nullptr;
        return settles && findFinalize(FLASHSPEC_OP_VERIFY_RESAMPLE, splits, 1, false) != nullptr ? splits : 0;
    }
    return findFinalize(op, splits, 1, false) != nullptr ? splits : 0;
}

void warnNative(int32_t op, int32_t dtype, int32_t hiddenSize)
{
    int32_t arch = 0;
    int32_t sms = 0;
    int device = 0;
    bool const emptyOnHopper = kTable.numTiles == 0 && currentDevice(arch, sms, device) && arch == 90;
    if (!emptyOnHopper && (kTable.numTiles == 0 || findTile(op, 1, hiddenSize, dtype, sms) != nullptr))
    {
        return; // no table, and not a GPU the default build compiles for; or compiled in after all
    }
    if (!emptyOnHopper && (!currentDevice(arch, sms, device) || arch != kTable.arch))
    {
        return; // a GPU the library has no compiled kernels for
    }
    static std::mutex lock;
    static std::vector<int64_t> warned;
    int64_t const key = (int64_t{op} << 40) | (int64_t{dtype} << 32) | hiddenSize;
    {
        std::lock_guard<std::mutex> const guard(lock);
        if (std::find(warned.begin(), warned.end(), key) != warned.end())
        {
            return;
        }
        warned.push_back(key);
    }
    char const* const dtypes[] = {"float32", "float16", "bfloat16"};
    char const* const opName = op == FLASHSPEC_OP_VERIFY_RESAMPLE ? "VerifyResample"
        : op == FLASHSPEC_OP_VERIFY_TRUNCATED                        ? "VerifyResample with top-k / top-p"
                                                                     : "TiledArgmax";
    char const* const dtypeName = dtype >= 0 && dtype < 3 ? dtypes[dtype] : "?";
    if (emptyOnHopper)
    {
        std::fprintf(stderr,
            "flashspec: %s (%s, H %d) runs the native CUDA kernels: this library was built without the "
            "compiled-in Triton kernels (FLASHSPEC_TRITON_AOT=OFF); on this GPU they are up to 10x faster at "
            "512 rows. Rebuild after `pip install -e .` (plugins/README.md).\n",
            opName, dtypeName, hiddenSize);
        return;
    }
    std::string compiled;
    for (size_t i = 0; i < kTable.numTiles; ++i)
    {
        TileConfig const& t = kTable.tiles[i];
        std::string const entry = std::string(t.dtype >= 0 && t.dtype < 3 ? dtypes[t.dtype] : "?") + " H "
            + std::to_string(t.hiddenSize);
        if (t.op == op && compiled.find(entry) == std::string::npos)
        {
            compiled += (compiled.empty() ? "" : ", ") + entry;
        }
    }
    std::fprintf(stderr,
        "flashspec: %s (%s, H %d) runs the native CUDA kernels, up to 10x slower at 512 rows: this library's "
        "compiled-in Triton kernels for sm_%d are %s. Rebuild with -DFLASHSPEC_AOT_DTYPES=%s "
        "-DFLASHSPEC_AOT_HIDDEN_SIZES=%d to run them (plugins/README.md).\n",
        opName, dtypeName, hiddenSize, kTable.arch, compiled.c_str(), dtypeName, hiddenSize);
}

bool planTiledArgmax(TiledArgmaxParams const& p, Plan& plan)
{
    int32_t sms = 0;
    TileConfig const* tile = findTile(FLASHSPEC_OP_TILED_ARGMAX, p.numRows, p.hiddenSize, p.dtype, sms);
    if (tile == nullptr)
    {
        return false;
    }
    int32_t const splits = p.numSplits > 0 ? p.numSplits : numSplits(*tile, p.numRows, p.vocabSize, sms);
    FinalizeConfig const* finalize = findFinalize(FLASHSPEC_OP_TILED_ARGMAX, splits, 1, false);
    if (finalize == nullptr || !fitsSpecialisation(*tile, p.hidden, p.lmHead, p.numRows, p.vocabSize, splits))
    {
        return false;
    }
    plan = {tile, finalize, splits, sms};
    return true;
}

bool planVerifyResample(VerifyResampleParams const& p, Plan& plan)
{
    int64_t const numRows = static_cast<int64_t>(p.batch) * (p.gamma + 1);
    if (numRows > INT32_MAX || static_cast<int64_t>(p.gamma + 1) * p.hiddenSize > INT32_MAX)
    {
        return false; // the kernels' int32 row count and stride
    }
    bool const truncating = p.topK != nullptr || p.topP != nullptr;
    int32_t sms = 0;
    TileConfig const* tile = findTile(truncating ? FLASHSPEC_OP_VERIFY_TRUNCATED : FLASHSPEC_OP_VERIFY_RESAMPLE,
        static_cast<int32_t>(numRows), p.hiddenSize, p.dtype, sms);
    if (tile == nullptr)
    {
        return false;
    }
    int32_t const rows = static_cast<int32_t>(numRows);
    int32_t const splits = p.numSplits > 0 ? p.numSplits : numSplits(*tile, rows, p.vocabSize, sms);
    FinalizeConfig const* finalize
        = findFinalize(FLASHSPEC_OP_VERIFY_RESAMPLE, splits, p.gamma + 1, p.logprobs != nullptr);
    plan = {tile, finalize, splits, sms};
    if (truncating)
    {
        plan.sampled = findSampled(p.dtype, rows);
        plan.threshold = findThreshold(p.topK != nullptr, p.topP != nullptr, p.allowedTokens != nullptr, p.vocabSize);
        plan.settle = findSettle(splits, p.topK != nullptr, p.topP != nullptr, p.logprobs != nullptr);
    }
    // The hand-in's kernels are compiled for 16-divisible workspace pointers (kernels/aot.py
    // _DIVISIBLE_BY_KIND).
    bool const handIn = !truncating
        || (plan.sampled != nullptr && plan.threshold != nullptr && plan.settle != nullptr && aligned16(p.workspace));
    return finalize != nullptr && handIn && fitsSpecialisation(*tile, p.hidden, p.lmHead, rows, p.vocabSize, splits)
        && (p.allowedTokens == nullptr || tile->maskedKernel >= 0);
}

cudaError_t launchTiledArgmax(TiledArgmaxParams const& p, Plan const& plan, cudaStream_t stream)
{
    TileConfig const& t = *plan.tile;
    int32_t numRows = p.numRows;
    int32_t vocabSize = p.vocabSize;
    int32_t splits = plan.splits;
    int32_t tilesPerSplit = cdiv(cdiv(vocabSize, t.blockV), splits);
    int32_t strideHn = p.hiddenSize; // hidden [numRows, H] and lm_head [V, H], rows contiguous
    int32_t strideVv = p.hiddenSize;
    void const* hidden = p.hidden;
    void const* lmHead = p.lmHead;
    float* wsMax = static_cast<float*>(p.workspace); // [numRows, splits] each, as the native kernels
    int32_t* wsIndex = reinterpret_cast<int32_t*>(wsMax + static_cast<size_t>(numRows) * splits);
    cudaError_t status = t.blockK > 0
        ? launchHopper(plan, t.kernel, hidden, lmHead, numRows, p.hiddenSize, vocabSize,
            {wsMax, nullptr, nullptr, wsMax, wsIndex, wsMax, wsMax, wsMax, wsIndex, 0},
            static_cast<char*>(p.workspace) + argmaxBlockOffset(numRows, splits), stream)
        : launch(t.kernel, cdiv(numRows, t.blockN), splits,
            {&hidden, &lmHead, &wsMax, &wsIndex, &numRows, &vocabSize, &splits, &tilesPerSplit, &strideHn, &strideVv},
            stream);
    if (status != cudaSuccess)
    {
        return status;
    }
    int64_t* tokens = p.tokens;
    float* maxLogit = p.maxLogit;
    return launch(plan.finalize->kernel, cdiv(numRows, plan.finalize->blockR), 1,
        {&wsMax, &wsIndex, &tokens, &maxLogit, &numRows, &splits}, stream);
}

namespace
{

//! The arguments a verify launch passes (kernels/aot.py RUNTIME_ARGS), as addressable locals.
//! `softmax`: the tile kernel forms the online softmax (log-probabilities, or top-p's normaliser).
struct VerifyArgs
{
    void const* hidden;
    void const* lmHead;
    float const* temperature;
    int64_t const* seed;
    int64_t const* positions;
    float* wsFloat;         // [4, numRows, splits]: best score, best logit, max, sum-exp
    int32_t* wsIndex;       // [numRows, splits]: the native kernels' layout
    int32_t const* allowed; // the mask, or any pointer where the kernel is not MASKED (never read)
    int32_t numRows;
    int32_t gamma;
    int32_t vocabSize;
    int32_t splits;
    int32_t tilesPerSplit;
    int32_t numWords;
    int32_t strideHn; // hidden [batch, γ + 1, H] and lm_head [V, H] contiguous
    int32_t strideHi;
    int32_t strideVv;
    int32_t kernel; // the row's variant: plain, softmax, masked or both
};

VerifyArgs verifyArgs(VerifyResampleParams const& p, Plan const& plan, bool softmax)
{
    TileConfig const& t = *plan.tile;
    VerifyArgs a{};
    a.hidden = p.hidden;
    a.lmHead = p.lmHead;
    a.temperature = p.temperature;
    a.seed = p.seed;
    a.positions = p.positions;
    a.numRows = p.batch * (p.gamma + 1);
    a.gamma = p.gamma;
    a.vocabSize = p.vocabSize;
    a.splits = plan.splits;
    a.tilesPerSplit = cdiv(cdiv(p.vocabSize, t.blockV), plan.splits);
    a.numWords = cdiv(p.vocabSize, 32);
    a.strideHn = (p.gamma + 1) * p.hiddenSize;
    a.strideHi = p.hiddenSize;
    a.strideVv = p.hiddenSize;
    a.wsFloat = static_cast<float*>(p.workspace);
    a.wsIndex = reinterpret_cast<int32_t*>(a.wsFloat + 4 * static_cast<size_t>(a.numRows) * plan.splits);
    a.allowed = p.allowedTokens != nullptr ? p.allowedTokens : a.wsIndex;
    a.kernel = p.allowedTokens != nullptr ? (softmax ? t.maskedLogprobsKernel : t.maskedKernel)
                                          : (softmax ? t.logprobsKernel : t.kernel);
    return a;
}

//! VerifyResample's stage 1 by the Hopper kernel a.kernel: the summaries in the workspace's four
//! float planes and index plane, its row scratch and whole row block; with `handIn` (top-k / top-p)
//! the truncated rows hand in their dots (a HAND_IN kernel).
cudaError_t launchVerifyHopper(VerifyResampleParams const& p, Plan const& plan, VerifyArgs const& a,
    HandInBuffers const* handIn, cudaStream_t stream)
{
    size_t const plane = static_cast<size_t>(a.numRows) * a.splits;
    auto* rowScratch
        = reinterpret_cast<int32_t*>(static_cast<char*>(p.workspace) + rowScratchOffset(a.numRows, a.splits));
    HopperArgs h{a.temperature, a.seed, a.positions, a.wsFloat, a.wsIndex, a.wsFloat + plane, a.wsFloat + 2 * plane,
        a.wsFloat + 3 * plane, rowScratch, a.gamma, a.allowed};
    if (handIn != nullptr)
    {
        h.truncated = handIn->truncated;
        h.thresholds = handIn->thresholds;
        h.counts = handIn->counts;
        h.keys = handIn->keys;
    }
    return launchHopper(plan, a.kernel, a.hidden, a.lmHead, a.numRows, p.hiddenSize, a.vocabSize, h,
        static_cast<char*>(p.workspace) + verifyBlockOffset(a.numRows, a.splits), stream);
}

} // namespace

cudaError_t launchVerifyResample(VerifyResampleParams const& p, Plan const& plan, cudaStream_t stream)
{
    VerifyArgs a = verifyArgs(p, plan, p.logprobs != nullptr);
    cudaError_t status = cudaSuccess;
    if (plan.tile->blockK > 0)
    {
        status = launchVerifyHopper(p, plan, a, nullptr, stream);
    }
    else
    {
        status = launch(a.kernel, cdiv(a.numRows, plan.tile->blockN), a.splits,
            {&a.hidden, &a.lmHead, &a.temperature, &a.seed, &a.positions, &a.wsFloat, &a.wsIndex, &a.allowed,
                &a.numRows, &a.gamma, &a.vocabSize, &a.splits, &a.tilesPerSplit, &a.numWords, &a.strideHn,
                &a.strideHi, &a.strideVv},
            stream);
    }
    return status == cudaSuccess ? launchVerifyFinalize(p, plan, stream) : status;
}

cudaError_t launchVerifyTruncated(
    VerifyResampleParams const& p, Plan const& plan, HandInBuffers const& b, cudaStream_t stream)
{
    // The softmax variants also serve top-p: its normaliser is the online softmax (verify_resample:
    // RETURN_LOGPROBS = return_logprobs or top_p).
    VerifyArgs a = verifyArgs(p, plan, p.logprobs != nullptr || p.topP != nullptr);
    // A pointer a kernel is not compiled to read stands in for an absent top_k / top_p / mask.
    int64_t const* topK = p.topK != nullptr ? p.topK : a.seed;
    float const* topP = p.topP != nullptr ? p.topP : a.temperature;
    int32_t* truncated = b.truncated;
    float* partials = b.partials;
    float* thresholds = b.thresholds;
    int32_t* counts = b.counts;
    int64_t* keys = b.keys;

    // The sampled logits: [kSplits, R, ceil(V / kHandInStride)] partials (sampled_logits).
    SampledConfig const& sc = *plan.sampled;
    void const* hidden = a.hidden;
    void const* lmHead = a.lmHead;
    int32_t numSampled = cdiv(a.vocabSize, kHandInStride);
    int32_t hiddenSize = a.strideHi;
    int32_t kSplits = std::min(sc.kSplits, cdiv(hiddenSize, sc.blockK));
    int32_t kRun = cdiv(cdiv(hiddenSize, sc.blockK), kSplits) * sc.blockK;
    cudaError_t status = launch(sc.kernel, cdiv(numSampled, sc.blockS), cdiv(a.numRows, sc.blockR),
        {&hidden, &lmHead, &partials, &a.numRows, &numSampled, &hiddenSize, &a.strideHi, &a.strideVv, &kRun}, stream,
        kSplits);
    // The thresholds, the truncated flags and the zeroed counts (_hand_in_thresholds).
    int32_t width = a.gamma + 1;
    if (status == cudaSuccess)
    {
        status = launch(plan.threshold->kernel, a.numRows, 1,
            {&partials, &a.allowed, &topK, &topP, &truncated, &thresholds, &counts, &a.numRows, &width, &a.vocabSize,
                &a.numWords, &numSampled, &kSplits},
            stream);
    }
    // The tile pass: the truncated sequences' rows hand in every dot at or above their threshold.
    if (status == cudaSuccess && plan.tile->blockK > 0)
    {
        status = launchVerifyHopper(p, plan, a, &b, stream);
    }
    else if (status == cudaSuccess)
    {
        status = launch(a.kernel, cdiv(a.numRows, plan.tile->blockN), a.splits,
            {&a.hidden, &a.lmHead, &a.temperature, &a.seed, &a.positions, &a.wsFloat, &a.wsIndex, &truncated,
                &a.allowed, &thresholds, &counts, &keys, &a.numRows, &a.gamma, &a.vocabSize, &a.splits,
                &a.tilesPerSplit, &a.numWords, &a.strideHn, &a.strideHi, &a.strideVv},
            stream);
    }
    if (status != cudaSuccess)
    {
        return status;
    }
    // Stage 2, one program per row, on the hand-in (verify_resample.settle_shape).
    int32_t* unsettled = b.unsettled;
    int64_t* selected = b.selected;
    int32_t numKept = kMaxKept;
    return launch(plan.settle->kernel, a.numRows, 1,
        {&a.wsFloat, &a.wsIndex, &keys, &truncated, &topK, &topP, &a.temperature, &a.seed, &a.positions, &unsettled,
            &selected, &a.numRows, &width, &a.splits, &numKept, &counts, &thresholds},
        stream);
}

cudaError_t launchVerifyFinalize(VerifyResampleParams const& p, Plan const& plan, cudaStream_t stream)
{
    VerifyArgs a = verifyArgs(p, plan, false);
    int64_t const* drafts = p.draftTokens; // [batch, γ]; never read when γ = 0
    int64_t* tokens = p.tokens;
    int64_t* numEmitted = p.numEmitted;
    float* logprobsOut = p.logprobs; // never written without log-probabilities
    int32_t strideDn = a.gamma;
    return launch(plan.finalize->kernel, p.batch, 1,
        {&a.wsFloat, &a.wsIndex, &drafts, &tokens, &numEmitted, &logprobsOut, &a.numRows, &a.gamma, &a.splits,
            &strideDn},
        stream);
}

} // namespace aot

cudaError_t prepareKernels()
{
    return aot::prepare();
}

} // namespace flashspec
