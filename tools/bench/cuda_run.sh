#!/usr/bin/env bash
# The CUDA backend on a GPU machine (the H200 of the device tool), from
# bundles made here, side by side with llama.cpp's CUDA build:
#
#   tools/bench/cuda_run.sh DIR OUT_DIR [stages...]
#
# DIR holds loom.txz (tools/bench/make_bundle.sh: loom and the three CUDA test
# suites), optionally llama-cuda-sm90.txz (the peer's llama-bench, from
# ../shared/peers/bin) and stories260K.gguf. Stages:
#   info     nvidia-smi, loom devices
#   tests    the three CUDA suites (stories260K through $LOOM_FIXTURES)
#   greedy   stories260K greedy text, CUDA against the CPU
#   memcheck compute-sanitizer on a subset of each suite
#   bench    llama3-8b-shaped Q4_0 / Q4_K_M ($DTYPES): Loom CUDA and llama.cpp
#            CUDA, pp512 / tg128 (-r 3)
#   depth    prefill of $DEPTHS tokens and the decode after it ($DTYPES)
#   ab       Loom's decode alone under each environment of $AB (entries split
#            by ';', e.g. AB="X=1;X=0 Y=1"), llama3-8b-shaped ${DTYPES%% *},
#            -p ${AB_P:-64} -n ${AB_N:-128} -r ${AB_R:-2}, each twice,
#            interleaved: A/B of kernel switches in one run
#   ncu      Nsight Compute: GPU time and DRAM throughput of decode kernels
#            (clocks left as they run: --clock-control none)
#   ncupeer  the same for llama.cpp's decode kernels (llama-bench -p 0)
#   ncudetail Nsight Compute's speed-of-light, occupancy, warp-state and
#            memory sections for $NCU_KERNELS (a regex) into $OUT/ncu_detail.txt
#   profile  Loom's per-op profile of decode and prefill
#   adapt    the adaptive auto (issue 21) on CUDA: adapt_stage.sh
#   tiers    KV tiers (issue 16) on CUDA: prefill of $TIER_DEPTHS tokens of the
#            ${TIER_DTYPE:-q4_k_m} model and the decode after it, (a) all KV on
#            the GPU, (b) half of it in GPU slots and the rest in RAM, (c) half
#            on the GPU, a quarter in RAM, the rest on the SSD, (bs) all but
#            $TIER_SPILL MiB (default 48) on the GPU, the rest in RAM, (cs) the
#            same GPU budget, half the rest in RAM and half on the SSD (the
#            RAM must hold the newest 128 tokens of every layer, 20 MiB for
#            the 8B: cs needs TIER_SPILL 40 or more; 24 MiB of the spill are
#            the 192 tokens of the context that the run never reaches)
#            ($TIER_CONFIGS, default "a b"; $TIER_POLICY, default lru);
#            llama.cpp CUDA with -nkvo 0 and 1 (LLAMA=0: not; $LLAMA_DEPTHS,
#            default every depth); the spill disk's bandwidth (dd)
# Models are written by `loom synth` into /tmp/models.
set -uo pipefail
D="$1"; OUT="$2"; shift 2
stages="${*:-info tests greedy bench}"
mkdir -p "$OUT" /tmp/models /tmp/fx/gguf
[ -d /tmp/bundle ] || tar -C /tmp -xJf "$D/loom.txz"
if [ -f "$D/llama-cuda-sm90.txz" ] && [ ! -d /tmp/peer/cuda ]; then
  mkdir -p /tmp/peer/cuda && tar -C /tmp/peer/cuda -xJf "$D/llama-cuda-sm90.txz"
