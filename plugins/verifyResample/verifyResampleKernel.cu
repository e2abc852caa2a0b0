/*
 * VerifyResample in one pass over the LM head (contract: docs/DESIGN.md; specification:
 * flashspec_export/reference/verify_resample.py).
 *
 * Stage 1, grid (vocabulary splits of whole 64-id blocks x blocks of ROWS flattened rows
 * n * (gamma + 1) + i): each warp computes fp32 logits l = dot / T (IEEE division, as the
 * reference) for U vocabulary ids at a time, kChunkIds ids per pass; greedy rows keep the running
 * argmax in their lane (lowest id on ties), sampled rows park their logits in shared memory and
 * four lanes per (row, 64-id block) take the block's two-level sample (blockSampleRun: its score
 * M + log S + g and its pick, the reference's order of running sums), folded per row in block
 * order. Only with log-probabilities (LOGPROBS) does it also keep l(y) and the online max /
 * sum-exp. Warps merge through shared memory and write one summary per (row, split). Stage 2 (one thread per sequence) merges the splits in order, accepts the draft
 * x iff x == y_i, left to right, and writes y_0 .. y_k (and l(y_i) - LSE_i). Nothing
 * vocabulary-sized is written: the workspace is 20 bytes per (row, split).
 */
#include "../common/flashspecKernels.h"
#include "../common/flashspecNoise.cuh"
#include "../common/launch.cuh"
#include "../common/tritonAot.h"
#include "truncation.cuh"

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

constexpr int kSampleRun = 16;  // reference.verify_resample.SAMPLE_RUN
constexpr int kChunkIds = 128; // ids a stage-1 CTA streams before sampling their blocks

constexpr int kRuns = kSampleBlock / kSampleRun; // the lanes of one block's sample

//! The two-level sample of one block (reference.verify_resample.block_samples), taken by the
//! kRuns consecutive lanes of a group (lane & (kRuns - 1) = the run): each lane holds the
//! `count` (0..16) logits of its run of 16 ids in id order (the rest are -inf). Returns, on every
//! lane of the group, the block's score s_b = M + log S + g_b and its pick (0..63). Running sums
//! in the reference's order: in order inside each run, plus the sum of the runs before it, also
//! formed in order. Every lane of the warp must call it (shuffles over the whole warp).
__device__ __forceinline__ void blockSampleRun(
    float const* run, int count, RowKeys g, RowKeys u, uint64_t block, float& score, int& pick)
{
    int const q = threadIdx.x & (kRuns - 1);
    float m = -INFINITY;
    int firstInf = kSampleBlock;
    for (int j = 0; j < kSampleRun; ++j)
    {
        float const x = j < count ? run[j] : -INFINITY;
        m = fmaxf(m, x);
        firstInf = x == INFINITY && firstInf == kSampleBlock ? q * kSampleRun + j : firstInf;
    }
    for (int offset = 1; offset < kRuns; offset <<= 1) // the block's max and first +inf: any order
    {
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
        firstInf = min(firstInf, __shfl_xor_sync(0xffffffffu, firstInf, offset));
    }
    bool const finite = m != INFINITY && m != -INFINITY;
    float const shift = finite ? m : 0.0f;
    float c[kSampleRun];
    for (int j = 0; j < kSampleRun; ++j) // this run's sums, in order
    {
        float const e = finite && j < count ? expf(run[j] - shift) : 0.0f;
        c[j] = j == 0 ? e : c[j - 1] + e;
    }
    // The runs' totals, each from its lane; the sums of the runs before, in order.
    int const first = (threadIdx.x & 31) & ~(kRuns - 1);
    float before = 0.0f;
    float total = 0.0f;
    for (int r = 0; r < kRuns; ++r)
    {
        float const t = __shfl_sync(0xffffffffu, c[kSampleRun - 1], first + r);
        before = r == q ? total : before;
        total = total + t;
    }
    float const target = uniformFromBits(tokenBits(u, block)) * total;
    int below = 0;
    for (int j = 0; j < kSampleRun; ++j)
    {
        below += before + c[j] <= target;
    }
    for (int offset = 1; offset < kRuns; offset <<= 1)
    {
        below += __shfl_xor_sync(0xffffffffu, below, offset);
    }
    if (!finite) // a +inf wins with its first id; no finite logit: -inf
    {
        score = m;
        pick = m == INFINITY ? firstInf : 0;
        return;
    }
    pick = below; // total > 0: a finite max contributes exp(0) = 1
    score = m + logf(total) + gumbelFromBits(tokenBits(g, block));
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
    int64_t const* draftTokens;   // [batch, gamma]
    float const* temperature;     // [batch]
    int64_t const* seed;          // [batch]
    int64_t const* positions;     // [batch]
    int64_t const* topK;          // [batch] or nullptr
    float const* topP;            // [batch] or nullptr
    uint32_t const* allowed;      // [batch * (gamma + 1), words] or nullptr
    int32_t gamma;
    int32_t words;                // ceil(vocabSize / 32)
};

