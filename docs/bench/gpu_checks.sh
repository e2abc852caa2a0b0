#!/usr/bin/env bash
# The GPU session behind docs/BENCHMARKS.md's CUDA numbers and the GPU test logs: run from the
# repository root on a CUDA machine with the kernel library built (cmake -S plugins -B plugins/build).
# Writes logs and JSON to ${OUT:-gpu_out}.
set -uo pipefail
out="${OUT:-gpu_out}"
mkdir -p "$out"
python3 -m pip install -q --no-build-isolation --no-deps -e . >/dev/null 2>&1
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt"
# 1. Parity and exactness of the CUDA (and Triton) backends on the GPU.
python3 -m pytest -q -s -x tests/parity tests/reference/test_exactness.py -k cuda \
    > "$out/gpu_tests.log" 2>&1
echo "tests rc=$?" >> "$out/gpu_tests.log"
# 2. compute-sanitizer memcheck on small odd shapes (unaligned H, padded vocabulary, every dtype).
compute-sanitizer --tool memcheck --error-exitcode 9 python3 - > "$out/sanitizer.log" 2>&1 <<'PY'
import torch
from flashspec_export import ops
from tests.cases import make_case
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for n, gamma, h, v in ((3, 2, 40, 1000), (5, 0, 64, 777), (17, 4, 72, 3001), (2, 1, 37, 500)):
        case = make_case(n, gamma, h, v, dtype, padded_vocab=v + 13, seed=n)
        case = (*(t.cuda() for t in case[:6]), case[6])
        ops.verify_resample(*case, return_logprobs=True, backend="cuda")
        ops.tiled_argmax(case[0][:, 0], case[1], case[6], backend="cuda")
torch.cuda.synchronize()
print("sanitizer run done")
PY
echo "sanitizer rc=$?" >> "$out/sanitizer.log"
# 3. Side-by-side timing: Triton, CUDA, cuBLAS matmul, the materialised path.
python3 scripts/bench_kernels.py --heads llama3-8b qwen3-8b --rows 1 4 16 64 256 \
    --out "$out/bench_cuda.json" --plot "$out/bench_cuda.png" > "$out/bench_cuda.log" 2>&1
echo "bench rc=$?" >> "$out/bench_cuda.log"
