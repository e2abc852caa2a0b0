/*
 * The table of the Triton kernels compiled into the library (tritonAot.h): plain data, generated
 * by `python -m flashspec_export.kernels.aot` (build/tritonAot/tritonAotKernels.cpp) or empty
 * (tritonAotEmpty.cpp). No CUDA header here: the generated source is compiled as plain C++.
 */
#pragma once

#include "flashspecAbi.h"

#include <cstddef>
#include <cstdint>

namespace flashspec
{
namespace aot
{

//! One compiled kernel: its cubin (embedded in the library), entry name and launch options.
struct Kernel
{
    char const* name;
    unsigned char const* cubin;
    size_t cubinSize;
    int32_t numWarps;
    int32_t sharedBytes; // dynamic shared memory of every launch (> 48 KB: opted in at load)
};

//! A row of the launch tables kernels/tiles.py TUNED (TUNED_BY_DEVICE) / HOPPER_TUNED for one
//! (op, dtype, H), or (op FLASHSPEC_OP_VERIFY_TRUNCATED) the launch the Triton backend takes for
//! top-k / top-p (HAND_IN_TUNED, else the others) compiled with the threshold hand-in, whose
//! log-probabilities kernels also serve top-p: the stage-1 kernels and the geometry. blockK > 0:
//! the Hopper kernel
//! (kernels/hopper_tiles.py), a persistent kernel (one CTA per SM) that reads hidden and lm_head
//! through TMA descriptors.
struct TileConfig
{
    int32_t op;             // FlashspecOp
    int32_t dtype;          // FlashspecDtype
    int32_t hiddenSize;     // H (a compile-time constant of the kernel)
    int32_t maxRows;        // the row's bound, -1 for the last row (any R)
    int32_t blockN;         // rows per program
    int32_t blockV;         // vocabulary ids per tile
    int32_t waves;          // programs per SM along the vocabulary; 0: one tile per program
    int32_t kernel;         // index into Table::kernels
    int32_t logprobsKernel; // verify with log-probabilities; -1 for the argmax
    int32_t maskedKernel;   // verify with an allowed-token mask (MASKED); -1 for the argmax
    int32_t maskedLogprobsKernel; // verify with a mask and log-probabilities; -1 for the argmax
    int32_t blockK;         // Hopper kernel: hidden elements per TMA box; 0: the portable kernel
    int32_t tmaSwizzle;     // Hopper kernel: the boxes' CUtensorMapSwizzle
    char const* device;     // a TUNED_BY_DEVICE row: a part of cudaDeviceProp::name; "": any GPU
};

//! A stage-2 kernel: reduces up to blockS splits (verify: of up to blockR draft positions).
struct FinalizeConfig
{
    int32_t op;
    int32_t logprobs; // verify: writes log-probabilities
    int32_t blockR;   // verify: >= γ + 1; argmax: rows per program
    int32_t blockS;   // >= the split count
    int32_t kernel;
};

//! The threshold hand-in of top-k / top-p (kernels/verify_resample.py _hand_in_thresholds): keys a
//! row may hand in (hopper_tiles.HAND_IN_CAP), the keys stage 2 settles a kept set in (MAX_KEPT),
//! its scratch of selected keys a row, and the stride of the ids whose logits set the threshold
//! (HAND_IN_STRIDE), and the most partial sums of a sampled logit (SampledConfig::kSplits): the
//! generated table static_asserts them.
constexpr int32_t kHandInCap = 4096;
constexpr int32_t kMaxKept = 1024;
constexpr int32_t kSelected = 2048;
constexpr int32_t kHandInStride = 128;
constexpr int32_t kMaxSampledSplits = 8;

//! A stage-2 kernel of top-k / top-p (kernels/verify_resample.py _truncated_summaries_kernel):
//! settles the kept sets of up to blockS splits (its constexprs are the Triton JIT's for each:
//! verify_resample.SETTLE_SPLITS).
struct SettleConfig
{
    int32_t topK;     // compiled for a top_k input
    int32_t topP;     // compiled for a top_p input
    int32_t logprobs; // also rewrites the fields the log-probabilities read
    int32_t blockS;
    int32_t kernel;
};

//! The hand-in's sampled logits (kernels/verify_resample.py _sampled_logits_kernel) for one dtype
//! and a row of SAMPLED_TUNED: [kSplits, R, ceil(V / kHandInStride)] partial logits.
struct SampledConfig
{
    int32_t dtype;
    int32_t maxRows; // the row's bound, -1 for the last row (any R)
    int32_t blockR;
    int32_t blockS;
    int32_t blockK;
    int32_t kSplits; // at most; cdiv(H, blockK) where fewer
    int32_t kernel;
};

//! The hand-in's threshold kernel (_hand_in_threshold_kernel): one program per row, over a block
//! of at least ceil(V / kHandInStride) sampled logits.
struct ThresholdConfig
{
    int32_t topK;
    int32_t topP;
    int32_t masked;
    int32_t block;
    int32_t kernel;
};

struct Table
{
    int32_t arch;         // compute capability major * 10 + minor the cubins are for
    char const* compiler; // e.g. "triton 3.6.0"
    Kernel const* kernels;
    size_t numKernels;
    TileConfig const* tiles;
    size_t numTiles;
    FinalizeConfig const* finalizes;
    size_t numFinalizes;
    SettleConfig const* settles;
    size_t numSettles;
    SampledConfig const* sampled;
    size_t numSampled;
    ThresholdConfig const* thresholds;
    size_t numThresholds;
};

//! Generated (build/tritonAot/tritonAotKernels.cpp), or empty (common/tritonAotEmpty.cpp).
extern Table const kTable;

} // namespace aot
} // namespace flashspec
