/*
 * VerifyResample in one pass over the LM head (contract: docs/DESIGN.md; specification:
 * flashspec_export/reference/verify_resample.py).
 *
 * Stage 1, grid (vocabulary splits x blocks of ROWS flattened rows n * (gamma + 1) + i): each
 * warp computes fp32 logits l = dot / T (IEEE division, as the reference) for U vocabulary ids
 * at a time; lane r keeps row r's running Gumbel-max sample y = argmax_v (l_v + g_v) (g: Gumbel
 * noise keyed by (seed, position + i, v); greedy rows: argmax_v l_v), lowest id on ties. Only
 * with log-probabilities (LOGPROBS) does it also keep l(y) and the online max / sum-exp: without
 * them no exp is spent per logit. Warps merge through shared memory and write one summary per
 * (row, split). Stage 2 (one thread per sequence) merges the splits in order, accepts the draft
 * x iff x == y_i, left to right, and writes y_0 .. y_k (and l(y_i) - LSE_i). Nothing
 * vocabulary-sized is written: the workspace is 20 bytes per (row, split).
 */
#include "../common/flashspecKernels.h"
#include "../common/flashspecNoise.cuh"
#include "../common/launch.cuh"
#include "../common/tritonAot.h"

#include <cmath>

namespace flashspec
{
namespace
{

//! Temperatures below this are greedy rows (reference.verify_resample.GREEDY_BELOW, compared in fp32).
constexpr float kGreedyBelow = 1e-5f;

struct Summary
{
    float bestScore = -INFINITY; // l(y) + g(y) (greedy: l(y))
    int32_t bestIndex = -1;      // y
    float bestLogit = 0.0f;      // l(y)                 (log-probabilities only)
    float m = -INFINITY;         // running max logit    (log-probabilities only)
    float s = 0.0f;              // sum of exp(l - m)    (log-probabilities only)
};

__device__ __forceinline__ void mergeSoftmax(float& m, float& s, float m2, float s2)
{
    if (m2 == -INFINITY)
    {
        return;
    }
    if (m == -INFINITY)
    {
        m = m2;
        s = s2;
        return;
    }
    float const mNew = fmaxf(m, m2);
    s = s * expf(m - mNew) + s2 * expf(m2 - mNew);
    m = mNew;
}

//! Fold one logit into (m, s): one exp per element. A -inf logit adds nothing (while m is still
//! -inf, expf(-inf - -inf) would make s NaN); a +inf one makes s NaN, as the reference's LSE.
__device__ __forceinline__ void addLogit(float& m, float& s, float logit)
{
    if (logit > m)
    {
        s = s * expf(m - logit) + 1.0f; // m = -inf at first: s = 0 * 0 + 1
        m = logit;
    }
    else if (logit != -INFINITY)
    {
        s += expf(logit - m);
    }
}

//! Keep (score, index) if it beats the best so far: higher score, or equal and a lower id.
__device__ __forceinline__ void mergeBest(Summary& a, float score, int32_t index, float logit)
{
    if (index >= 0 && (a.bestIndex < 0 || score > a.bestScore || (score == a.bestScore && index < a.bestIndex)))
    {
        a.bestScore = score;
        a.bestIndex = index;
        a.bestLogit = logit;
    }
}

struct VerifyWorkspace
{
    float* bestScore; // each [numRows, numSplits]
    float* bestLogit; // the last three only written with log-probabilities
    float* m;
    float* s;
    int32_t* bestIndex;
};

VerifyWorkspace verifyWorkspace(void* workspace, int32_t numRows, int32_t numSplits)
{
    size_t const count = static_cast<size_t>(numRows) * numSplits;
    auto* f = static_cast<float*>(workspace);
    return {f, f + count, f + 2 * count, f + 3 * count, reinterpret_cast<int32_t*>(f + 4 * count)};
}

struct RowInputs
{
    int64_t const* draftTokens; // [batch, gamma]
    float const* temperature;   // [batch]
    int64_t const* seed;        // [batch]
    int64_t const* positions;   // [batch]
    int32_t gamma;
};

template <typename T, int ROWS, int VEC, bool MMA, bool LOGPROBS>
__global__ void __launch_bounds__(kThreads) verifyTilesKernel(T const* hidden, T const* lmHead, RowInputs in,
    VerifyWorkspace ws, int numRows, int hiddenSize, int vocabSize)
{
    extern __shared__ __align__(128) unsigned char smemRaw[];
    __shared__ Summary warpSummary[kWarps][32];
    T* smemHidden = reinterpret_cast<T*>(smemRaw);
    int const row0 = blockIdx.x * ROWS; // row blocks run fastest: they share LM-head tiles in L2
    if constexpr (!MMA)
    {
        stageHidden<T, ROWS>(smemHidden, hidden, row0, numRows, hiddenSize);
    }

    int const warp = threadIdx.x >> 5;
    int const lane = threadIdx.x & 31;
    // The constants of the row this lane serves (lanes serving none, or rows past the end,
    // take the last row's: their summaries are never written out).
    int const blockRow = laneBlockRow<ROWS, MMA>(lane);
    int const row = min(row0 + max(blockRow, 0), numRows - 1);
    int const rowsPerSeq = in.gamma + 1;
    int const n = row / rowsPerSeq;
    int const i = row - n * rowsPerSeq;
    float const temperature = in.temperature[n];
    bool const greedy = temperature < kGreedyBelow; // reference.verify_resample.GREEDY_BELOW
    float const scale = greedy ? 1.0f : temperature;
    RowKeys const keys = rowKeys(in.seed[n], in.positions[n] + i, kStreamGumbel);

    int begin, end;
    splitRange(vocabSize, gridDim.y, blockIdx.y, begin, end);
    Summary sum;
    streamVocab<T, ROWS, VEC, MMA>(hidden, smemHidden, smemRaw, lmHead, row0, numRows, begin, end, hiddenSize, vocabSize, [&](int v, float dot) {
        // A NaN logit counts as -inf (reference no_nan); IEEE division, as the reference.
        float const logit = __fdiv_rn(isnan(dot) ? -INFINITY : dot, scale);
        if constexpr (LOGPROBS)
        {
            addLogit(sum.m, sum.s, logit);
        }
        mergeBest(sum, greedy ? logit : logit + gumbelFromBits(tokenBits(keys, v)), v, logit);
    });
    warpSummary[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && lane < ROWS && row0 + lane < numRows)
    {
        Summary total;
        for (int w = 0; w < kWarps; ++w)
        {
            for (int l = lane; l < 32; l += laneStride<ROWS, MMA>()) // the lanes that served this row
            {
                Summary const& x = warpSummary[w][l];
                mergeBest(total, x.bestScore, x.bestIndex, x.bestLogit);
                if constexpr (LOGPROBS)
                {
                    mergeSoftmax(total.m, total.s, x.m, x.s);
                }
            }
        }
        size_t const slot = static_cast<size_t>(row0 + lane) * gridDim.y + blockIdx.y;
        ws.bestScore[slot] = total.bestScore;
        ws.bestIndex[slot] = total.bestIndex;
        if constexpr (LOGPROBS)
        {
            ws.bestLogit[slot] = total.bestLogit;
            ws.m[slot] = total.m;
            ws.s[slot] = total.s;
        }
    }
}

__global__ void verifyFinalizeKernel(VerifyWorkspace ws, RowInputs in, int64_t* tokens, int64_t* numEmitted,
    float* logprobs, int batch, int numSplits)
{
    int const n = blockIdx.x * blockDim.x + threadIdx.x;
    if (n >= batch)
    {
        return;
    }
    int const gamma = in.gamma;
    int k = 0; // leading accepted drafts; rows 0 .. k are emitted
    for (int i = 0; i <= gamma; ++i)
    {
        size_t const out = static_cast<size_t>(n) * (gamma + 1) + i;
        if (i > k)
        {
            tokens[out] = -1;
            if (logprobs != nullptr)
            {
                logprobs[out] = 0.0f;
            }
            continue;
        }
        size_t const base = out * numSplits;
        int t0 = 0; // y_i: the best split's candidate; splits ascend, so strict > keeps the lowest id
        for (int t = 1; t < numSplits; ++t)
        {
            if (ws.bestIndex[base + t] >= 0
                && (ws.bestIndex[base + t0] < 0 || ws.bestScore[base + t] > ws.bestScore[base + t0]))
            {
                t0 = t;
            }
        }
        int64_t const y = ws.bestIndex[base + t0];
        tokens[out] = y; // an accepted draft (x == y), or the recovered / bonus token
        if (logprobs != nullptr)
        {
            // As the reference: m = max over splits, then s = sum of s_t exp(m_t - m).
            float m = -INFINITY;
            for (int t = 0; t < numSplits; ++t)
            {
                m = fmaxf(m, ws.m[base + t]);
            }
            float s = 0.0f;
            for (int t = 0; t < numSplits; ++t)
            {
                if (ws.m[base + t] != -INFINITY)
                {
                    s += ws.s[base + t] * expf(ws.m[base + t] - m);
                }
            }
            logprobs[out] = ws.bestLogit[base + t0] - (m + logf(s));
        }
        if (i < gamma && in.draftTokens[n * gamma + i] == y)
        {
            ++k;
        }
    }
    numEmitted[n] = k + 1;
}

bool validParams(VerifyResampleParams const& p)
{
    int64_t const numRows = static_cast<int64_t>(p.batch) * (p.gamma + 1);
    return p.batch > 0 && p.gamma >= 0 && numRows <= (1 << 30) && p.hiddenSize > 0 && p.vocabSize > 0
        && validDtype(p.dtype) && p.numSplits >= 0;
}

} // namespace

int32_t verifyResamplePath(VerifyResampleParams const& p)
{
    aot::Plan plan;
    return validParams(p) && aot::planVerifyResample(p, plan) ? aot::pathOf(plan) : FLASHSPEC_PATH_NATIVE;
}

size_t getVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize)
{
    return aot::verifyBlockOffset(numRows, numSplits) + aot::wholeBlockBytes(hiddenSize);
}