//! The row truncates by top-k or top-p (a mask alone is applied in the tile pass as -inf logits).
__device__ __forceinline__ bool truncatesRow(RowInputs const& in, int n)
{
    return (in.topK != nullptr && in.topK[n] > 0) || (in.topP != nullptr && in.topP[n] < 1.0f);
}

//! The logit of id v in row `row`: dot / T (IEEE division, as the reference), NaN as -inf
//! (reference no_nan), and (MASK) -inf where the row's mask does not allow v.
template <bool MASK>
__device__ __forceinline__ float rowLogit(RowInputs const& in, int row, float scale, int v, float dot)
{
    float logit = __fdiv_rn(isnan(dot) ? -INFINITY : dot, scale);
    if (MASK && in.allowed != nullptr)
    {
        uint32_t const word = __ldg(in.allowed + static_cast<size_t>(row) * in.words + (v >> 5));
        logit = (word >> (v & 31)) & 1u ? logit : -INFINITY;
    }
    return logit;
}

//! Dynamic shared memory the hand-in reuses once the stream is done: every lane's keys and floor.
constexpr size_t kHandInSmemBytes = static_cast<size_t>(kThreads) * (trunc::kLaneKeys + 1) * sizeof(int64_t);

//! The end of a truncating tile pass: the kCandidates largest keys of each row of the block over
//! the lanes that served it, in descending order, and the split's floor (the largest lane floor
//! and the largest key not handed in). keys: kHandInSmemBytes of shared memory no warp reads any
//! more (the caller synchronised after the stream).
template <int ROWS, bool MMA>
__device__ __forceinline__ void handInCandidates(
    trunc::LaneKeys const& mine, int64_t* keys, trunc::Workspace tw, int row0, int numRows)
{
    using trunc::kCandidates;
    using trunc::kEmptyKey;
    using trunc::kLaneKeys;
    constexpr int kStride = laneStride<ROWS, MMA>();  // lanes of one row in a warp: r, r + kStride, ...
    constexpr int kPerWarp = 32 / kStride;
    constexpr int kGathered = kWarps * kPerWarp * kLaneKeys; // 64 or 128 keys per row
    static_assert(kGathered >= kCandidates, "the hand-in takes kCandidates keys of the lanes'");
    __shared__ int64_t extra[32]; // the largest key a row's hand-in left out
    int64_t* floors = keys + kThreads * kLaneKeys;
#pragma unroll
    for (int j = 0; j < kLaneKeys; ++j)
    {
        keys[threadIdx.x * kLaneKeys + j] = mine.key[j];
    }
    floors[threadIdx.x] = mine.floor;
    if (threadIdx.x < 32)
    {
        extra[threadIdx.x] = kEmptyKey;
    }
    __syncthreads();
    auto gathered = [&](int r, int g) {
        int const warp = g / (kPerWarp * kLaneKeys);
        int const rest = g - warp * kPerWarp * kLaneKeys;
        int const lane = r + (rest / kLaneKeys) * kStride;
        return keys[(warp * 32 + lane) * kLaneKeys + rest % kLaneKeys];
    };
    int const splits = gridDim.y;
    for (int idx = threadIdx.x; idx < ROWS * kGathered; idx += kThreads)
    {
        int const r = idx / kGathered;
        int const g = idx - r * kGathered;
        if (row0 + r >= numRows)
        {
            continue;
        }
        int64_t const x = gathered(r, g);
        int rank = 0; // keys are distinct but for kEmptyKey: the gathered index breaks ties
        for (int h = 0; h < kGathered; ++h)
        {
            int64_t const y = gathered(r, h);
            rank += y > x || (y == x && h < g);
        }
        size_t const slot = static_cast<size_t>(row0 + r) * splits + blockIdx.y;
        if (rank < kCandidates)
        {
            tw.candidates[slot * kCandidates + rank] = x;
        }
        else if (rank == kCandidates)
        {
            extra[r] = x;
        }
    }
    __syncthreads();
    if (threadIdx.x < ROWS && row0 + static_cast<int>(threadIdx.x) < numRows)
    {
        int const r = threadIdx.x;
        int64_t floor = extra[r];
        for (int w = 0; w < kWarps; ++w)
        {
            for (int l = 0; l < kPerWarp; ++l)
            {
                int64_t const f = floors[w * 32 + r + l * kStride];
                floor = f > floor ? f : floor;
            }
        }
        tw.floors[static_cast<size_t>(row0 + r) * splits + blockIdx.y] = floor;
    }
}

