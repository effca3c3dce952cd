#!/usr/bin/env bash
# Benchmarks on a GPU machine (the H200 of the device tool), side by side with
# llama.cpp's Vulkan build, from a bundle of prebuilt binaries:
#
#   tools/bench/gpu_run.sh BUNDLE_DIR OUT_DIR [stages...]
#
# BUNDLE_DIR holds loom, loom_gpu_tests, loom_unit_tests, loom_membw_bench,
# lib/ (the shared libraries they need) and llama/ (llama-bench with its ggml
# libraries; llama.cpp is never part of this repository). Stages:
#   info, tests
#   issue4   full-GPU decode/prefill of llama3-8b-shaped Q4_0 and Q4_K_M (or
#            $ISSUE4_DTYPES) against llama.cpp, and a per-shader profile
#   issue5   half the weights' size as VRAM budget: Loom's strategies against
#            llama.cpp's -ngl and --override-tensor placements, and CPU-only
#            (LLAMA=0: Loom alone; STRATEGIES: Loom's strategies)
#   overhead the profiler's cost (on / off)
#   quick    Loom's full-GPU decode and shader profile alone ($QUICK_DTYPES)
#   diag5, auto5, auto5b  per-layer tables of hybrid steps, thread counts
#   diag5b   a hybrid step's host op shares and GPU shader times, GPU clocks sampled
#   keep5    layers:16 with keep-busy kernels of several sizes, GPU clocks sampled
#   sweep    single-token matvec shapes $SWEEP for $SWEEP_DTYPES
#   ab       decode ($AB_DTYPES, Q4_0) under each setting of $AB: the decode
#            fusions (LOOM_VK_FUSE) and integer-dot matvecs (LOOM_VK_INT_DOT)
#   probe    per-shape matvec times, and with the Q4_0 arithmetic left out
#   prefill  prefill ($QUICK_DTYPES) under each prefill matmul in $PREFILL_AB
#            (LOOM_VK_COOPMAT: 0 tiled; cooperative matrices: 4 four subgroups,
#            64 / 128 eight with that many tokens per tile, 2 eight by the
#            shape, 1 the default), each tile of $PREFILL_TILES for every
#            matmul (LOOM_VK_CM_TILE), then the default's per-shader profile
#   gemm     the prefill matmul alone (loom_vulkan_gemm_bench): GPU time and
#            TFLOP/s per dtype ($GEMM_DTYPES), token count ($GEMM_TOKENS) and
#            cooperative-matrix tile ($GEMM_TILES: all, or names)
#   depth    prefill of $DEPTHS tokens and decode after them (Q4_K_M or
#            $DTYPES), prefill attention on cooperative matrices and tiled
#            (LOOM_VK_ATTN_CM=0; $DEPTH_AB), against llama.cpp Vulkan (-fa 1)
#   llprof   llama.cpp's own per-op decode timings (GGML_VK_PERF_LOGGER) and Loom's
#            profile of the same decode ($QUICK_DTYPES; $DEPTH tokens of context before)
#   adapt    the adaptive auto (issue 21) at $ADAPT_FRACS (default 1/4 1/2 3/4)
#            of the Q4_K_M file as VRAM budget: layers:N for the three largest
#            N about that share of the layers, auto --no-adapt, and auto (the
#            controller explores in the warm-up rep's 64 tokens; the reps after
#            run what it kept), with the placements it tried and kept
#   tiers    KV tiers (issue 16): decode after $TIER_DEPTHS tokens of the Q4_K_M
#            model, (a) all KV on the GPU, (b) half of it in GPU memory and the
#            rest in RAM, (c) half on the GPU, a quarter in RAM, the rest on
#            the SSD ($TIER_CONFIGS: a b c); llama.cpp with and without -nkvo;
#            the spill folder's disk read/write bandwidth (dd, O_DIRECT).
#            Its filters are line-buffered: a run cut by its time limit keeps
#            what it printed (pipe the whole script through `tee` likewise,
#            never through a block-buffered grep)
# Models are written by `loom synth` into /tmp/models.
set -uo pipefail
B="$1"; OUT="$2"; shift 2
stages="${*:-info tests issue4 issue5 overhead}"
export LD_LIBRARY_PATH="$B/lib"
L="$B/loom"
LB() { LD_LIBRARY_PATH="$B/llama:$B/lib" "$B/llama/llama-bench" "$@"; }
T="$(nproc)"
M=/tmp/models
mkdir -p "$M" "$OUT"
model() {  # model DTYPE -> path (written once)
  local p="$M/llama3-8b-$1.gguf"
  [ -f "$p" ] || { /usr/bin/time -f "synth $1: %e s" "$L" synth --preset llama3-8b --dtype "$1" -o "$p" > /dev/null; }
  echo "$p"
}
. "$(dirname "$0")/adapt_stage.sh"
half_budget() {  # sets m (the Q4_K_M model) and half (half its size, the VRAM budget)
  m="$(model q4_k_m)"
  half="$(( $(stat -c %s "$m") / 2 ))"
}
for s in $stages; do
  echo "=== stage $s ($(date +%T))"
  case "$s" in
    info)
      nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
      lscpu | grep -E "Model name|^CPU\(s\)|Thread|Socket|NUMA node\(s\)|L3"
      "$L" devices
      "$B/loom_membw_bench" 1 4 8 "$T"
      ;;
    tests)  # time-limited: a hang must not eat the device budget
      timeout 120 "$B/loom_gpu_tests" --gtest_brief=1 2>&1 | tail -n 15
      timeout 240 "$B/loom_unit_tests" --gtest_brief=1 \
        --gtest_filter='Vulkan*:*VulkanAttention*:*VulkanMatmul*:*VulkanKv*:*VulkanForward*' 2>&1 | tail -n 5
      ;;
    ab)  # decode ($AB_DTYPES) under each setting of $AB (decode fusions, integer-dot matvecs)
      for d in ${AB_DTYPES:-q4_0}; do
        m="$(model $d)"
        for e in ${AB:-LOOM_VK_FUSE=0 LOOM_VK_FUSE=4 LOOM_VK_INT_DOT=0 LOOM_VK_INT_DOT=1 LOOM_VK_INT_DOT=5}; do
          echo "--- $d $e"
          env "$e" timeout 90 "$L" bench -m "$m" --backend vulkan -t "$T" -p 512 -n 128 -r 2 2>&1 | grep -E "^(decode|itl)"
        done
      done
      ;;
    probe)  # per-shape matvec us/call, then with the Q4_0 matvecs' arithmetic left out (LOOM_VK_PROBE_LOADS)
      m="$(model q4_0)"
      LOOM_VK_FUSE=0 LOOM_VK_INT_DOT=0 "$B/loom_vulkan_bench" "$m" 16 32 --sweep 0 2>&1 | grep -E "^sweep"
      LOOM_VK_FUSE=0 LOOM_VK_INT_DOT=0 LOOM_VK_PROBE_LOADS=1 "$B/loom_vulkan_bench" "$m" 16 32 --sweep 0 2>&1 | grep -E "^sweep"
      ;;
    prefill)  # prefill A/B of the matmul kernels (LOOM_VK_COOPMAT), and the default's profile
      for d in ${QUICK_DTYPES:-q4_0 q4_k_m}; do
        m="$(model $d)"
        for e in ${PREFILL_AB:-0 4 128 1}; do
          echo "--- $d LOOM_VK_COOPMAT=$e"
          LOOM_VK_COOPMAT=$e timeout 90 "$L" bench -m "$m" --backend vulkan -t "$T" -p "${PP:-512}" -n 4 -r 3 2>&1 | grep -E "^prefill"
        done
        for e in ${PREFILL_TILES:-}; do
          echo "--- $d LOOM_VK_CM_TILE=$e"
          LOOM_VK_CM_TILE=$e timeout 90 "$L" bench -m "$m" --backend vulkan -t "$T" -p "${PP:-512}" -n 4 -r 3 2>&1 | grep -E "^prefill"
        done
        echo "--- $d: per-shader profile of prefill"
        timeout 90 "$L" bench -m "$m" --backend vulkan -t "$T" -p "${PP:-512}" -n 1 -r 1 --gpu-profile 2>&1 | sed -n '/GPU shaders/,$p' | head -n 16
      done
      ;;
    issue4)
      for d in ${ISSUE4_DTYPES:-q4_0 q4_k_m}; do
        m="$(model $d)"
        echo "--- $d: Loom Vulkan"
        "$L" bench -m "$m" --backend vulkan -t "$T" -p 512 -n 128 -r 3 2>&1 | grep -E "^(prefill|decode|itl|memory|backend)"
        echo "--- $d: llama.cpp Vulkan"
        LB -m "$m" -ngl 99 -t "$T" -p 512 -n 128 -r 3 2>&1 | grep -E "^\|"
        [ "${ISSUE4_PROFILE:-1}" = 0 ] && continue
        echo "--- $d: Loom Vulkan, per-shader profile"
        "$L" bench -m "$m" --backend vulkan -t "$T" -p 16 -n 32 -r 1 --gpu-profile 2>&1 | sed -n '/GPU shaders/,$p' | head -n 30
      done
      ;;
    gemm)  # the prefill matmul alone per dtype, shape and cooperative-matrix tile ($GEMM_TILES)
      "$B/loom_vulkan_gemm_bench" --dtypes "${GEMM_DTYPES:-q4_0,q4_k,q6_k,f16}" --tokens "${GEMM_TOKENS:-512,2048}" \
        --tiles "${GEMM_TILES:-all}" --reps "${GEMM_REPS:-10}" 2>&1 | grep --line-buffered -E "^(gemm|device)|rror"
      ;;
    depth)  # long prompts: prefill at depth, decode after it, against llama.cpp (-fa 1)
      for d in ${DTYPES:-q4_k_m}; do
        m="$(model $d)"
        for n in ${DEPTHS:-8192 32768}; do
          for e in ${DEPTH_AB:-1 0}; do
            echo "--- $d depth $n: Loom Vulkan, LOOM_VK_ATTN_CM=$e"
            LOOM_VK_ATTN_CM=$e timeout "${DEPTH_TIMEOUT:-200}" "$L" bench -m "$m" --backend vulkan -t "$T" \
              -c $((n + 256)) -p "$n" -n 64 -r 1 2>&1 | grep --line-buffered -E "^(prefill|decode|itl|error)|rror"
          done
          [ "${LLAMA:-1}" = 0 ] && continue
          echo "--- $d depth $n: llama.cpp Vulkan"
          LD_LIBRARY_PATH="$B/llama:$B/lib" timeout 200 "$B/llama/llama-bench" -m "$m" -ngl 99 -t "$T" -fa 1 -p "$n" -n 0 -r 1 2>&1 | grep --line-buffered -E "^\||rror"
          LD_LIBRARY_PATH="$B/llama:$B/lib" timeout 200 "$B/llama/llama-bench" -m "$m" -ngl 99 -t "$T" -fa 1 -p 0 -n 64 -d "$n" -r 1 2>&1 | grep --line-buffered -E "^\||rror"
        done
      done
      ;;
    quick)  # Loom alone: full-GPU decode and the per-shader profile
      for d in ${QUICK_DTYPES:-q4_0 q4_k_m}; do
        m="$(model $d)"
        echo "--- $d: Loom Vulkan"
        "$L" bench -m "$m" --backend vulkan -t "$T" -p 64 -n 128 -r 2 2>&1 | grep -E "^(prefill|decode|itl)"
        "$L" bench -m "$m" --backend vulkan -t "$T" -p 16 -n 32 -r 1 --gpu-profile 2>&1 | sed -n "/GPU shaders/,\$p" | head -n 30
      done
      ;;
    sweep)  # single-token matvec shapes (loom_vulkan_bench --sweep), full-GPU decode
      for d in ${SWEEP_DTYPES:-q4_0 q4_k_m}; do
        echo "--- $d"
        "$B/loom_vulkan_bench" "$(model $d)" 16 32 --sweep "${SWEEP:-0}" 2>&1 | grep -E "^(decode:|sweep)"
      done
      ;;
    llprof)
      for d in ${QUICK_DTYPES:-q4_0}; do
        echo "--- $d: llama.cpp per-op timings of one decode step (the last one printed)"
        GGML_VK_PERF_LOGGER=1 LB -m "$(model $d)" -ngl 99 -p 0 -n 8 -d "${DEPTH:-0}" -r 1 > /tmp/llprof.txt 2>&1
        awk '/^Vulkan Timings:/ { n = 0; delete a } { a[n++] = $0 } END { for (i = 0; i < n; ++i) print a[i] }' /tmp/llprof.txt | head -n 60
        grep -E "^\|" /tmp/llprof.txt
        echo "--- $d: Loom, the same decode"
        "$L" bench -m "$(model $d)" --backend vulkan -t "$T" -p "${DEPTH:-16}" -n 32 -r 1 --gpu-profile 2>&1 |
          sed -n '/^decode/p; /GPU shaders/,$p' | head -n 40
      done
      ;;
    issue5)
      half_budget
      echo "--- Q4_K_M, VRAM budget $half bytes (half the file), $T threads"
      for st in ${STRATEGIES:-auto attn-gpu layers:16}; do
        echo "--- Loom --strategy $st"
        "$L" bench -m "$m" --strategy "$st" --vram-budget "$half" -t "$T" -p 64 -n 64 -r 2 2>&1 |
          grep -E "^(prefill|decode|itl|strategy|predicted|measured|GPU|CPU|cost)"
      done
      if [ "${FULL5:-1}" = 1 ]; then  # FULL5=0: without the rows at T - 1 threads and over the budget
        echo "--- Loom --strategy layers:16, $(( T - 1 )) threads"
        "$L" bench -m "$m" --strategy layers:16 --vram-budget "$half" -t "$(( T - 1 ))" -p 64 -n 64 -r 2 2>&1 |
          grep -E "^(decode|measured)"
      fi
      [ "${LLAMA:-1}" = 0 ] && continue  # Loom's figures only
      if [ "${FULL5:-1}" = 1 ]; then
        echo "--- llama.cpp -ngl 16, $(( T - 1 )) threads"
        LB -m "$m" -ngl 16 -t "$(( T - 1 ))" -p 64 -n 64 -r 2 2>&1 | grep -E "^\|"
      fi
      echo "--- llama.cpp -ngl 16"
      LB -m "$m" -ngl 16 -t "$T" -p 64 -n 64 -r 2 2>&1 | grep -E "^\|"
      if [ "${FULL5:-1}" = 1 ]; then
        echo "--- llama.cpp -ngl 99, FFN of layers 16-31 on the CPU (-ot; over the budget)"
        LB -m "$m" -ngl 99 -ot 'blk\.(1[6-9]|2[0-9]|3[01])\.ffn_.*=CPU' -t "$T" -p 64 -n 64 -r 2 2>&1 | grep -E "^\|"
      fi
      echo "--- llama.cpp -ngl 99, FFN up/gate of every layer on the CPU (-ot)"
      LB -m "$m" -ngl 99 -ot 'ffn_(up|gate)=CPU' -t "$T" -p 64 -n 64 -r 2 2>&1 | grep -E "^\|"
      echo "--- CPU only: Loom, llama.cpp"
      "$L" bench -m "$m" --strategy cpu -t "$T" -p 64 -n 32 -r 2 2>&1 | grep -E "^(prefill|decode)"
      LB -m "$m" -ngl 0 -t "$T" -p 64 -n 32 -r 2 2>&1 | grep -E "^\|"
      ;;
    diag5)  # where a hybrid step's time goes: per-layer tables, thread counts, spinning workers
      half_budget
      B5() { "$L" bench -m "$m" -p 64 -n 64 -r 2 "$@" 2>&1 | grep -E "^(decode|[0-9]+ |output|predicted|measured|cost|embed)"; }
      echo "--- cpu, $T threads, per layer"; B5 --strategy cpu -t "$T" --profile-every 1
      echo "--- layers:0 (Vulkan open, nothing on it)"; B5 --strategy layers:0 -t "$T" | grep -E "^(decode|measured)"
      echo "--- layers:16, $T threads, per layer"; B5 --strategy layers:16 --vram-budget "$half" -t "$T" --profile-every 1
      for t in $(( T - 1 )) $(( T - 2 )) $(( T / 2 )); do
        echo "--- layers:16, $t threads"; B5 --strategy layers:16 --vram-budget "$half" -t "$t" | grep -E "^(decode|measured)"
      done
      echo "--- layers:16, $T threads, workers spin 20 ms"; LOOM_CPU_SPIN_US=20000 B5 --strategy layers:16 --vram-budget "$half" -t "$T" | grep -E "^(decode|measured)"
      echo "--- cpu, $T threads, workers spin 20 ms"; LOOM_CPU_SPIN_US=20000 B5 --strategy cpu -t "$T" | grep -E "^(decode|measured)"
      ;;
    diag5b)  # a hybrid step: GPU clocks while it runs ($OUT/clocks.csv), host op shares, GPU shader times
      half_budget
      nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,utilization.gpu --format=csv,noheader -lms 50 > "$OUT/clocks.csv" 2>&1 &
      smi=$!
      for st in layers:16 gpu; do
        for pr in "" --gpu-profile; do
          echo "--- $st ${pr:-(no GPU profile)} from $(date +%T.%N)"
          "$L" bench -m "$m" --strategy "$st" --vram-budget "$([ $st = gpu ] && echo 0 || echo $half)" -t "$T" -p 64 -n 64 -r 2 $pr 2>&1 |
            grep -vE "^([0-9]+ |load|note)" | head -n 45
          echo "--- until $(date +%T.%N)"
        done
      done
      kill "$smi"
      ;;
    keep5)  # keep-busy kernel sizes in a hybrid step, GPU clocks sampled ($OUT/clocks.csv)
      half_budget
      nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,utilization.gpu --format=csv,noheader -lms 50 > "$OUT/clocks.csv" 2>&1 &
      smi=$!
      for k in ${KEEPS:-"--gpu-keep-busy 0" "--gpu-keep-busy 132" "--gpu-keep-busy 1"}; do
        echo "--- layers:16 $k from $(date +%T.%N)"
        "$L" bench -m "$m" --strategy layers:16 $k --vram-budget "$half" -t "$T" -p 64 -n 64 -r 2 2>&1 |
          grep -E "^(decode|itl|measured)"
      done
      echo "--- until $(date +%T.%N)"
      kill "$smi"
      ;;
    auto5)  # the auto strategy's per-layer table at half the weights as budget, and layers:16
      half_budget
      "$L" bench -m "$m" --strategy auto --vram-budget "$half" -t "$T" -p 64 -n 64 -r 2 --profile-every 1 2>&1 |
        grep -E "^(decode|[0-9]+ |output|predicted|measured|cost|embed|GPU|CPU)"
      "$L" bench -m "$m" --strategy layers:16 --vram-budget "$half" -t "$T" -p 64 -n 64 -r 2 2>&1 |
        grep -E "^(decode|predicted|measured|cost)"
      ;;
    adapt)  # the adaptive auto against layers:N and the static auto at several budgets
      adapt_stage vulkan
      ;;
    auto5b)  # auto against layers:16 at half the weights as budget, and the CPU profiler's cost
      half_budget
      for st in auto layers:16; do
        echo "--- Loom --strategy $st"
        "$L" bench -m "$m" --strategy "$st" --vram-budget "$half" -t "$T" -p 64 -n 64 -r 2 2>&1 |
          grep -E "^(decode|predicted|measured|cost|GPU|CPU)"
      done
      echo "--- auto, per layer"
      "$L" bench -m "$m" --strategy auto --vram-budget "$half" -t "$T" -p 16 -n 32 -r 1 --profile-every 1 2>&1 |
        grep -E "^([0-9]+ |output|measured)"
      m0="$(model q4_0)"
      for rep in 1 2; do
        for pr in "" --no-profiler; do
          echo "--- profiler overhead: cpu ${pr:-(profiler on)}"
          "$L" bench -m "$m0" --strategy cpu -t "$T" -p 16 -n 64 -r 3 $pr 2>&1 | grep -E "^decode:"
        done
      done
      ;;
    tiers)  # KV tiers: decode after N tokens with the KV on GPU / GPU+RAM / GPU+RAM+SSD
      m="$(model ${TIER_DTYPE:-q4_k_m})"
      kvdir=/tmp/kvspill; mkdir -p "$kvdir"
      echo "--- disk under $kvdir (dd, O_DIRECT, 1 GiB)"
      dd if=/dev/zero of="$kvdir/dd.bin" bs=4M count=256 oflag=direct 2>&1 | tail -n 1
      dd if="$kvdir/dd.bin" of=/dev/null bs=4M iflag=direct 2>&1 | tail -n 1
      rm -f "$kvdir/dd.bin"
      for n in ${TIER_DEPTHS:-4096 16384}; do
        kv=$(( n * 128 ))  # KiB of F16 K/V at n tokens (32 layers x 8 KV heads x 128 x 2 x 2 bytes)
        for c in ${TIER_CONFIGS:-a b c}; do
          case $c in
            a) flags=(); what="all KV on the GPU" ;;
            b) flags=(--kv-gpu "$(( kv / 2 ))K" --kv-ram 64G); what="GPU $(( kv / 2048 )) MiB + RAM" ;;
            c) flags=(--kv-gpu "$(( kv / 2 ))K" --kv-ram "$(( kv / 4 ))K" --kv-dir "$kvdir")
               what="GPU $(( kv / 2048 )) MiB + RAM $(( kv / 4096 )) MiB + SSD" ;;
          esac
          echo "--- depth $n ($c) $what: Loom Vulkan"
          timeout "${TIER_TIMEOUT:-200}" "$L" bench -m "$m" --backend vulkan --strategy gpu -t "$T" \
            -c $(( n + 256 )) -p "$n" -n 64 -r 1 "${flags[@]}" 2>&1 |
            grep --line-buffered -E "^(prefill|decode|itl|kv tiers|error)|SSD per|rror|note"
        done
        [ "${LLAMA:-1}" = 0 ] && continue
        for nk in 0 1; do
          echo "--- depth $n: llama.cpp Vulkan -nkvo $nk"
          timeout "${TIER_TIMEOUT:-200}" env LD_LIBRARY_PATH="$B/llama:$B/lib" "$B/llama/llama-bench" -m "$m" -ngl 99 -t "$T" -fa 1 -nkvo "$nk" -p 0 -n 64 -d "$n" -r 1 2>&1 | grep --line-buffered -E "^\||rror"
        done
      done
      ;;
    overhead)
      m="$(model q4_0)"
      for b in vulkan cpu; do
        for pr in "" --no-profiler; do
          echo "--- profiler overhead: $b ${pr:-(profiler on)}"
          "$L" bench -m "$m" --backend "$b" --strategy "$([ $b = cpu ] && echo cpu || echo gpu)" -t "$T" -p 16 -n 64 -r 3 $pr 2>&1 | grep -E "^decode"
        done
      done
      ;;
  esac
done
echo "=== done ($(date +%T))"
