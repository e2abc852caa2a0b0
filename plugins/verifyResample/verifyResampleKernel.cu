/*
 * VerifyResample in one pass over the LM head (contract: DESIGN.md; specification:
 * flashspec_export/reference/verify_resample.py).
 *
 * Stage 1, grid (vocabulary splits x blocks of ROWS flattened rows n * (gamma + 1) + i): each
 * warp computes fp32 logits l = dot / T (IEEE division, as the reference) for U vocabulary ids
 * at a time; lane r keeps row r's running summary: online max / sum-exp, the drafted token's
 * logit, and the best candidate score l + g (g: Gumbel noise keyed by (seed, position + i, v);
 * greedy rows: l) with the draft excluded on sampled rows. Warps merge through shared memory and
 * write one summary per (row, split). Stage 2 (one thread per sequence) merges the splits in
 * order, forms LSE, accepts drafts left to right (u <= exp(l(x) - LSE); greedy: x == argmax) and
 * writes the tokens. Nothing vocabulary-sized is written: the workspace is 24 bytes per
 * (row, split).
 */
#include "../common/flashspecKernels.h"
#include "../common/flashspecNoise.cuh"
#include "../common/launch.cuh"

#include <cmath>

namespace flashspec
{
namespace
{

struct Summary
{
    float m = -INFINITY;         // running max logit
    float s = 0.0f;              // sum of exp(l - m)
    float draftLogit = -INFINITY; // l(x) once x was seen
    float bestScore = -INFINITY;
    float bestLogit = 0.0f;
    int32_t bestIndex = -1;
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

//! Fold one logit into (m, s): one exp per element.
__device__ __forceinline__ void addLogit(float& m, float& s, float logit)
{
    if (logit > m)
    {
        s = s * expf(m - logit) + 1.0f; // m = -inf at first: s = 0 * 0 + 1
        m = logit;
    }
    else
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
    float* m;          // each [numRows, numSplits]
    float* s;
    float* draftLogit;
    float* bestScore;
    float* bestLogit;
    int32_t* bestIndex;
};

VerifyWorkspace verifyWorkspace(void* workspace, int32_t numRows, int32_t numSplits)
{
    size_t const count = static_cast<size_t>(numRows) * numSplits;
    auto* f = static_cast<float*>(workspace);
    return {f, f + count, f + 2 * count, f + 3 * count, f + 4 * count, reinterpret_cast<int32_t*>(f + 5 * count)};
}

struct RowInputs
{
    int64_t const* draftTokens; // [batch, gamma]
    float const* temperature;   // [batch]
    int64_t const* seed;        // [batch]
    int64_t const* positions;   // [batch]
    int32_t gamma;
};

template <typename T, int ROWS, int VEC, bool MMA>
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
    bool const greedy = temperature == 0.0f;
    float const scale = greedy ? 1.0f : temperature;
    int64_t const excluded = i < in.gamma ? in.draftTokens[n * in.gamma + i] : -1;
    RowKeys const keys = rowKeys(in.seed[n], in.positions[n] + i, kStreamGumbel);