fi
[ -f "$D/stories260K.gguf" ] && cp "$D/stories260K.gguf" /tmp/fx/gguf/
export LOOM_FIXTURES=/tmp/fx LD_LIBRARY_PATH=/tmp/bundle/lib
B=/tmp/bundle
L="$B/loom"
LB=(env LD_LIBRARY_PATH=/tmp/peer/cuda/bin /tmp/peer/cuda/bin/llama-bench)
T="$(nproc)"
model() {  # model DTYPE -> path (written once)
  local p="/tmp/models/llama3-8b-$1.gguf"
  [ -f "$p" ] || "$L" synth --preset llama3-8b --dtype "$1" -o "$p" > /dev/null
  echo "$p"
}
. "$(dirname "$0")/adapt_stage.sh"
for s in $stages; do
  echo "=== stage $s ($(date +%T))"
  case "$s" in
    adapt) adapt_stage cuda ;;
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv
      lscpu | grep -E "Model name|^CPU\(s\)"
      "$L" devices
      ;;
    tests)
      for t in loom_cuda_matmul_tests loom_cuda_attention_tests loom_cuda_tests; do
        timeout 240 "$B/$t" --gtest_brief=1 --gtest_output="xml:$OUT/$t.xml" > "$OUT/$t.log" 2>&1
        echo "$t: rc=$?"; grep -E "FAILED|PASSED|SKIPPED|Failure" "$OUT/$t.log" | head -n 30
      done
      ;;
    greedy)
      for p in "Once upon a time" "The little dog"; do
        a="$("$L" run -m /tmp/fx/gguf/stories260K.gguf --raw --temp 0 -n 128 -p "$p" --backend cpu 2>/dev/null)"
        b="$("$L" run -m /tmp/fx/gguf/stories260K.gguf --raw --temp 0 -n 128 -p "$p" --backend cuda --strategy gpu 2>/dev/null)"
        if [ "$a" = "$b" ]; then echo "greedy '$p': CUDA = CPU"; else echo "greedy '$p' differs:"; echo "cpu:  $a"; echo "cuda: $b"; fi
      done
      ;;
    memcheck)
      cs="$(command -v compute-sanitizer || echo /usr/local/cuda/bin/compute-sanitizer)"
      timeout 150 "$cs" --tool memcheck --error-exitcode 9 "$B/loom_cuda_matmul_tests" --gtest_brief=1 \
        --gtest_filter='*Q4_K*:*Q6_K*:*Q4_0*:*F16*' 2>&1 | tail -n 6
      timeout 150 "$cs" --tool memcheck --error-exitcode 9 "$B/loom_cuda_attention_tests" --gtest_brief=1 \
        --gtest_filter='*hd64_h8_kv2*:*hd80*:*Errors*' 2>&1 | tail -n 6
      timeout 150 "$cs" --tool memcheck --error-exitcode 9 "$B/loom_cuda_tests" --gtest_brief=1 \
        --gtest_filter='CudaBackendOps.*' 2>&1 | tail -n 6
      ;;
    bench)
      for d in ${DTYPES:-q4_0 q4_k_m}; do
        m="$(model $d)"
        echo "--- $d: Loom CUDA"
        timeout 150 "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -p 512 -n 128 -r 3 2>&1 |
          grep -E "^(prefill|decode|itl|memory|backend|error)|rror"
        echo "--- $d: Loom CUDA op by op (LOOM_CUDA_GRAPHS=0)"
        LOOM_CUDA_GRAPHS=0 timeout 150 "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -p 64 -n 128 -r 2 2>&1 |
          grep -E "^(decode|itl)|rror"
        echo "--- $d: llama.cpp CUDA"
        timeout 120 "${LB[@]}" -m "$m" -ngl 99 -t "$T" -p 512 -n 128 -r 3 2>&1 | grep -E "^\||rror"
      done
      ;;
    depth)
      for d in ${DTYPES:-q4_k_m}; do
        m="$(model $d)"
        for n in ${DEPTHS:-8192 32768}; do
          echo "--- $d depth $n: Loom CUDA"
          timeout 200 "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -c $((n + 256)) -p "$n" -n 64 -r 1 2>&1 |
            grep -E "^(prefill|decode|itl|error)|rror"
          echo "--- $d depth $n: llama.cpp CUDA"
          timeout 200 "${LB[@]}" -m "$m" -ngl 99 -t "$T" -fa 1 -p "$n" -n 0 -r 1 2>&1 | grep -E "^\||rror"
          timeout 200 "${LB[@]}" -m "$m" -ngl 99 -t "$T" -fa 1 -p 0 -n 64 -d "$n" -r 1 2>&1 | grep -E "^\||rror"
        done
      done
      ;;
    ab)
      m="$(model ${DTYPES%% *})"
      IFS=';' read -ra envs <<< "${AB:-LOOM_CUDA_GRAPHS=1}"
      for e in "${envs[@]}" "${envs[@]}"; do  # twice, interleaved, to see the spread
        echo "--- ${DTYPES%% *}: Loom CUDA with $e"
        p="${AB_P:-64}"
        env $e timeout 200 "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -c $((p + 256)) \
          -p "$p" -n "${AB_N:-128}" -r "${AB_R:-2}" 2>&1 | grep -E "^(decode|error)|rror"
      done
      ;;
    ncu)  # per-kernel GPU time and DRAM throughput of decode launches (Nsight Compute)
      m="$(model ${DTYPES%% *})"
      nc="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
      LOOM_CUDA_GRAPHS=0 timeout 300 "$nc" --clock-control none --launch-skip "${NCU_SKIP:-800}" \
        --launch-count "${NCU_COUNT:-26}" \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
        "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -p 1 -n 8 -r 1 --no-profiler 2>&1 |
        grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__|grid_size" | sed -E 's/ +/ /g' | head -n 120
      ;;
    ncupeer)  # llama.cpp's decode kernels, measured as ncu measures Loom's above
      m="$(model ${DTYPES%% *})"
      nc="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
      LD_LIBRARY_PATH=/tmp/peer/cuda/bin timeout 300 "$nc" --clock-control none \
        --launch-skip "${NCU_PEER_SKIP:-1200}" --launch-count "${NCU_COUNT:-26}" \
        --metrics gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,launch__grid_size \
        /tmp/peer/cuda/bin/llama-bench -m "$m" -ngl 99 -t "$T" -p 0 -n 16 -r 1 2>&1 |
        grep -E "^  [a-zA-Z_].*\(|gpu__time|dram__|grid_size" | sed -E 's/ +/ /g' | head -n 120
      ;;
    ncudetail)
      m="$(model ${DTYPES%% *})"
      nc="$(command -v ncu || echo /usr/local/cuda/bin/ncu)"
      LOOM_CUDA_GRAPHS=0 timeout 300 "$nc" --clock-control none -k "regex:${NCU_KERNELS:-matvec_q8}" \
        --launch-skip "${NCU_SKIP:-200}" --launch-count "${NCU_COUNT:-4}" --section SpeedOfLight \
        --section Occupancy --section WarpStateStats --section MemoryWorkloadAnalysis \
        --section LaunchStats "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -p 1 -n 8 \
        -r 1 --no-profiler > "$OUT/ncu_detail.txt" 2>&1
      grep -E "^  [a-zA-Z_].*\(|Duration|Memory Throughput|DRAM Throughput|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Block Limit" "$OUT/ncu_detail.txt" | head -n 80
      ;;
    profile)
      m="$(model ${DTYPES%% *})"
      timeout 120 "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" -p 512 -n 32 -r 1 --profile-every 1 2>&1 | head -n 80
      ;;
    tiers)
      m="$(model ${TIER_DTYPE:-q4_k_m})"
      kvdir=/tmp/kvspill; mkdir -p "$kvdir"
      echo "--- disk under $kvdir (dd, O_DIRECT, 1 GiB)"
      dd if=/dev/zero of="$kvdir/dd.bin" bs=4M count=256 oflag=direct 2>&1 | tail -n 1
      dd if="$kvdir/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -n 1
      rm -f "$kvdir/dd.bin"
      for n in ${TIER_DEPTHS:-4096 32768}; do
        kv=$(( n * 128 ))  # KiB of F16 K/V at n tokens (32 layers x 8 KV heads x 128 x 2 x 2 bytes)
        kvc=$(( (n + 256) * 128 ))  # the same for the whole context of the run
        sp=$(( ${TIER_SPILL:-48} * 1024 ))
        for c in ${TIER_CONFIGS:-a b}; do
          case $c in
            a) flags=() ;;
            b) flags=(--kv-gpu "$(( kv / 2 ))K" --kv-ram 64G) ;;
            c) flags=(--kv-gpu "$(( kv / 2 ))K" --kv-ram "$(( kv / 4 ))K" --kv-dir "$kvdir") ;;
            bs) flags=(--kv-gpu "$(( kvc - sp ))K" --kv-ram 64G) ;;
            cs) flags=(--kv-gpu "$(( kvc - sp ))K" --kv-ram "$(( sp / 2 ))K" --kv-dir "$kvdir") ;;
          esac
          echo "--- depth $n ($c) ${flags[*]}: Loom CUDA"
          timeout "${TIER_TIMEOUT:-200}" "$L" bench -m "$m" --backend cuda --strategy gpu -t "$T" \
            -c $(( n + 256 )) -p "$n" -n 64 -r 1 --kv-policy "${TIER_POLICY:-lru}" "${flags[@]}" 2>&1 |
            grep --line-buffered -E "^(prefill|decode|itl|kv tiers|error|loom)|SSD per|rror|note"
        done
        [ "${LLAMA:-1}" = 0 ] && continue
        case " ${LLAMA_DEPTHS:-$n} " in *" $n "*) ;; *) continue ;; esac
        for nk in 0 1; do
          echo "--- depth $n: llama.cpp CUDA -nkvo $nk"
          timeout "${TIER_TIMEOUT:-200}" "${LB[@]}" -m "$m" -ngl 99 -t "$T" -fa 1 -nkvo "$nk" -p 0 \
            -n "$([ $nk = 1 ] && echo 16 || echo 64)" -d "$n" -r 1 2>&1 | grep --line-buffered -E "^\||rror"
        done
      done
      ;;
  esac
done
