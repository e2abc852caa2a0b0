#include "launch.cuh"
#include "tritonAot.h"

#include <cstdio>
#include <string>

namespace flashspec
{

namespace
{
//! The native kernels: no split narrower than one pass of all warps.
int32_t maxNativeSplits(int32_t vocabSize)
{
    return std::max(1, vocabSize / (kWarps * kUnroll * 4));
}
} // namespace

int32_t maxNumSplits(int32_t vocabSize)
{
    // The compiled Triton table: one split per tile at most; its narrowest tiles (64 ids) give
    // more splits than the native kernels do.
    return std::max(maxNativeSplits(vocabSize), aot::maxTableSplits(vocabSize));
}

namespace
{
std::string describe(TensorShape const& shape)
{
    std::string text = "[";
    for (int32_t i = 0; i < shape.nbDims; ++i)
    {
        text += (i ? ", " : "") + std::to_string(shape.d[i]);
    }
    return text + "]";
}

//! Unknown (< 0) sizes match anything.
bool same(int64_t a, int64_t b)
{
    return a < 0 || b < 0 || a == b;
}

int32_t fail(char* message, size_t capacity, char const* op, char const* input, char const* expected,
    TensorShape const& given)
{
    if (message != nullptr && capacity > 0)
    {
        std::snprintf(message, capacity, "%s: %s must be %s, got %s", op, input, expected, describe(given).c_str());
    }
    return -1;
}
} // namespace

int32_t checkShapes(int32_t op, TensorShape const* in, int32_t nbInputs, int32_t vocabSize, char* message,
    size_t capacity)
{
    bool const verify = op == FLASHSPEC_OP_VERIFY_RESAMPLE;
    char const* name = verify ? "VerifyResample" : "TiledArgmax";
    int32_t const expected = verify ? 6 : 2;
    int32_t const most = verify ? 9 : 2; // VerifyResample: then top_k, top_p, allowed_tokens, each optional
    if ((op != FLASHSPEC_OP_TILED_ARGMAX && !verify) || nbInputs < expected || nbInputs > most)
    {
        if (message != nullptr && capacity > 0)
        {
            if (expected == most)
            {
                std::snprintf(message, capacity, "%s: expected %d inputs, got %d", name, expected, nbInputs);
            }
            else
            {
                std::snprintf(message, capacity, "%s: expected %d to %d inputs, got %d", name, expected, most, nbInputs);
            }
        }
        return -1;
    }
    TensorShape const& hidden = in[0];
    TensorShape const& lmHead = in[1];
    int32_t const rank = verify ? 3 : 2;
    if (hidden.nbDims != rank || (verify && hidden.d[1] == 0))
    {
        return fail(message, capacity, name, "hidden", verify ? "[N, R, H] with R >= 1" : "[N, H]", hidden);
    }
    int64_t const n = hidden.d[0];
    int64_t const h = hidden.d[rank - 1];
    if (lmHead.nbDims != 2 || !same(lmHead.d[1], h) || (lmHead.d[0] >= 0 && lmHead.d[0] < vocabSize))
    {
        std::string const want = "[>= vocab_size " + std::to_string(vocabSize) + ", H " + std::to_string(h) + "]";
        return fail(message, capacity, name, "lm_head", want.c_str(), lmHead);
    }
    if (!verify)
    {
        return 0;
    }
    int64_t const drafts = hidden.d[1] < 0 ? -1 : hidden.d[1] - 1;
    if (in[2].nbDims != 2 || !same(in[2].d[0], n) || !same(in[2].d[1], drafts))
    {
        std::string const want = "[N " + std::to_string(n) + ", R - 1 " + std::to_string(drafts) + "]";
        return fail(message, capacity, name, "draft_tokens", want.c_str(), in[2]);
    }
    char const* perSequence[] = {"temperature", "seed", "positions"};
    for (int32_t i = 0; i < 3; ++i)
    {
        TensorShape const& shape = in[3 + i];
        if (shape.nbDims != 1 || !same(shape.d[0], n))
        {
            std::string const want = "[N " + std::to_string(n) + "]";
            return fail(message, capacity, name, perSequence[i], want.c_str(), shape);
        }
    }
    // The optional inputs present, in their order: top_k and top_p [N] (either may be left out),
    // then allowed_tokens [N, R, ceil(V / 32)].
    int32_t perRow = 0;
    for (int32_t i = expected; i < nbInputs; ++i)
    {
        TensorShape const& shape = in[i];
        if (shape.nbDims == 1 && perRow < 2)
        {
            ++perRow;
            if (!same(shape.d[0], n))
            {
                std::string const want = "[N " + std::to_string(n) + "]";
                return fail(message, capacity, name, "top_k / top_p", want.c_str(), shape);
            }
            continue;
        }
        int64_t const words = (static_cast<int64_t>(vocabSize) + 31) / 32;
        if (i + 1 != nbInputs || shape.nbDims != 3 || !same(shape.d[0], n) || !same(shape.d[1], hidden.d[1])
            || !same(shape.d[2], words))
        {
            std::string const want = "top_k [N], top_p [N], then allowed_tokens [N " + std::to_string(n) + ", R "
                + std::to_string(hidden.d[1]) + ", ceil(vocab_size / 32) " + std::to_string(words) + "]";
            return fail(message, capacity, name, "the optional inputs", want.c_str(), shape);
        }
    }
    return 0;
}

int32_t resolveNumSplits(
    int32_t op, int32_t numRows, int32_t hiddenSize, int32_t vocabSize, int32_t dtype, int32_t requested)
{
    if (requested > 0)
    {
        return requested;
    }
    // Where the compiled Triton kernels serve the shape, their launch table's count.
    int32_t const tuned = aot::tunedSplits(op, numRows, hiddenSize, vocabSize, dtype);
    if (tuned > 0)
    {
        return tuned;
    }
    int device = 0;
    int smCount = 132;
    if (cudaGetDevice(&device) == cudaSuccess)
    {
        cudaDeviceGetAttribute(&smCount, cudaDevAttrMultiProcessorCount, device);
    }
    int32_t const rows = blockRows(numRows, hiddenSize, dtype, mmaShape(hiddenSize, dtype), hiddenSmemLimit());
    int32_t const rowBlocks = (numRows + rows - 1) / rows;
    // Two CTAs per SM over all row blocks, no split narrower than one pass of all warps.
    int32_t const bySm = std::max(1, (2 * smCount + rowBlocks - 1) / rowBlocks);
    return std::min(bySm, maxNativeSplits(vocabSize));
}

} // namespace flashspec