    int begin, end;
    splitRange(vocabSize, gridDim.y, blockIdx.y, begin, end);
    Summary sum;
    streamVocab<T, ROWS, VEC, MMA>(hidden, smemHidden, smemRaw, lmHead, row0, numRows, begin, end, hiddenSize, vocabSize, [&](int v, float dot) {
        float const logit = __fdiv_rn(dot, scale); // IEEE division, as the reference
        addLogit(sum.m, sum.s, logit);
        bool const isDraft = v == excluded;
        if (isDraft)
        {
            sum.draftLogit = logit;
        }
        if (greedy)
        {
            mergeBest(sum, logit, v, logit);
        }
        else if (!isDraft)
        {
            mergeBest(sum, logit + gumbelFromBits(tokenBits(keys, v)), v, logit);
        }
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
                mergeSoftmax(total.m, total.s, x.m, x.s);
                total.draftLogit = fmaxf(total.draftLogit, x.draftLogit);
                mergeBest(total, x.bestScore, x.bestIndex, x.bestLogit);
            }
        }
        size_t const slot = static_cast<size_t>(row0 + lane) * gridDim.y + blockIdx.y;
        ws.m[slot] = total.m;
        ws.s[slot] = total.s;
        ws.draftLogit[slot] = total.draftLogit;
        ws.bestScore[slot] = total.bestScore;
        ws.bestLogit[slot] = total.bestLogit;
        ws.bestIndex[slot] = total.bestIndex;
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
    bool const greedy = in.temperature[n] == 0.0f;
    int k = 0;              // leading accepted drafts
    bool rejected = false;
    for (int i = 0; i <= gamma && !rejected; ++i)
    {
        size_t const base = (static_cast<size_t>(n) * (gamma + 1) + i) * numSplits;
        // As the reference: m = max over splits, then s = sum of s_t exp(m_t - m).
        float m = -INFINITY;
        for (int t = 0; t < numSplits; ++t)
        {
            m = fmaxf(m, ws.m[base + t]);
        }
        float s = 0.0f;
        float draftLogit = -INFINITY;
        Summary best;
        for (int t = 0; t < numSplits; ++t)
        {
            if (ws.m[base + t] != -INFINITY)
            {
                s += ws.s[base + t] * expf(ws.m[base + t] - m);
            }
            draftLogit = fmaxf(draftLogit, ws.draftLogit[base + t]);
            if (ws.bestIndex[base + t] >= 0 && (best.bestIndex < 0 || ws.bestScore[base + t] > best.bestScore))
            {
                best.bestScore = ws.bestScore[base + t]; // splits ascend: strict > keeps the lowest id
                best.bestIndex = ws.bestIndex[base + t];
                best.bestLogit = ws.bestLogit[base + t];
            }
        }
        float const lse = m + logf(s);
        bool accept = false;
        if (i < gamma)
        {
            int64_t const draft = in.draftTokens[n * gamma + i];
            if (greedy)
            {
                accept = draft == best.bestIndex;
            }
            else
            {
                RowKeys const keys = rowKeys(in.seed[n], in.positions[n] + i, kStreamAccept);
                accept = uniformFromBits(tokenBits(keys, 0)) <= expf(draftLogit - lse);
            }
            if (accept)
            {
                tokens[n * (gamma + 1) + i] = draft;
                if (logprobs != nullptr)
                {
                    logprobs[n * (gamma + 1) + i] = draftLogit - lse;
                }
                ++k;
                continue;
            }
        }
        tokens[n * (gamma + 1) + i] = best.bestIndex; // the recovered (or bonus) token
        if (logprobs != nullptr)
        {
            logprobs[n * (gamma + 1) + i] = best.bestLogit - lse;
        }
        rejected = true;
    }
    for (int j = k + 1; j <= gamma; ++j)
    {
        tokens[n * (gamma + 1) + j] = -1;
        if (logprobs != nullptr)
        {
            logprobs[n * (gamma + 1) + j] = 0.0f;
        }
    }
    numEmitted[n] = k + 1;
}

} // namespace

size_t getVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits)
{
    return static_cast<size_t>(numRows) * numSplits * (5 * sizeof(float) + sizeof(int32_t));
}

cudaError_t invokeVerifyResample(VerifyResampleParams const& p, cudaStream_t stream)
{
    int64_t const numRows64 = static_cast<int64_t>(p.batch) * (p.gamma + 1);
    if (p.batch <= 0 || p.gamma < 0 || numRows64 > (1 << 30) || p.hiddenSize <= 0 || p.vocabSize <= 0
        || !validDtype(p.dtype) || !hiddenFits(p.hiddenSize, p.dtype) || p.numSplits < 0)
    {
        return cudaErrorInvalidValue;
    }
    int32_t const numRows = static_cast<int32_t>(numRows64);
    LaunchPlan const plan = planLaunch(p.hidden, p.lmHead, numRows, p.hiddenSize, p.vocabSize, p.dtype, p.numSplits);
    int32_t const splits = plan.splits;
    VerifyWorkspace const ws = verifyWorkspace(p.workspace, numRows, splits);
    RowInputs const in{p.draftTokens, p.temperature, p.seed, p.positions, p.gamma};
    cudaError_t const status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
        return launchTiles<T, ROWS, MMA>(verifyTilesKernel<T, ROWS, VEC, MMA>, numRows, p.hiddenSize, splits, stream,
            static_cast<T const*>(p.hidden), static_cast<T const*>(p.lmHead), in, ws, static_cast<int>(numRows),
            static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
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
