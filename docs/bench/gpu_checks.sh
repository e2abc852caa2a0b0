#!/usr/bin/env bash
# The GPU session behind docs/BENCHMARKS.md and the GPU logs under docs/bench: run from the
# repository root on a CUDA machine. Writes at most 8 files to ${OUT:-gpu_out}.
#
#   bash docs/bench/gpu_checks.sh tests              # install, build, GPU tests, sanitizer, invariance
#       (with TensorRT headers in $TRT_INCLUDE — the public TensorRT OSS include/, never committed —
#        the plugin library and its self-test are built and run too, under compute-sanitizer)
#   bash docs/bench/gpu_checks.sh bench [BEFORE]     # kernel sweep; BEFORE: an older tree, timed first
#   bash docs/bench/gpu_checks.sh aot                # the library's compiled-in Triton kernels
#       (the Hopper kernel from 17 rows): their GPU tests, then CUDA (compiled Triton) vs
#       Triton JIT on the three heads, R = 1..512
set -uo pipefail
out="${OUT:-gpu_out}"
mkdir -p "$out"
rows="1 4 16 64 128 256 512"
build() {  # $1: a repository root; builds its CUDA kernel library (and the plugins with headers)
    local headers=()
    [ -n "${TRT_INCLUDE:-}" ] && [ -f "$TRT_INCLUDE/NvInferRuntime.h" ] && headers=(-DTENSORRT_INCLUDE_DIR="$TRT_INCLUDE")
    cmake -S "$1/plugins" -B "$1/plugins/build" -DCMAKE_BUILD_TYPE=Release "${headers[@]}" > /dev/null &&
        cmake --build "$1/plugins/build" -j 16 > /dev/null
}
case "${1:-tests}" in
tests)
    python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
    build . || exit 1
    log="$out/gpu_tests.log"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$log"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$log"
    # 1. Parity (every backend on CUDA tensors; tests/parity/test_triton_aot_gpu.py: the library's
    # compiled-in Triton kernels) and the statistical exactness suite.
    python3 -m pytest -q tests/parity tests/reference/test_exactness.py tests/test_op_faces.py \
        tests/test_cuda_abi.py tests/runtime/test_engines.py >> "$log" 2>&1
    echo "tests rc=$?" >> "$log"
    if [ -x plugins/build/pluginSelfTest ]; then  # the plugin adapters, enqueue included
        compute-sanitizer --tool memcheck --error-exitcode 9 plugins/build/pluginSelfTest \
            > "$out/plugin_selftest.log" 2>&1
        echo "plugin self-test rc=$?" >> "$log"
    fi
    # 2. compute-sanitizer memcheck on odd shapes, with and without log-probabilities.
    compute-sanitizer --tool memcheck --error-exitcode 9 python3 - >> "$log" 2>&1 <<'PY'
import torch
from flashspec_export import ops
from tests.cases import make_case
for dtype in (torch.float32, torch.bfloat16, torch.float16):
    for n, gamma, h, v in ((3, 2, 40, 1000), (5, 0, 64, 777), (17, 4, 72, 3001), (2, 1, 37, 500)):
        case = make_case(n, gamma, h, v, dtype, padded_vocab=v + 13, seed=n)
        case = (*(t.cuda() for t in case[:6]), case[6])
        for logprobs in (True, False):
            ops.verify_resample(*case, return_logprobs=logprobs, backend="cuda")
        ops.tiled_argmax(case[0][:, 0], case[1], case[6], backend="cuda")
torch.cuda.synchronize()
print("sanitizer run done")
PY
    echo "sanitizer rc=$?" >> "$log"
    # 3. Speculation vs plain decoding on the GPU (Triton kernels), bf16 and fp32.
    for dtype in bfloat16 float32; do
        python3 scripts/check_invariance.py --device cuda --dtype "$dtype" --batches 4 \
            --out "$out/invariance_$dtype.json" 2>&1 | grep -v -i "warn\|loading\|writing" \
            >> "$out/invariance.log"
    done
    ;;
bench)
    before="${2:-}"
    if [ -n "$before" ]; then  # the older tree, installed beside this one and timed first
        python3 -m pip install -q --no-build-isolation --no-deps --target /tmp/before "$before" \
            > /dev/null 2>&1
        build "$before" || exit 1
        PYTHONPATH=/tmp/before FLASHSPEC_KERNELS_LIB="$before/plugins/build/libflashspec_kernels.so" \
            python3 "$before/scripts/bench_kernels.py" --heads llama3-8b --rows $rows \
            --providers verify_resample "verify_resample[cuda]" matmul \
            --out "$out/bench_before.json" > "$out/bench.log" 2>&1
        echo "before rc=$?" >> "$out/bench.log"
    fi
    python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
    build . || exit 1
    python3 scripts/bench_kernels.py --heads llama3-8b qwen3-8b gemma3-12b --rows $rows \
        --rep-ms 50 --out "$out/bench.json" --plot "$out/bench.png" >> "$out/bench.log" 2>&1
    echo "bench rc=$?" >> "$out/bench.log"
    ;;
aot)
    python3 -m pip install -q --no-build-isolation --no-deps -e . > /dev/null 2>&1
    log="$out/aot_tests.log"
    { cmake -S plugins -B plugins/build -DCMAKE_BUILD_TYPE=Release && cmake --build plugins/build -j 16; } \
        > "$out/aot_build.log" 2>&1 || { tail -40 "$out/aot_build.log"; exit 1; }
    grep "flashspec:" "$out/aot_build.log" > "$log"
    nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >> "$log"
    python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)" >> "$log"
    python3 -m pytest -q tests/parity/test_triton_aot_gpu.py tests/parity/test_llm_shapes_gpu.py \
        tests/parity/test_hopper_tiles_gpu.py tests/test_cuda_abi.py tests/test_triton_aot.py \
        >> "$log" 2>&1
    echo "tests rc=$?" >> "$log"
    python3 scripts/bench_kernels.py --heads llama3-8b qwen3-8b gemma3-12b --rows $rows \
        --providers verify_resample "verify_resample[cuda]" tiled_argmax "tiled_argmax[cuda]" matmul \
        --rep-ms 20 --out "$out/bench_aot.json" --plot "$out/bench_aot.png" > "$out/bench_aot.log" 2>&1
    echo "bench rc=$?" >> "$out/bench_aot.log"
    ;;
esac