cudaError_t invokeVerifyResample(VerifyResampleParams const& p, cudaStream_t stream)
{
    if (!validParams(p))
    {
        return cudaErrorInvalidValue;
    }
    if (aot::Plan aotPlan; aot::planVerifyResample(p, aotPlan))
    {
        return aot::launchVerifyResample(p, aotPlan, stream); // the compiled Triton kernels
    }
    aot::warnNative(FLASHSPEC_OP_VERIFY_RESAMPLE, p.dtype, p.hiddenSize);
    int32_t const numRows = p.batch * (p.gamma + 1);
    LaunchPlan const plan = planLaunch(FLASHSPEC_OP_VERIFY_RESAMPLE, p.hidden, p.lmHead, numRows, p.hiddenSize, p.vocabSize, p.dtype, p.numSplits);
    if (!plan.mma && !hiddenFits(p.hiddenSize, p.dtype, hiddenSmemLimit()))
    {
        return cudaErrorInvalidValue; // the FMA path stages hidden rows in shared memory; the tensor-core path does not
    }
    int32_t const splits = plan.splits;
    VerifyWorkspace const ws = verifyWorkspace(p.workspace, numRows, splits);
    RowInputs const in{p.draftTokens, p.temperature, p.seed, p.positions, p.gamma};
    cudaError_t const status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
        auto launch = [&](auto kernel) {
            return launchTiles<T, ROWS, MMA>(kernel, numRows, p.hiddenSize, splits, stream,
                static_cast<T const*>(p.hidden), static_cast<T const*>(p.lmHead), in, ws, static_cast<int>(numRows),
                static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
        };
        return p.logprobs != nullptr ? launch(verifyTilesKernel<T, ROWS, VEC, MMA, true>)
                                     : launch(verifyTilesKernel<T, ROWS, VEC, MMA, false>);
    });
    if (status != cudaSuccess)
    {
        return status;
    }
    verifyFinalizeKernel<<<(p.batch + 63) / 64, 64, 0, stream>>>(
        ws, in, p.tokens, p.numEmitted, p.logprobs, p.batch, splits);
    return cudaGetLastError();
}

} // namespace flashspec
