/*
 * C ABI of the FlashSpec kernel library (libflashspec_kernels.so), for callers without C++
 * (Python ctypes: flashspec_export/ops/cuda.py). The params structs are those of
 * flashspecKernels.h (plain C layout). Functions return a cudaError_t value (0 = success).
 */
#pragma once

#include "flashspecAbi.h"

#include <stddef.h>
#include <stdint.h>

#define FLASHSPEC_API __attribute__((visibility("default")))

#ifdef __cplusplus
extern "C"
{
#endif

//! FLASHSPEC_ABI_VERSION (flashspecAbi.h) of the library.
FLASHSPEC_API int32_t flashspecAbiVersion(void);
//! The FlashspecDtype code of "float32", "float16" or "bfloat16"; -1 for any other name.
FLASHSPEC_API int32_t flashspecDtypeCode(char const* name);
//! The vocabulary splits a launch of op (FlashspecOp) uses (requested > 0 is kept): the Triton
//! launch table's count where the compiled Triton kernels serve the shape on the current device.
FLASHSPEC_API int32_t flashspecResolveNumSplits(int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested);
//! The most splits flashspecResolveNumSplits returns for a vocabulary of vocabSize ids on any GPU
//! (the bound a plugin's serialized num_splits and its workspace are checked against).
FLASHSPEC_API int32_t flashspecMaxNumSplits(int32_t vocabSize);
//! The split count row `row` of the compiled Triton table gives (numRows rows, vocabSize ids, a GPU
//! of `sms` SMs), or -1 past the table's end: with flashspecMaxNumSplits, the bound is testable.
FLASHSPEC_API int32_t flashspecTableSplits(int32_t row, int32_t numRows, int32_t vocabSize, int32_t sms);
//! checkShapes (flashspecKernels.h), the check every plugin runs in configurePlugin and enqueue:
//! input i has nbDims[i] dims dims[8 i ..]; returns 0, or -1 with the message in message.
FLASHSPEC_API int32_t flashspecCheckShapes(int32_t op, int32_t const* nbDims, int64_t const* dims, int32_t nbInputs,
    int32_t vocabSize, char* message, size_t capacity);
//! Dynamic shared memory the native FMA kernels stage hidden rows in for a launch of numRows rows
//! on a device whose CTAs may opt in to optinBytes; -1 where H does not fit (the call is refused).
FLASHSPEC_API int64_t flashspecStagedSmemBytes(int32_t numRows, int32_t hiddenSize, int32_t dtype, int64_t optinBytes);
//! The FlashspecKernelPath a call of op (0: TiledArgmax, 1: VerifyResample) with these params would
//! run on the current device: the compiled Triton kernels or the native CUDA kernels; -1 if op is unknown.
FLASHSPEC_API int32_t flashspecKernelPath(int32_t op, void const* params);
//! Loads the Triton kernels compiled into the library into the current CUDA context, once per
//! context (aot::prepare, tritonAot.h). Call it outside CUDA-graph capture before a launch that
//! may be captured: a launch on a capturing stream never loads them and returns
//! cudaErrorStreamCaptureUnsupported where they are not loaded. 0 also where there is nothing to
//! load; cudaErrorNoDevice (100) without a CUDA driver.
FLASHSPEC_API int32_t flashspecPrepareKernels(void);
//! The compute capability (major * 10 + minor) of the Triton kernels compiled into the library; 0 if none.
FLASHSPEC_API int32_t flashspecTritonAotArch(void);
//! Workspace bytes of a call (numRows: N for TiledArgmax, N · (γ + 1) for VerifyResample).
FLASHSPEC_API size_t flashspecTiledArgmaxWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize);
FLASHSPEC_API size_t flashspecVerifyResampleWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize);
//! ... of a VerifyResample call with top_k or top_p (the native per-split candidates, the exact
//! recompute's [numRows, vocabSize] fp32 logits and the compiled kernels' hand-in after the
//! above; a mask alone needs no more).
FLASHSPEC_API size_t flashspecVerifyResampleTruncatedWorkspaceSize(int32_t numRows, int32_t numSplits, int32_t hiddenSize, int32_t vocabSize);
FLASHSPEC_API int32_t flashspecTiledArgmax(void const* params, void* stream);     // params: TiledArgmaxParams
FLASHSPEC_API int32_t flashspecVerifyResample(void const* params, void* stream);  // params: VerifyResampleParams
FLASHSPEC_API int32_t flashspecNoise(void const* params, void* stream);           // params: NoiseParams
FLASHSPEC_API char const* flashspecErrorString(int32_t status);
//! Field offsets of a params struct in declaration order, then its size, into offsets
//! (op 0: TiledArgmaxParams, 1: VerifyResampleParams, 2: NoiseParams); returns the count written, -1 if the op
//! is unknown or capacity too small. Lets bindings check their mirror of the layout.
FLASHSPEC_API int32_t flashspecParamsLayout(int32_t op, size_t* offsets, int32_t capacity);

#ifdef __cplusplus
}
#endif
