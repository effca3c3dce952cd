#!/usr/bin/env bash
# Writes the synthetic Hugging Face folders that tests/unit/hf_reference_test.cpp
# compares with transformers, and their manifest:
#
#   tools/hf_reference/make_models.sh LOOM_BINARY OUT_DIR
#   python3 tools/hf_reference/hf_logits.py OUT_DIR/manifest.json tests/data/hf_reference.json
#
# (the second step where torch and transformers are: the device tool's GPU
# machine). Each case is `loom synth --format safetensors` with the options in
# its "synth" entry; the test writes the same folders from the same entries, and
# applies "config" (keys set in config.json: mistral is the llama folder
# under Mistral's class) on both sides.
set -euo pipefail
loom="$1"
out="$2"
mkdir -p "$out"
tokens='[0, 77, 301, 5, 122, 9, 260, 33, 14, 400, 2, 88]'
cases=(
  'llama_f32|--arch llama --dtype f32 --seed 11|{}'
  'llama_bf16_tied|--arch llama --dtype bf16 --seed 12 --tied|{}'
  'mistral_f32|--arch llama --dtype f32 --seed 13|{"architectures":["MistralForCausalLM"],"model_type":"mistral","sliding_window":null}'
  'qwen2_f32|--arch qwen2 --dtype f32 --seed 14|{}'
  'qwen2_f16_tied|--arch qwen2 --dtype f16 --seed 15 --tied|{}'
  'phi3_f32|--arch phi3 --dtype f32 --kv-heads 4 --seed 16|{}'
  'qwen3_f32_tied|--arch qwen3 --dtype f32 --seed 17 --tied|{}'
  'gemma2_f32_tied|--arch gemma2 --dtype f32 --seed 18 --tied --sliding-window 4|{}'
)
{
  echo "{\"tokens\": $tokens, \"models\": ["
  sep=""
  for c in "${cases[@]}"; do
    IFS='|' read -r name args config <<< "$c"
    # shellcheck disable=SC2086
    "$loom" synth $args --format safetensors --out "$out/$name" 2> /dev/null
    printf '%s{"name": "%s", "folder": "%s", "synth": "%s", "config": %s}\n' \
      "$sep" "$name" "$name" "$args" "$config"
    sep=","
  done
  echo "]}"
} > "$out/manifest.json"
echo "wrote $out/manifest.json"
