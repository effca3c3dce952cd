# End-to-end check of the loom CLI: synth -> info -> tokenize (GGUF and an HF folder),
# and bad files.
# Invoked by ctest with -DLOOM=<path to loom> -DWORK=<scratch dir>.
file(REMOVE_RECURSE ${WORK})
file(MAKE_DIRECTORY ${WORK})

function(run_ok)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(LAST_OUT "${out}" PARENT_SCOPE)
endfunction()

run_ok(${LOOM} --version)
if(NOT LAST_OUT MATCHES "^loom [0-9]+\\.[0-9]+\\.[0-9]+ \\(commit [0-9a-z-]+\\)")
  message(FATAL_ERROR "unexpected --version output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} synth --preset stories-like --dtype q8_0 --seed 7 --out ${WORK}/tiny.gguf)
run_ok(${LOOM} info ${WORK}/tiny.gguf)
if(NOT LAST_OUT MATCHES "architecture: +llama" OR NOT LAST_OUT MATCHES "Q8_0")
  message(FATAL_ERROR "unexpected info output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} tokenize -m ${WORK}/tiny.gguf -p "Hello world")
if(NOT LAST_OUT MATCHES "^[0-9]+( [0-9]+)*\n?$")
  message(FATAL_ERROR "unexpected tokenize output:\n${LAST_OUT}")
endif()

# The same model as a Hugging Face folder (sharded): info, tokenize and run take the folder.
run_ok(${LOOM} synth --preset stories-like --dtype bf16 --seed 7 --format safetensors
       --shard-mib 1 --out ${WORK}/hf)
run_ok(${LOOM} info ${WORK}/hf)
if(NOT LAST_OUT MATCHES "Hugging Face folder" OR NOT LAST_OUT MATCHES "architecture: +llama")
  message(FATAL_ERROR "unexpected info output for the folder:\n${LAST_OUT}")
endif()
run_ok(${LOOM} tokenize -m ${WORK}/hf -p "Hello world")
if(NOT LAST_OUT MATCHES "^[0-9]+( [0-9]+)*\n?$")
  message(FATAL_ERROR "unexpected tokenize output for the folder:\n${LAST_OUT}")
endif()
run_ok(${LOOM} run -m ${WORK}/hf -p "Once" -n 4 --temp 0)
run_ok(${LOOM} run -m ${WORK}/hf --tokenizer ${WORK}/hf/tokenizer.json -p "Once" -n 4 --temp 0)
# loom convert: the folder to GGUF (Q8_0), which then runs.
run_ok(${LOOM} convert ${WORK}/hf --dtype q8_0 -o ${WORK}/from_hf.gguf)
if(NOT LAST_OUT MATCHES "Q8_0" OR NOT LAST_OUT MATCHES "peak RSS")
  message(FATAL_ERROR "unexpected convert output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} run -m ${WORK}/from_hf.gguf -p "Once" -n 4 --temp 0)
execute_process(COMMAND ${LOOM} convert ${WORK}/hf -o ${WORK}/no/dir/x.gguf RESULT_VARIABLE rc
                ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "no/dir/x.gguf: cannot be written")
  message(FATAL_ERROR "convert to a missing folder: rc=${rc} stderr=${err}")
endif()

# loom models: both the GGUF file and the folder, from --dir alone.
run_ok(${LOOM} models --only-dirs --dir ${WORK})
if(NOT LAST_OUT MATCHES "tiny.gguf" OR NOT LAST_OUT MATCHES "/hf\n")
  message(FATAL_ERROR "loom models did not list the GGUF and the folder:\n${LAST_OUT}")
endif()
file(WRITE ${WORK}/hf/config.json "{\"model_type\": \"mamba\"}")
execute_process(COMMAND ${LOOM} info ${WORK}/hf RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "unknown architecture")
  message(FATAL_ERROR "unknown architecture: rc=${rc} stderr=${err}")
endif()

# Perplexity and KL on a short text (windows of 32 tokens); -m2 and --dtype.
string(REPEAT "Once upon a time a little dog ran to the park to play with a ball. " 8 text)
file(WRITE ${WORK}/text.txt "${text}")
run_ok(${LOOM} perplexity -m ${WORK}/tiny.gguf -f ${WORK}/text.txt --ctx 32 -t 1)
if(NOT LAST_OUT MATCHES "\\[1\\][0-9.]+,\\[2\\]" OR NOT LAST_OUT MATCHES "PPL = [0-9.]+ \\+/- ")
  message(FATAL_ERROR "unexpected perplexity output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} kl -m ${WORK}/tiny.gguf -m2 ${WORK}/tiny.gguf -f ${WORK}/text.txt --ctx 32 -t 1)
if(NOT LAST_OUT MATCHES "KL mean +0.000000" OR NOT LAST_OUT MATCHES "top-1 agreement +100.00%")
  message(FATAL_ERROR "a model against itself:\n${LAST_OUT}")
endif()
run_ok(${LOOM} synth --layers 2 --dim 64 --ffn 128 --seed 3 --out ${WORK}/f32.gguf)
run_ok(${LOOM} kl -m ${WORK}/f32.gguf --dtype q4_0 -f ${WORK}/text.txt --ctx 32 --chunks 2 -t 1)
if(NOT LAST_OUT MATCHES "KL median +0\\.[0-9]*[1-9]")
  message(FATAL_ERROR "F32 against Q4_0 gave no KL:\n${LAST_OUT}")
endif()

# loom plan under a VRAM budget names the most whole layers it holds (where a
# GPU, lavapipe included, is there; without one, auto says it needs one).
execute_process(COMMAND ${LOOM} plan -m ${WORK}/f32.gguf --strategy auto --vram-budget 1G -t 1
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
if(rc EQUAL 0)
  if(NOT out MATCHES "\nfits: +layers:2 at most within the VRAM budget\n")
    message(FATAL_ERROR "unexpected plan output under a budget:\n${out}")
  endif()
elseif(NOT err MATCHES "needs a GPU")
  message(FATAL_ERROR "plan under a budget failed (${rc}):\n${out}\n${err}")
endif()

# loom verify: a placement with layer 1's FFN in Q4_0, as a table and as JSON.
run_ok(${LOOM} plan -m ${WORK}/f32.gguf --save ${WORK}/plan.json)
file(READ ${WORK}/plan.json plan)
string(JSON plan SET "${plan}" layers 1 ffn dtype "\"q4_0\"")
file(WRITE ${WORK}/plan.json "${plan}")
run_ok(${LOOM} verify -m ${WORK}/f32.gguf --placement ${WORK}/plan.json -n 16)
if(NOT LAST_OUT MATCHES "    1  cpu file +[0-9.e+-]+  cpu file +[0-9.e+-]+  cpu Q4_0")
  message(FATAL_ERROR "unexpected verify output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} verify -m ${WORK}/f32.gguf --placement ${WORK}/plan.json -n 16 --json)
if(NOT LAST_OUT MATCHES "\"layer_vs_update\"")
  message(FATAL_ERROR "unexpected verify --json output:\n${LAST_OUT}")
endif()

# loom probe: per-layer activation statistics, as a table and as JSON.
run_ok(${LOOM} probe -m ${WORK}/f32.gguf -n 16 -t 1)
if(NOT LAST_OUT MATCHES "\n1 +ffn_in +-?[0-9]" OR NOT LAST_OUT MATCHES "final +norm")
  message(FATAL_ERROR "unexpected probe output:\n${LAST_OUT}")
endif()
run_ok(${LOOM} probe -m ${WORK}/f32.gguf -n 16 --json)
if(NOT LAST_OUT MATCHES "\"final_norm\": {\"min\"" OR NOT LAST_OUT MATCHES "\"outliers\"")
  message(FATAL_ERROR "unexpected probe --json output:\n${LAST_OUT}")
endif()

# qwen3 and gemma2: synth, run, and a Hugging Face folder converted to GGUF.
foreach(arch qwen3 gemma2)
  run_ok(${LOOM} synth --arch ${arch} --layers 2 --dim 64 --ffn 128 --seed 5 --out ${WORK}/${arch}.gguf)
  run_ok(${LOOM} run -m ${WORK}/${arch}.gguf -p "Once" -n 4 --temp 0 --raw)
  run_ok(${LOOM} synth --arch ${arch} --layers 2 --dim 64 --ffn 128 --seed 5 --format safetensors
         --out ${WORK}/${arch}-hf)
  run_ok(${LOOM} convert ${WORK}/${arch}-hf -o ${WORK}/${arch}-conv.gguf)
  run_ok(${LOOM} run -m ${WORK}/${arch}-conv.gguf -p "Once" -n 4 --temp 0 --raw)
endforeach()

# A truncated copy must fail with a message naming the cause, not crash.
file(READ ${WORK}/tiny.gguf head LIMIT 2000 HEX)
string(LENGTH "${head}" n)
file(WRITE ${WORK}/cut.hex "${head}")
execute_process(COMMAND ${CMAKE_COMMAND} -E true)
file(SIZE ${WORK}/tiny.gguf full)
execute_process(COMMAND head -c 1000 ${WORK}/tiny.gguf OUTPUT_FILE ${WORK}/cut.gguf)
execute_process(COMMAND ${LOOM} info ${WORK}/cut.gguf RESULT_VARIABLE rc ERROR_VARIABLE err OUTPUT_QUIET)
if(rc EQUAL 0 OR NOT err MATCHES "truncated")
  message(FATAL_ERROR "truncated file: rc=${rc} stderr=${err}")
endif()
message(STATUS "cli smoke: ok")
