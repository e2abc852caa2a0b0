/*
 * The FlashSpec noise evaluated element-wise on (seed, position, token) triples: the functions the
 * verify kernel calls per logit (flashspecNoise.cuh), exposed so that tests can hold them to the
 * reference and the frozen vectors bit for bit (tests/parity/test_noise_cuda.py).
 */
#include "flashspecKernels.h"
#include "flashspecNoise.cuh"

namespace flashspec
{
namespace
{

__global__ void noiseKernel(NoiseParams p)
{
    int const i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i >= p.count)
    {
        return;
    }
    RowKeys const keys = rowKeys(p.seed[i], p.position[i], static_cast<uint64_t>(p.stream));
    uint64_t const x = tokenBits(keys, static_cast<uint64_t>(p.token[i]));
    p.bits[i] = static_cast<int64_t>(x);
    p.uniform[i] = uniformFromBits(x);
    p.gumbel[i] = gumbelFromBits(x);
}

} // namespace

cudaError_t invokeNoise(NoiseParams const& params, cudaStream_t stream)
{
    if (params.count < 0 || params.stream < 0)
    {
        return cudaErrorInvalidValue;
    }
    if (params.count == 0)
    {
        return cudaSuccess;
    }
    constexpr int kBlock = 256;
    noiseKernel<<<(params.count + kBlock - 1) / kBlock, kBlock, 0, stream>>>(params);
    return cudaGetLastError();
}

} // namespace flashspec
