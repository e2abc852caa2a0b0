/*
 * The FlashSpec CUDA kernels: raw pointers + a Params struct through invoke<Op>(params, stream).
 * No TensorRT or torch header here: the TensorRT plugins and the C ABI (flashspecCApi.h) are
 * thin layers over these entry points.
 */
#pragma once

#include "flashspecAbi.h"

#include <cuda_runtime.h>
#include <cstddef>
#include <cstdint>

namespace flashspec
{

//! The element type of hidden / lm_head (codes: flashspecAbi.h).
enum class DataType : int32_t
{
    kFLOAT = FLASHSPEC_FLOAT32,
    kHALF = FLASHSPEC_FLOAT16,
    kBF16 = FLASHSPEC_BFLOAT16,
};

//! TiledArgmax: greedy drafting. All tensors contiguous, on one device.
struct TiledArgmaxParams
{
    void const* hidden;   // [numRows, hiddenSize] of dtype
    void const* lmHead;   // [>= vocabSize, hiddenSize] of dtype (rows >= vocabSize are padding)
    int64_t* tokens;      // [numRows] out: argmax over [0, vocabSize), lowest id on ties
    float* maxLogit;      // [numRows] out: the max fp32 logit
    void* workspace;      // getTiledArgmaxWorkspaceSize(...) bytes
    int32_t numRows;
    int32_t hiddenSize;   // a multiple of 16 bytes / element size (8 for half / bf16, 4 for fp32)
    int32_t vocabSize;
    int32_t dtype;        // DataType
    int32_t numSplits;    // vocabulary splits (CTAs per row block); 0 = chosen from the SM count
};

//! The FlashSpec noise of (seed, position, token) triples (reference/noise.py), for tests.
struct NoiseParams
{
    int64_t const* seed;     // [count], in [0, 2^63)
    int64_t const* position; // [count], in [0, P)
    int64_t const* token;    // [count], in [0, P)
    int64_t* bits;           // [count] out: the hash integer in [0, P)
    float* uniform;          // [count] out
    float* gumbel;           // [count] out
    int32_t count;
    int32_t stream;          // the noise stream id (reference.noise.STREAM_*)
};

//! VerifyResample: verify gamma greedy drafts and emit the next tokens (docs/DESIGN.md contract).
struct VerifyResampleParams
{
    void const* hidden;          // [batch, gamma + 1, hiddenSize] of dtype
    void const* lmHead;          // [>= vocabSize, hiddenSize] of dtype
    int64_t const* draftTokens;  // [batch, gamma], ids in [0, vocabSize)
    float const* temperature;    // [batch], >= 0 (0: greedy)
    int64_t const* seed;         // [batch], in [0, 2^63)
    int64_t const* positions;    // [batch], absolute position of row 0 (keys the noise)
    int64_t* tokens;             // [batch, gamma + 1] out: accepted drafts, candidate, then -1
    int64_t* numEmitted;         // [batch] out: 1 .. gamma + 1
    float* logprobs;             // [batch, gamma + 1] out, or nullptr
    void* workspace;             // getVerifyResampleWorkspaceSize(...) bytes
    int32_t batch;
    int32_t gamma;
    int32_t hiddenSize;
    int32_t vocabSize;
    int32_t dtype;
    int32_t numSplits;           // 0 = chosen from the SM count
    // The truncation a request asks for (reference/truncation.py), each nullptr for off. With
    // topK or topP the workspace is getVerifyResampleTruncatedWorkspaceSize(...) bytes.
    int64_t const* topK;          // [batch], >= 0 (0: off): the k largest logits, ties to the lower id
    float const* topP;            // [batch], in (0, 1] (1: off): then the nucleus of mass p
    int32_t const* allowedTokens; // [batch, gamma + 1, ceil(vocabSize / 32)]: bit j of word w allows
                                  // token 32 w + j; applied first; every row allows some token
    int32_t* unsettled;           // [batch * (gamma + 1)] out, or nullptr: 1 where the per-split
                                  // candidates did not settle the kept set (the exact recompute ran)
};

//! The most inputs an op takes (VerifyResample: 6, then top_k, top_p, allowed_tokens).
constexpr int32_t kMaxOpInputs = 9;

//! An input's shape as a plugin sees it (TensorRT's Dims without its header); d[i] < 0: not known
//! yet (a dynamic dimension at build time), which matches any size.
struct TensorShape
{
    int32_t nbDims;
    int64_t d[8];
};

//! Checks the inputs of op (FlashspecOp) against its contract — TiledArgmax: hidden [N, H],
//! lm_head [>= vocabSize, H]; VerifyResample: hidden [N, R, H] (R >= 1), lm_head [>= vocabSize, H],
//! draft_tokens [N, R - 1], temperature, seed, positions [N], then optionally (in this order, any
//! of them left out) top_k, top_p [N] and allowed_tokens [N, R, ceil(vocabSize / 32)] — before
//! any device memory is read.
//! Returns 0, or -1 with a message naming the input, the expected shape and the one given.
int32_t checkShapes(int32_t op, TensorShape const* inputs, int32_t nbInputs, int32_t vocabSize,
    char* message, size_t capacity);

//! The most vocabulary splits resolveNumSplits chooses on any GPU: the native kernels' count grows
//! with the SM count up to V / 512, every row of the compiled Triton table gives at most one split
//! per tile, cdiv(V, BLOCK_V). A workspace sized with it fits every device an engine may run on.
int32_t maxNumSplits(int32_t vocabSize);

//! The number of vocabulary splits a launch of op (FlashspecOp) uses: requested > 0 as is; else the
//! Triton launch table's count where the compiled Triton kernels serve the shape on this device
//! (kernels/tiles.py num_splits), else the native kernels' count from the SM count.
int32_t resolveNumSplits(
    int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested);

//! FLASHSPEC_PATH_TRITON_AOT where invoke<Op> runs the compiled Triton kernels for these params,
//! else FLASHSPEC_PATH_NATIVE (other GPU architectures, shapes or dtypes not compiled in,
//! unaligned pointers; see tritonAot.h).
int32_t tiledArgmaxPath(TiledArgmaxParams const& params);
int32_t verifyResamplePath(VerifyResampleParams const& params);

size_t getTiledArgmaxWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize);
size_t getVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize);
//! The workspace of a VerifyResample call with topK or topP: getVerifyResampleWorkspaceSize's, then
//! the native kernels' per-split candidates, the exact recompute's [numRows, vocabSize] fp32
//! logits and the compiled kernels' hand-in. (A mask alone needs nothing more.)
size_t getVerifyResampleTruncatedWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize, int32_t vocabSize);

//! Loads the kernels invoke<Op> launches through the driver (the compiled Triton kernels:
//! aot::prepare, tritonAot.h) into the current CUDA context, once per context. Call it outside
//! CUDA-graph capture: an invoke<Op> on a capturing stream never loads them, and fails with
//! cudaErrorStreamCaptureUnsupported where they are not loaded yet. (The native kernels are the
//! CUDA runtime's to load.)
cudaError_t prepareKernels();

//! cudaSuccess, cudaErrorInvalidValue for arguments outside the contract, or a launch error.
cudaError_t invokeTiledArgmax(TiledArgmaxParams const& params, cudaStream_t stream);
cudaError_t invokeVerifyResample(VerifyResampleParams const& params, cudaStream_t stream);
cudaError_t invokeNoise(NoiseParams const& params, cudaStream_t stream);

} // namespace flashspec
