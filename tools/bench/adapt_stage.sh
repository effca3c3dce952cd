# Sourced by gpu_run.sh and cuda_run.sh (which define L, T and model()):
#
#   adapt_stage BACKEND
#
# The adaptive auto (issue 21) at $ADAPT_FRACS (default "1/4 1/2 3/4") of the
# llama3-8b-shaped Q4_K_M file as VRAM budget: layers:N for the three largest
# N within the budget (`loom plan`'s "fits:" line; that share of the 32
# layers where it has none), each pass of $ADAPT_PASSES (default 1), auto --no-adapt (the cost model's
# choice), and auto (the controller explores during the warm-up rep's 64
# decode tokens; the three reps after it run what it kept), with the
# placements it measured, tried and kept. The target: auto >= 0.97x the best
# layers:N.
adapt_stage() {
  local backend="$1" m size frac budget top n
  m="$(model q4_k_m)"
  size="$(stat -c %s "$m")"
  for frac in ${ADAPT_FRACS:-1/4 1/2 3/4}; do
    budget="$(( size * ${frac%/*} / ${frac#*/} ))"
    top="$("$L" plan -m "$m" --backend "$backend" --strategy auto --vram-budget "$budget" -t "$T" 2>/dev/null |
      sed -n 's/^fits: *layers:\([0-9]*\) .*/\1/p')"
    [ -n "$top" ] || top="$(( 32 * ${frac%/*} / ${frac#*/} ))"
    echo "--- $backend, budget $frac of the file: $budget bytes, $T threads; layers:$top at most fits"
    for pass in $(seq "${ADAPT_PASSES:-1}"); do
      for n in $(( top - 2 )) $(( top - 1 )) "$top"; do
        echo "--- Loom --strategy layers:$n (pass $pass)"
        timeout 200 "$L" bench -m "$m" --backend "$backend" --strategy "layers:$n" --vram-budget "$budget" \
          -t "$T" -p 64 -n 64 -r 3 2>&1 | grep -E "^(decode|strategy|GPU)|rror"
      done
      echo "--- Loom --strategy auto --no-adapt (pass $pass)"
      timeout 200 "$L" bench -m "$m" --backend "$backend" --strategy auto --no-adapt --vram-budget "$budget" \
        -t "$T" -p 64 -n 64 -r 3 2>&1 | grep -E "^(decode|strategy)|rror"
      echo "--- Loom --strategy auto (adaptive, pass $pass)"
      timeout 300 "$L" bench -m "$m" --backend "$backend" --strategy auto --vram-budget "$budget" \
        -t "$T" -p 64 -n 64 -r 3 2>&1 | grep -E "^(decode|strategy|  token|  kept)|rror"
    done
  done
}