//! Stage 1. TRUNC (a call with a mask, top-k or top-p; the plain instances are the kernels as they
//! were before truncation): the mask applied as -inf logits; rows that truncate (top-k / top-p)
//! skip the noise, keep their order keys and hand in kCandidates of them per split with a floor
//! (truncation.cuh).
template <typename T, int ROWS, int VEC, bool MMA, bool LOGPROBS, bool TRUNC>
__global__ void __launch_bounds__(kThreads) verifyTilesKernel(T const* hidden, T const* lmHead, RowInputs in,
    VerifyWorkspace ws, trunc::Workspace tw, int numRows, int hiddenSize, int vocabSize)
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
    float const temperature = in.temperature[n];
    bool const greedy = temperature < kGreedyBelow; // reference.verify_resample.GREEDY_BELOW
    float const scale = greedy ? 1.0f : temperature;

    bool const truncated = TRUNC && truncatesRow(in, n);
    trunc::LaneKeys lane_keys;
    if constexpr (TRUNC)
    {
        lane_keys.init();
    }

    // The sampled rows' logits of a chunk, their blocks' samples, and (thread r) row r's best block.
    constexpr int kBlocks = kChunkIds / kSampleBlock;
    __shared__ float chunkLogits[ROWS][kChunkIds];
    __shared__ float blockScore[ROWS][kBlocks];
    __shared__ int32_t blockIndex[ROWS][kBlocks];
    __shared__ float blockLogit[ROWS][kBlocks];
    Summary rowBlocks;

    int begin, end;
    splitRange(vocabSize, gridDim.y, blockIdx.y, begin, end);
    Summary sum;
    for (int c0 = begin; c0 < end; c0 += kChunkIds)
    {
        int const c1 = min(c0 + kChunkIds, end);
        streamVocab<T, ROWS, VEC, MMA>(hidden, smemHidden, smemRaw, lmHead, row0, numRows, c0, c1, hiddenSize,
            vocabSize, [&](int v, float dot) {
                float const logit = rowLogit<TRUNC>(in, row, scale, v, dot);
                if constexpr (LOGPROBS)
                {
                    addLogit(sum.m, sum.s, logit);
                }
                if constexpr (TRUNC)
                {
                    if (truncated) // stage 2 samples the kept keys: no noise here
                    {
                        if (logit != -INFINITY)
                        {
                            lane_keys.add(trunc::orderKey(logit, v));
                        }
                        mergeBest(sum, logit, v, logit);
                        return;
                    }
                }
                if (greedy)
                {
                    mergeBest(sum, logit, v, logit);
                    return;
                }
                chunkLogits[blockRow][v - c0] = logit;
            });
        __syncthreads();
        static_assert(ROWS * kBlocks * kRuns <= kThreads, "one pass of block samples per chunk");
        {
            // kRuns lanes per (row, block): lane q takes the block's run q (every lane shuffles).
            int const group = threadIdx.x / kRuns;
            int const r = min(group / kBlocks, ROWS - 1);
            int const k = group % kBlocks;
            int const start = c0 + k * kSampleBlock;
            int const taskRow = min(row0 + r, numRows - 1);
            int const taskN = taskRow / rowsPerSeq;
            bool const sampled = group < ROWS * kBlocks && row0 + r < numRows && start < c1
                && in.temperature[taskN] >= kGreedyBelow && !(TRUNC && truncatesRow(in, taskN));
            int const q = threadIdx.x & (kRuns - 1);
            int const count = sampled ? max(0, min(kSampleRun, c1 - start - q * kSampleRun)) : 0;
            int64_t const position = in.positions[taskN] + (taskRow - taskN * rowsPerSeq);
            RowKeys const g = rowKeys(in.seed[taskN], position, kStreamGumbel);
            RowKeys const u = rowKeys(in.seed[taskN], position, kStreamPick);
            float const* logits = &chunkLogits[r][k * kSampleBlock];
            float score;
            int pick;
            blockSampleRun(logits + q * kSampleRun, count, g, u, start / kSampleBlock, score, pick);
            if (q == 0 && group < ROWS * kBlocks)
            {
                blockScore[r][k] = score;
                blockIndex[r][k] = sampled ? start + pick : -1;
                blockLogit[r][k] = sampled ? logits[pick] : 0.0f;
            }
        }
        __syncthreads();
        if (threadIdx.x < ROWS)
        {
            for (int k = 0; k < kBlocks; ++k) // in block order: ties go to the lower block
            {
                mergeBest(rowBlocks, blockScore[threadIdx.x][k], blockIndex[threadIdx.x][k],
                    blockLogit[threadIdx.x][k]);
            }
        }
    }
    warpSummary[warp][lane] = sum;
    __syncthreads();
    if (warp == 0 && lane < ROWS && row0 + lane < numRows)
    {
        Summary total = rowBlocks; // thread `lane` of warp 0 folded row `lane`'s blocks
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
    if constexpr (TRUNC)
    {
        if (tw.candidates != nullptr) // top-k / top-p inputs (a mask alone hands in nothing)
        {
            handInCandidates<ROWS, MMA>(lane_keys, reinterpret_cast<int64_t*>(smemRaw), tw, row0, numRows);
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

//! Rewrites row `row`'s summaries as one split: its sample y = (score, id, logit) over the kept
//! tokens and their (max, sum-exp) for the log-probability.
__device__ __forceinline__ void writeKept(
    VerifyWorkspace ws, int row, int numSplits, float score, int32_t id, float logit, float m, float s)
{
    size_t const base = static_cast<size_t>(row) * numSplits;
    for (int t = threadIdx.x; t < numSplits; t += blockDim.x)
    {
        ws.bestScore[base + t] = t == 0 ? score : -INFINITY;
        ws.bestIndex[base + t] = t == 0 ? id : -1;
        ws.bestLogit[base + t] = t == 0 ? logit : 0.0f;
        ws.m[base + t] = t == 0 ? m : -INFINITY;
        ws.s[base + t] = t == 0 ? s : 0.0f;
    }
}

//! The per-row truncation request.
struct RowRequest
{
    int n;
    int i;
    int64_t k;  // > 0: top-k on
    float p;    // < 1: top-p on
    bool on;
};

__device__ __forceinline__ RowRequest rowRequest(RowInputs const& in, int row)
{
    RowRequest r;
    r.n = row / (in.gamma + 1);
    r.i = row - r.n * (in.gamma + 1);
    r.k = in.topK != nullptr ? in.topK[r.n] : 0;
    r.p = in.topP != nullptr ? in.topP[r.n] : 1.0f;
    r.on = r.k > 0 || r.p < 1.0f;
    return r;
}

//! The noisy score of a kept token (greedy rows: its logit).
__device__ __forceinline__ float keptScore(RowInputs const& in, RowRequest const& r, float logit, int32_t id)
{
    float const temperature = in.temperature[r.n];
    if (temperature < kGreedyBelow)
    {
        return logit;
    }
    RowKeys const keys = rowKeys(in.seed[r.n], in.positions[r.n] + r.i, kStreamGumbel);
    return logit + gumbelFromBits(tokenBits(keys, id));
}

//! Stage 2 of a truncating call, one CTA per row (trunc::kSelectThreads threads): the kept set
//! from the handed-in keys when they settle it (truncation.cuh), the sample over it, the row's
//! summaries rewritten; else the row is flagged for the exact recompute.
__global__ void __launch_bounds__(trunc::kSelectThreads) settleKernel(
    VerifyWorkspace ws, trunc::Workspace tw, RowInputs in, int numSplits, int32_t* unsettledOut)
{
    using namespace trunc;
    int const row = blockIdx.x;
    RowRequest const req = rowRequest(in, row);
    auto flag = [&](int32_t value) {
        if (threadIdx.x == 0)
        {
            tw.unsettled[row] = value;
            if (unsettledOut != nullptr)
            {
                unsettledOut[row] = value;
            }
        }
    };
    if (!req.on)
    {
        flag(0);
        return;
    }
    __shared__ int64_t known[kKnownCap];
    __shared__ float weight[kKnownCap];
    __shared__ float scanA[kKnownCap];
    __shared__ float scanB[kKnownCap];
    __shared__ int64_t scratch64[32];
    __shared__ float scratchF[32];
    __shared__ int32_t scratchI[32];
    __shared__ int32_t count;

    size_t const numKeys = static_cast<size_t>(numSplits) * kCandidates;
    int64_t const* keys = tw.candidates + static_cast<size_t>(row) * numKeys;
    int64_t const* floors = tw.floors + static_cast<size_t>(row) * numSplits;

    // tau: every key above it was handed in
    int64_t tau = kEmptyKey;
    for (int t = threadIdx.x; t < numSplits; t += blockDim.x)
    {
        tau = floors[t] > tau ? floors[t] : tau;
    }
    tau = blockReduce(tau, Max{}, scratch64);
    int64_t top = kEmptyKey;
    int32_t above = 0;
    for (size_t j = threadIdx.x; j < numKeys; j += blockDim.x)
    {
        above += keys[j] > tau;
        top = keys[j] > top ? keys[j] : top;
    }
    above = blockReduce(above, Sum{}, scratchI);
    top = blockReduce(top, Max{}, scratch64);
    int64_t cut = tau; // the known prefix: keys > cut
    bool const capped = above > kKnownCap;
    if (capped) // the kKnownCap largest keys are still a prefix of the row's order
    {
        auto countAtLeast = [&](int64_t t) {
            int32_t c = 0;
            for (size_t j = threadIdx.x; j < numKeys; j += blockDim.x)
            {
                c += keys[j] >= t;
            }
            return blockReduce(c, Sum{}, scratchI);
        };
        cut = largestWithCountAtLeast(tau + 1, top, kKnownCap, countAtLeast) - 1;
    }
    bool const everyKey = tau == kEmptyKey && !capped; // every finite logit of the row is known
    if (threadIdx.x == 0)
    {
        count = 0;
    }
    __syncthreads();
    for (size_t j = threadIdx.x; j < numKeys; j += blockDim.x)
    {
        if (keys[j] > cut)
        {
            known[atomicAdd(&count, 1)] = keys[j];
        }
    }
    __syncthreads();
    int const numKnown = count;
    if (numKnown == 0) // no finite logit (a row that allows nothing): stage 1's lowest id stands
    {
        flag(0);
        return;
    }
    int size = 32;
    while (size < numKnown)
    {
        size <<= 1;
    }
    for (int j = numKnown + threadIdx.x; j < size; j += blockDim.x)
    {
        known[j] = kEmptyKey;
    }
    __syncthreads();
    sortDescending(known, size);
    float const m = keyLogit(known[0]);
    for (int j = threadIdx.x; j < numKnown; j += blockDim.x)
    {
        weight[j] = expf(keyLogit(known[j]) - m);
    }
    __syncthreads();

    bool const topK = req.k > 0;
    int numKept = numKnown; // top-k's prefix, then top-p's
    if (topK)
    {
        if (req.k <= numKnown)
        {
            numKept = static_cast<int>(req.k);
        }
        else if (!everyKey)
        {
            flag(1);
            return;
        }
    }
    if (req.p < 1.0f)
    {
        // The normaliser of the distribution top-p cuts: top-k's prefix, else every allowed token
        // (stage 1's online softmax, merged over the splits).
        float z = 0.0f;
        if (topK)
        {
            for (int j = threadIdx.x; j < numKept; j += blockDim.x)
            {
                z += weight[j];
            }
        }
        else
        {
            size_t const base = static_cast<size_t>(row) * numSplits;
            for (int t = threadIdx.x; t < numSplits; t += blockDim.x)
            {
                float const mt = ws.m[base + t];
                z += mt == -INFINITY ? 0.0f : ws.s[base + t] * expf(mt - m);
            }
        }
        z = blockReduce(z, Sum{}, scratchF);
        // the probability as softmax forms it; the first token whose mass before it reaches p
        auto const prob = [&](int j) { return weight[j] / z; };
        int const first = firstMassReaching(req.p, numKept, prob, scanA, scanB, scratchI);
        if (first < numKept)
        {
            numKept = max(first, 1); // the top token is always kept
        }
        else if (!topK && !everyKey)
        {
            flag(1); // the nucleus reaches past the known keys
            return;
        }
    }
    flag(0);
    Best best{-INFINITY, -1};
    float s = 0.0f;
    for (int j = threadIdx.x; j < numKept; j += blockDim.x)
    {
        float const logit = keyLogit(known[j]);
        int32_t const id = keyId(known[j]);
        float const score = keptScore(in, req, logit, id);
        if (beats(score, id, best))
        {
            best = {score, id};
        }
        s += weight[j];
    }
    best = blockBest(best, scratchF, scratchI);
    s = blockReduce(s, Sum{}, scratchF);
    float bestLogit = 0.0f;
    for (int j = threadIdx.x; j < numKept; j += blockDim.x)
    {
        if (keyId(known[j]) == best.id)
        {
            scanA[0] = keyLogit(known[j]);
        }
    }
    __syncthreads();
    bestLogit = scanA[0];
    writeKept(ws, row, numSplits, best.score, best.id, bestLogit, m, s);
}

//! The exact recompute, pass 1: the tile pass again for the blocks that hold a flagged row,
//! writing those rows' masked logits ([numRows, vocabSize] fp32, the same values as stage 1's).
template <typename T, int ROWS, int VEC, bool MMA>
__global__ void __launch_bounds__(kThreads) verifyLogitsKernel(T const* hidden, T const* lmHead, RowInputs in,
    trunc::Workspace tw, int numRows, int hiddenSize, int vocabSize)
{
    extern __shared__ __align__(128) unsigned char smemRaw[];
    __shared__ int anyFlagged;
    int const row0 = blockIdx.x * ROWS;
    if (threadIdx.x == 0)
    {
        anyFlagged = 0;
        for (int r = 0; r < ROWS && row0 + r < numRows; ++r)
        {
            anyFlagged |= tw.unsettled[row0 + r];
        }
    }
    __syncthreads();
    if (anyFlagged == 0)
    {
        return;
    }
    T* smemHidden = reinterpret_cast<T*>(smemRaw);
    if constexpr (!MMA)
    {
        stageHidden<T, ROWS>(smemHidden, hidden, row0, numRows, hiddenSize);
    }
    int const lane = threadIdx.x & 31;
    int const blockRow = laneBlockRow<ROWS, MMA>(lane);
    int const row = min(row0 + max(blockRow, 0), numRows - 1);
    bool const writes = blockRow >= 0 && row0 + blockRow < numRows && tw.unsettled[row] != 0;
    int const n = row / (in.gamma + 1);
    float const temperature = in.temperature[n];
    float const scale = temperature < kGreedyBelow ? 1.0f : temperature;
    float* out = tw.logits + static_cast<size_t>(row) * vocabSize;
    int begin, end;
    splitRange(vocabSize, gridDim.y, blockIdx.y, begin, end);
    streamVocab<T, ROWS, VEC, MMA>(hidden, smemHidden, smemRaw, lmHead, row0, numRows, begin, end, hiddenSize,
        vocabSize, [&](int v, float dot) {
            if (writes)
            {
                out[v] = rowLogit<true>(in, row, scale, v, dot);
            }
        });
}

//! Top-p's last kept key in a row whose kept set is the keys >= lowest (kept of them; top-k's k-th
//! key, or kEmptyKey: every finite logit): the last key whose mass before it is under p (the top
//! key always kept). Probabilities exp(l - m) / z over the kept set, as softmax forms them; the
//! kExactHeld largest kept keys sorted in shared memory and their probabilities scanned, as
//! stage 2 does; a nucleus reaching past them by bisection on the key over the row.
__device__ int64_t nucleusLastKey(
    float const* logits, int vocabSize, int64_t lowest, int32_t kept, float m, float p, trunc::ExactShared& sh)
{
    using namespace trunc;
    float z = 0.0f;
    forEachFinite(logits, vocabSize, [&](int v, float l) { z += orderKey(l, v) >= lowest ? expf(l - m) : 0.0f; });
    z = blockReduce(z, Sum{}, sh.scratchF);
    int const held = min(kept, kExactHeld);
    int64_t const heldFrom
        = kept > kExactHeld ? kthLargestKey(logits, vocabSize, kExactHeld, sh) : lowest;
    if (threadIdx.x == 0)
    {
        sh.pick[0] = 0;
    }
    __syncthreads();
    forEachFinite(logits, vocabSize, [&](int v, float l) {
        int64_t const key = orderKey(l, v);
        if (key >= heldFrom)
        {
            sh.keys[atomicAdd(&sh.pick[0], 1)] = key;
        }
    });
    int size = 32;
    while (size < held)
    {
        size <<= 1;
    }
    for (int j = held + threadIdx.x; j < size; j += blockDim.x)
    {
        sh.keys[j] = kEmptyKey;
    }
    __syncthreads();
    sortDescending(sh.keys, size);
    // the first held key whose mass before it reaches p
    auto const prob = [&](int j) { return expf(keyLogit(sh.keys[j]) - m) / z; };
    int const first = firstMassReaching(p, held, prob, sh.scanA, sh.scanB, sh.scratchI);
    if (first < held)
    {
        return sh.keys[max(first, 1) - 1];
    }
    if (held == kept)
    {
        return lowest; // the nucleus is every kept key
    }
    // below(t): the mass of the kept keys above t is under p (true at heldFrom, whose keys all
    // lie in the nucleus); its smallest t is the last key kept.
    auto below = [&](int64_t t) {
        float mass = 0.0f;
        forEachFinite(logits, vocabSize, [&](int v, float l) {
            int64_t const key = orderKey(l, v);
            mass += key >= lowest && key > t ? expf(l - m) / z : 0.0f;
        });
        return blockReduce(mass, Sum{}, sh.scratchF) < p;
    };
    return below(lowest) ? lowest : smallestTrue(lowest, heldFrom, below);
}

//! The exact recompute, pass 2, one CTA per flagged row (trunc::ExactShared dynamic shared
//! memory): top-k's k-th key, top-p's last kept key, then the Gumbel-max over the kept tokens and
//! the row's summaries rewritten.
__global__ void __launch_bounds__(trunc::kSelectThreads) exactKernel(
    VerifyWorkspace ws, trunc::Workspace tw, RowInputs in, int numSplits, int vocabSize)
{
    using namespace trunc;
    int const row = blockIdx.x;
    if (tw.unsettled[row] == 0)
    {
        return;
    }
    extern __shared__ __align__(16) unsigned char exactRaw[];
    ExactShared& sh = *reinterpret_cast<ExactShared*>(exactRaw);
    RowRequest const req = rowRequest(in, row);
    float const* logits = tw.logits + static_cast<size_t>(row) * vocabSize;

    int64_t top = kEmptyKey;
    int32_t finite = 0;
    forEachFinite(logits, vocabSize, [&](int v, float l) {
        ++finite;
        int64_t const key = orderKey(l, v);
        top = key > top ? key : top;
    });
    top = blockReduce(top, Max{}, sh.scratch64);
    finite = blockReduce(finite, Sum{}, sh.scratchI);
    float const m = keyLogit(top); // the row's largest logit (stage 2 flags only rows with one)
    int64_t last = kEmptyKey;     // the kept tokens: finite, key >= last
    int32_t kept = finite;
    if (req.k > 0 && req.k < finite)
    {
        last = kthLargestKey(logits, vocabSize, req.k, sh);
        kept = static_cast<int32_t>(req.k);
    }
    if (req.p < 1.0f)
    {
        last = nucleusLastKey(logits, vocabSize, last, kept, m, req.p, sh);
    }
    Best best{-INFINITY, -1};
    float s = 0.0f;
    forEachFinite(logits, vocabSize, [&](int v, float l) {
        if (orderKey(l, v) >= last)
        {
            float const score = keptScore(in, req, l, v);
            if (beats(score, v, best))
            {
                best = {score, v};
            }
            s += expf(l - m);
        }
    });
    best = blockBest(best, sh.scratchF, sh.scratchI);
    s = blockReduce(s, Sum{}, sh.scratchF);
    writeKept(ws, row, numSplits, best.score, best.id, logits[best.id], m, s);
}

//! The split count of the recompute's logits pass: a one-row call's. Few row blocks hold a
//! flagged row (the others return at once), and the tile pass's count at many rows (a few splits
//! per row block) left most SMs idle: 2.8 ms at 512 rows with 2 rows flagged on an H200.
int32_t recomputeSplits(VerifyResampleParams const& p, int32_t splits)
{
    return std::max(
        splits, resolveNumSplits(FLASHSPEC_OP_VERIFY_RESAMPLE, 1, p.hiddenSize, p.vocabSize, p.dtype, 0));
}

//! Launch the exact recompute's pass 2 over numRows rows (only flagged rows work).
cudaError_t launchExact(VerifyWorkspace const& ws, trunc::Workspace const& tw, RowInputs const& in, int32_t numRows,
    int32_t numSplits, int32_t vocabSize, cudaStream_t stream)
{
    cudaError_t const attr = allowSmem(exactKernel, sizeof(trunc::ExactShared));
    if (attr != cudaSuccess)
    {
        return attr;
    }
    exactKernel<<<numRows, trunc::kSelectThreads, sizeof(trunc::ExactShared), stream>>>(
        ws, tw, in, numSplits, vocabSize);
    return cudaGetLastError();
}

bool validParams(VerifyResampleParams const& p)
{
    int64_t const numRows = static_cast<int64_t>(p.batch) * (p.gamma + 1);
    return p.batch > 0 && p.gamma >= 0 && numRows <= (1 << 30) && p.hiddenSize > 0 && p.vocabSize > 0
        && validDtype(p.dtype) && p.numSplits >= 0;
}

//! A call with top-k or top-p: on the compiled Triton kernels the threshold hand-in and its
//! stage 2 (tritonAot.h launchVerifyTruncated), then the native exact recompute of the rows they
//! leave unsettled; else the native kernels throughout.
bool truncating(VerifyResampleParams const& p)
{
    return p.topK != nullptr || p.topP != nullptr;
}

//! Where truncation's state begins in the workspace: after everything a plain call uses.
size_t truncationOffset(int32_t numRows, int32_t numSplits, int32_t hiddenSize)
{
    return trunc::alignUp(getVerifyResampleWorkspaceSize(numRows, numSplits, hiddenSize));
}

//! Where the compiled kernels' hand-in begins: after the native truncation's state.
size_t handInOffset(int32_t numRows, int32_t numSplits, int32_t hiddenSize, int32_t vocabSize)
{
    return trunc::alignUp(
        truncationOffset(numRows, numSplits, hiddenSize) + trunc::workspaceBytes(numRows, numSplits, vocabSize));
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

//! A top-k / top-p call's workspace: a plain call's, the native truncation's (truncation.cuh),
//! then the compiled kernels' hand-in (tritonAot.h handInBytes).
size_t getVerifyResampleTruncatedWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize, int32_t vocabSize)
{
    return handInOffset(numRows, numSplits, hiddenSize, vocabSize) + aot::handInBytes(numRows, vocabSize);
}

namespace
{

//! A top-k / top-p call on the compiled Triton kernels: the threshold hand-in and its stage 2
//! (tritonAot.cu), the native exact recompute of the rows stage 2 leaves unsettled (its two
//! passes return at once where no row of theirs is flagged: no host read, CUDA-graph safe), then
//! the compiled finalize.
cudaError_t invokeTruncatedOnCompiled(VerifyResampleParams const& p, aot::Plan const& aotPlan, cudaStream_t stream)
{
    int32_t const numRows = p.batch * (p.gamma + 1);
    int32_t const splits = aotPlan.splits;
    LaunchPlan const plan = planLaunch(FLASHSPEC_OP_VERIFY_RESAMPLE, p.hidden, p.lmHead, numRows, p.hiddenSize,
        p.vocabSize, p.dtype, splits); // the recompute's launch shape, over the same splits
    if (!plan.mma && !hiddenFits(p.hiddenSize, p.dtype, hiddenSmemLimit()))
    {
        return cudaErrorInvalidValue;
    }
    VerifyWorkspace const ws = verifyWorkspace(p.workspace, numRows, splits);
    trunc::Workspace const tw = trunc::workspaceAt(
        static_cast<char*>(p.workspace) + truncationOffset(numRows, splits, p.hiddenSize), numRows, splits);
    RowInputs const in{p.draftTokens, p.temperature, p.seed, p.positions, p.topK, p.topP,
        reinterpret_cast<uint32_t const*>(p.allowedTokens), p.gamma, (p.vocabSize + 31) / 32};
    aot::HandInBuffers const buffers = aot::handInAt(
        static_cast<char*>(p.workspace) + handInOffset(numRows, splits, p.hiddenSize, p.vocabSize), numRows,
        p.vocabSize, tw.truncated, tw.unsettled);
    cudaError_t status = aot::launchVerifyTruncated(p, aotPlan, buffers, stream);
    if (status == cudaSuccess && p.unsettled != nullptr)
    {
        status = cudaMemcpyAsync(
            p.unsettled, tw.unsettled, sizeof(int32_t) * numRows, cudaMemcpyDeviceToDevice, stream);
    }
    if (status == cudaSuccess)
    {
        status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
            return launchTiles<T, ROWS, MMA>(verifyLogitsKernel<T, ROWS, VEC, MMA>, numRows, p.hiddenSize,
                recomputeSplits(p, splits), stream, static_cast<T const*>(p.hidden), static_cast<T const*>(p.lmHead), in, tw,
                static_cast<int>(numRows), static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
        });
    }
    if (status == cudaSuccess)
    {
        status = launchExact(ws, tw, in, numRows, splits, p.vocabSize, stream);
    }
    return status == cudaSuccess ? aot::launchVerifyFinalize(p, aotPlan, stream) : status;
}

} // namespace

cudaError_t invokeVerifyResample(VerifyResampleParams const& p, cudaStream_t stream)
{
    if (!validParams(p))
    {
        return cudaErrorInvalidValue;
    }
    if (aot::Plan aotPlan; aot::planVerifyResample(p, aotPlan))
    {
        if (truncating(p))
        {
            return invokeTruncatedOnCompiled(p, aotPlan, stream);
        }
        cudaError_t const status = aot::launchVerifyResample(p, aotPlan, stream); // the compiled Triton kernels
        if (status == cudaSuccess && p.unsettled != nullptr)
        {
            return cudaMemsetAsync(p.unsettled, 0, sizeof(int32_t) * p.batch * (p.gamma + 1), stream);
        }
        return status;
    }
    int32_t const op = truncating(p) ? FLASHSPEC_OP_VERIFY_TRUNCATED : FLASHSPEC_OP_VERIFY_RESAMPLE;
    aot::warnNative(op, p.dtype, p.hiddenSize);
    int32_t const numRows = p.batch * (p.gamma + 1);
    LaunchPlan const plan = planLaunch(FLASHSPEC_OP_VERIFY_RESAMPLE, p.hidden, p.lmHead, numRows, p.hiddenSize, p.vocabSize, p.dtype, p.numSplits);
    if (!plan.mma && !hiddenFits(p.hiddenSize, p.dtype, hiddenSmemLimit()))
    {
        return cudaErrorInvalidValue; // the FMA path stages hidden rows in shared memory; the tensor-core path does not
    }
    int32_t const splits = plan.splits;
    VerifyWorkspace const ws = verifyWorkspace(p.workspace, numRows, splits);
    RowInputs const in{p.draftTokens, p.temperature, p.seed, p.positions, p.topK, p.topP,
        reinterpret_cast<uint32_t const*>(p.allowedTokens), p.gamma, (p.vocabSize + 31) / 32};
    bool const truncates = p.topK != nullptr || p.topP != nullptr;
    trunc::Workspace tw{};
    if (truncates)
    {
        tw = trunc::workspaceAt(static_cast<char*>(p.workspace) + truncationOffset(numRows, splits, p.hiddenSize), numRows, splits);
    }
    // A call with a mask, top-k or top-p runs the TRUNC instance (the plain ones stay as they
    // were), always with the log-sum-exp pass: top-p's normaliser is its online softmax, and
    // truncated rows skip the noise's hash, which costs more than the exp (one instance fewer per
    // launch shape).
    bool const fused = truncates || p.allowedTokens != nullptr;
    bool const lse = p.logprobs != nullptr || fused;
    auto const* hidden = p.hidden;
    auto const* lmHead = p.lmHead;
    cudaError_t status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
        auto launch = [&](auto kernel, size_t minSmem) {
            return launchTilesSmem<T, ROWS, MMA>(kernel, minSmem, numRows, p.hiddenSize, splits, stream,
                static_cast<T const*>(hidden), static_cast<T const*>(lmHead), in, ws, tw, static_cast<int>(numRows),
                static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
        };
        if (fused)
        {
            return launch(verifyTilesKernel<T, ROWS, VEC, MMA, true, true>, kHandInSmemBytes);
        }
        return lse ? launch(verifyTilesKernel<T, ROWS, VEC, MMA, true, false>, 0)
                   : launch(verifyTilesKernel<T, ROWS, VEC, MMA, false, false>, 0);
    });
    if (status != cudaSuccess)
    {
        return status;
    }
    if (truncates)
    {
        // Stage 2 settles what it can; the exact recompute's two passes launch always (no host
        // read: CUDA-graph safe) and return at once where no row of theirs is flagged.
        settleKernel<<<numRows, trunc::kSelectThreads, 0, stream>>>(ws, tw, in, splits, p.unsettled);
        status = dispatch(p.dtype, plan, [&]<typename T, int ROWS, int VEC, bool MMA>() {
            return launchTiles<T, ROWS, MMA>(verifyLogitsKernel<T, ROWS, VEC, MMA>, numRows, p.hiddenSize,
                recomputeSplits(p, splits), stream, static_cast<T const*>(hidden), static_cast<T const*>(lmHead), in, tw,
                static_cast<int>(numRows), static_cast<int>(p.hiddenSize), static_cast<int>(p.vocabSize));
        });
        if (status != cudaSuccess)
        {
            return status;
        }
        status = launchExact(ws, tw, in, numRows, splits, p.vocabSize, stream);
        if (status != cudaSuccess)
        {
            return status;
        }
    }
    else if (p.unsettled != nullptr)
    {
        status = cudaMemsetAsync(p.unsettled, 0, sizeof(int32_t) * numRows, stream);
        if (status != cudaSuccess)
        {
            return status;
        }
    }
    verifyFinalizeKernel<<<(p.batch + 63) / 64, 64, 0, stream>>>(
        ws, in, p.tokens, p.numEmitted, p.logprobs, p.batch, splits);
    return cudaGetLastError();
}

} // namespace flashspec
