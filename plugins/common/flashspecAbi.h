/*
 * The ABI the kernels' C entry points (flashspecCApi.h) share with their bindings: its version and
 * the element-type codes of hidden / lm_head. Defined here once, in C, for the kernels, the
 * TensorRT plugins and the Python binding (flashspec_export/ops/cuda.py checks the version and
 * reads the codes through flashspecDtypeCode; tests/test_op_faces.py checks it against this file).
 */
#pragma once

//! Bumped on any change of the params structs or the entry points' signatures.
#define FLASHSPEC_ABI_VERSION 7

//! Element type of hidden / lm_head.
enum FlashspecDtype
{
    FLASHSPEC_FLOAT32 = 0,
    FLASHSPEC_FLOAT16 = 1,
    FLASHSPEC_BFLOAT16 = 2,
};

//! The ops of the C ABI (flashspecParamsLayout, flashspecResolveNumSplits, flashspecKernelPath).
enum FlashspecOp
{
    FLASHSPEC_OP_TILED_ARGMAX = 0,
    FLASHSPEC_OP_VERIFY_RESAMPLE = 1,
    FLASHSPEC_OP_NOISE = 2,
    //! VerifyResample with top_k or top_p inputs, for flashspecResolveNumSplits (its own launch
    //! table rows, kernels/aot.py _hand_in_rows); its params and path are VerifyResample's.
    FLASHSPEC_OP_VERIFY_TRUNCATED = 3,
};

//! Which kernels a call runs (flashspecKernelPath).
enum FlashspecKernelPath
{
    FLASHSPEC_PATH_NATIVE = 0,     //!< the CUDA kernels of plugins/ (any GPU, any shape)
    FLASHSPEC_PATH_TRITON_AOT = 1, //!< the Triton kernels of kernels/, compiled into the library
    FLASHSPEC_PATH_TRITON_AOT_HOPPER = 2, //!< those, stage 1 by the Hopper kernel (hopper_tiles.py)
};
