#!/usr/bin/env bash
# One pass of the CUDA backend's checks on a machine with an NVIDIA GPU
# (compute capability >= 9.0), for a single device call:
#   tests/cuda/device_run.sh [out-dir]
# Builds build-cuda-dev (Release, -Werror, only what is needed), then writes
# to out-dir (default: $OUT, else ./cuda-run): nvidia-smi, `loom devices`,
# the three CUDA test suites (gtest XML too), compute-sanitizer memcheck on
# the kernel suites (a subset of shapes, to fit the time), racecheck on the
# flash prefill, and `loom bench`
# on a synthetic model on the CPU and on CUDA. Steps keep going after a
# failure; summary.txt lists each step's exit code. LOOM_CUDA_BUILD_DIR
# names another build folder; LOOM_CUDA_RUN_NO_BENCH=1 stops before the bench.
set -u
cd "$(dirname "$0")/../.."
out="${1:-${OUT:-./cuda-run}}"
mkdir -p "$out"
jobs="$(nproc)"
# Fixtures (stories260K.gguf): $LOOM_FIXTURES, else build-cuda-fixtures/ when a
# copy was carried there (the device machine has no ../shared).
if [ -z "${LOOM_FIXTURES:-}" ] && [ -d build-cuda-fixtures/gguf ]; then
  export LOOM_FIXTURES="$PWD/build-cuda-fixtures"
fi
summary="$out/summary.txt"
: >"$summary"
step() {  # step NAME LIMIT_S CMD...: runs CMD with a time limit, output to NAME.log
  local name="$1" limit="$2"
  shift 2
  local t0=$SECONDS
  timeout "$limit" "$@" >"$out/$name.log" 2>&1
  local rc=$?
  echo "$name: rc=$rc ($((SECONDS - t0)) s)" | tee -a "$summary"
}

step nvidia-smi 30 nvidia-smi
b="${LOOM_CUDA_BUILD_DIR:-build-cuda-dev}"  # the build folder (yours: not shared with others)
step configure 120 cmake -S . -B "$b" -G Ninja -DLOOM_GUI=OFF -DLOOM_VULKAN=OFF \
  -DLOOM_WERROR=ON -DCMAKE_BUILD_TYPE=Release
step build 330 cmake --build "$b" -j "$jobs" --target loom loom_cuda_matmul_tests \
  loom_cuda_attention_tests loom_cuda_tests
step devices 30 "$b/tools/loom" devices
step matmul_tests 120 "$b/tests/loom_cuda_matmul_tests" --gtest_output="xml:$out/matmul.xml"
step attention_tests 240 "$b/tests/loom_cuda_attention_tests" --gtest_output="xml:$out/attention.xml"
step backend_tests 180 "$b/tests/loom_cuda_tests" --gtest_output="xml:$out/backend.xml"
if command -v compute-sanitizer >/dev/null 2>&1 || [ -x /usr/local/cuda/bin/compute-sanitizer ]; then
  cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
  step memcheck_matmul 180 "$cs" --tool memcheck --error-exitcode 9 \
    "$b/tests/loom_cuda_matmul_tests" --gtest_filter='*Q4_K*:*Q6_K*:*Q4_0*:*F16*:*BF16*'
  step memcheck_attention 180 "$cs" --tool memcheck --error-exitcode 9 \
    "$b/tests/loom_cuda_attention_tests" --gtest_filter='*hd64_h8_kv2*:*hd80*:*hd8_*:*Errors*'
  # Shared-memory races of the flash prefill (both stages of cp.async, the Q8_0
  # path, head_dim 256's separate Q) on its small shapes.
  step racecheck_flash 180 "$cs" --tool racecheck --error-exitcode 9 \
    "$b/tests/loom_cuda_attention_tests" --gtest_filter='*CudaFlashPrefill.NonContiguous*hd128_h8_kv1*:*CudaFlashPrefill.NonContiguous*Q8_0_hd64*:*CudaFlashPrefill.NonContiguous*F16_hd256*'
  step memcheck_backend 180 "$cs" --tool memcheck --error-exitcode 9 \
    "$b/tests/loom_cuda_tests" --gtest_filter='CudaBackendOps.*:CudaForward.*llama_q4_k*'
fi
if [ -n "${LOOM_CUDA_RUN_NO_BENCH:-}" ]; then
  cat "$summary"
  exit 0
fi
step synth 120 "$b/tools/loom" synth -o "$b/bench-tinyllama-q4_0.gguf" --preset tinyllama-1.1b \
  --dtype q4_0
step bench_cpu 120 "$b/tools/loom" bench -m "$b/bench-tinyllama-q4_0.gguf" --backend cpu
step bench_cuda 120 "$b/tools/loom" bench -m "$b/bench-tinyllama-q4_0.gguf" --backend cuda
cat "$summary"
