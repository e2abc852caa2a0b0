"""The one place float tolerances come from. Token ids are always compared exactly."""

# Log-probabilities: fp32 log-sum-exp over tiles vs over the whole row (ulp-level differences).
LOGPROB_ATOL = 2e-5
LOGPROB_RTOL = 1e-5
# The same at a deployed H (4096): each logit is a 4096-term fp32 dot product whose order differs
# between tensor-core kernels and the reference (measured 6e-5 on an H200, bf16, V 32000).
LOGPROB_LARGE_H_ATOL = 2e-4
# max_logit of TiledArgmax: same fp32 dot products, possibly a different summation order.
LOGIT_ATOL = 1e-4
LOGIT_RTOL = 1e-5
# Gumbel noise: one fp32 log/log1p evaluated by different math libraries.
GUMBEL_RTOL = 1e-6
GUMBEL_ATOL = 1e-6
# KV-cache entries of an exported graph vs the PyTorch module: the same fp32 projections and
# rotary embedding, summed in another order by onnxruntime.
CACHE_ATOL = 1e-5
CACHE_RTOL = 1e-5
# The fused decoder layers in bf16 against the PyTorch layers: the same roundings element-wise,
# the attention's fp32 accumulation in another order (a few bf16 ulps of O(1) hidden states).
FUSED_BF16_ATOL = 0.05
