#!/usr/bin/env bash
# Side-by-side speed of Loom and llama.cpp on the same GGUF files, same thread
# count, in one run (interleaved passes, so drift in machine load hits both).
#
#   tools/bench/side_by_side.sh LLAMA_BENCH_BINARY THREADS PASSES MODEL.gguf...
#
# Prints one row per model and pass, then the ratio of the medians. llama.cpp
# itself is never part of this repository: build it elsewhere and pass its
# llama-bench here.
set -euo pipefail
llama_bench="$1"; threads="$2"; passes="$3"; shift 3
here="$(cd "$(dirname "$0")/../.." && pwd)"
loom="${LOOM_BIN:-$here/build/tools/loom}"
pp="${PP:-128}"; tg="${TG:-64}"; reps="${REPS:-3}"

printf "%-28s %5s %10s %10s %10s %10s\n" model pass loom_pp llama_pp loom_tg llama_tg
declare -A lp lt cp ct
for m in "$@"; do
  name="$(basename "$m")"
  for p in $(seq 1 "$passes"); do
    j="$("$loom" bench -m "$m" -t "$threads" -p "$pp" -n "$tg" -r "$reps" --json)"
    l_pp="$(echo "$j" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["prefill_tps"])')"
    l_tg="$(echo "$j" | python3 -c 'import json,sys; print("%.1f" % json.load(sys.stdin)["decode_tps"])')"
    r="$("$llama_bench" -m "$m" -t "$threads" -p "$pp" -n "$tg" -r "$reps" -o json 2>/dev/null)"
    c_pp="$(echo "$r" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f" % [x["avg_ts"] for x in d if x["n_prompt"]>0][0])')"
    c_tg="$(echo "$r" | python3 -c 'import json,sys; d=json.load(sys.stdin); print("%.1f" % [x["avg_ts"] for x in d if x["n_gen"]>0][0])')"
    printf "%-28s %5s %10s %10s %10s %10s\n" "$name" "$p" "$l_pp" "$c_pp" "$l_tg" "$c_tg"
    lp[$name]+="$l_pp "; cp[$name]+="$c_pp "; lt[$name]+="$l_tg "; ct[$name]+="$c_tg "
  done
done
echo
echo "medians and ratios (loom / llama.cpp):"
for m in "$@"; do
  name="$(basename "$m")"
  python3 - "$name" "${lp[$name]}" "${cp[$name]}" "${lt[$name]}" "${ct[$name]}" <<'PY'
import statistics, sys
name, a, b, c, d = sys.argv[1:]
med = lambda s: statistics.median(float(x) for x in s.split())
lp, cp, lt, ct = med(a), med(b), med(c), med(d)
print(f"{name:28s} prefill {lp:8.1f} vs {cp:8.1f} = {lp/cp:5.2f}x   decode {lt:7.1f} vs {ct:7.1f} = {lt/ct:5.2f}x")
PY
done
