// loom: the command-line front end. Parses arguments and hands them to cmd_*.
#include <CLI/CLI.hpp>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/core/version.h"
#include "tools/loom/commands.h"

int main(int argc, char** argv) {
  using namespace loom::cli;
  CLI::App app{"loom: local LLM engine (hybrid CPU/GPU)"};
  app.set_version_flag("--version", std::string("loom ") + loom::version_line());
  app.require_subcommand(1);

  InfoOptions info;
  auto* c_info =
      app.add_subcommand("info", "Describe a GGUF model: architecture, shapes, dtypes, tokenizer");
  c_info->add_option("model", info.model, "GGUF file")->required();
  c_info->add_option("-m,--model", info.model, "GGUF file");
  c_info->add_flag("--tensors", info.list_tensors, "List every tensor");
  c_info->add_flag("--metadata", info.list_metadata, "List every metadata key");

  TokenizeOptions tok;
  auto* c_tok = app.add_subcommand("tokenize", "Print the token ids of a text");
  c_tok->add_option("-m,--model", tok.model, "GGUF file with a tokenizer")->required();
  c_tok->add_option("-p,--prompt", tok.prompt, "Text to tokenize")->required();
  c_tok->add_flag("--no-bos", tok.no_bos, "Do not add the BOS token");
  c_tok->add_flag("--parse-special", tok.parse_special, "Recognise special tokens in the text");
  c_tok->add_flag("--pieces", tok.pieces, "Print each token's piece next to its id");

  SynthOptions syn;
  auto* c_syn = app.add_subcommand("synth", "Write a synthetic model (random weights) as GGUF");
  c_syn->add_option("--out,-o", syn.out, "Output .gguf")->required();
  c_syn->add_option(
      "--preset", syn.preset,
      "stories-like | tinyllama-1.1b | qwen2-0.5b | phi3-mini | llama3-8b | qwen3-0.6b | "
      "gemma2-2b");
  auto opt = [&](const char* name, auto& v, bool& set, const char* help) {
    c_syn->add_option(name, v, help)->each([&set](const std::string&) { set = true; });
  };
  opt("--arch", syn.arch, syn.set_arch, "llama | qwen2 | phi3 | qwen3 | gemma2");
  opt("--layers", syn.layers, syn.set_layers, "Number of layers");
  opt("--dim", syn.dim, syn.set_dim, "Embedding size");
  opt("--ffn", syn.ffn, syn.set_ffn, "FFN hidden size");
  opt("--heads", syn.heads, syn.set_heads, "Attention heads");
  opt("--kv-heads", syn.kv_heads, syn.set_kv_heads, "KV heads (GQA)");
  opt("--vocab", syn.vocab, syn.set_vocab, "Vocabulary size (default: the tokenizer's)");
  opt("--ctx", syn.ctx, syn.set_ctx, "Context length");
  c_syn->add_option("--dtype", syn.dtype,
                    "Weight dtype: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k..q6_k");
  c_syn->add_option("--seed", syn.seed, "Random seed");
  c_syn->add_option("--vocab-from", syn.vocab_from, "Copy the tokenizer from this GGUF");
  c_syn->add_option("--format", syn.format,
                    "gguf (a file) or safetensors (a Hugging Face folder: --out is the folder)");
  c_syn->add_option("--shard-mib", syn.shard_mib, "safetensors: shards of at most this size");
  c_syn->add_option("--sliding-window", syn.sliding_window,
                    "gemma2: attention window of the even layers (default 4096)");
  c_syn->add_flag("--tied", syn.tied, "No output matrix: the token embedding is reused");

  auto engine_opts = [](CLI::App* c, EngineOptions& e) {
    c->add_option("-m,--model", e.model, "GGUF model file, or a Hugging Face model folder")
        ->required();
    c->add_option("--tokenizer", e.tokenizer,
                  "Use this tokenizer and chat template instead of the model's: a GGUF file, a "
                  "tokenizer.json or a model folder");
    c->add_option("-t,--threads", e.threads, "CPU threads (default: all cores)");
    c->add_option("-c,--ctx", e.ctx, "Context size in tokens (default: the model's, at most 4096)");
    c->add_option("--kv-type", e.kv_type, "KV cache type: f16 | q8_0");
    c->add_option("-b,--batch", e.batch,
                  "Prefill chunk size in tokens (default: up to 4096 where a GPU runs part of the "
                  "model, as its memory allows; 256 on the CPU)");
    c->add_option(
        "--backend", e.backend,
        "cpu | vulkan | cuda (falls back to the CPU when the GPU backend is unavailable)");
    c->add_option("--device", e.device, "Vulkan device index (see `loom devices`)");
    c->add_option("--strategy", e.strategy,
                  "Placement: gpu | cpu | layers:N | attn-gpu | auto | custom (default: gpu with "
                  "--backend vulkan, else cpu)");
    c->add_option("--placement", e.placement,
                  "Placement JSON file (strategy custom; `loom plan --save` writes one)");
    c->add_option("--vram-budget", e.vram_budget,
                  "GPU memory Loom may use, e.g. 8G (default: all of it)");
    c->add_option("--cpu-dtype", e.cpu_dtype,
                  "Requantize weights placed on the CPU to this type (e.g. q4_0)");
    c->add_option("--gpu-dtype", e.gpu_dtype,
                  "Requantize weights placed on the GPU to this type (e.g. q8_0)");
    c->add_option("--kv-gpu", e.kv_gpu,
                  "GPU memory for the KV blocks of layers whose attention runs there, e.g. 1G; "
                  "blocks beyond it move to host RAM (then the SSD), and attention merges the "
                  "GPU's and the CPU's parts (default: all of it while it fits beside the weights, "
                  "else what is left of the GPU's memory; Vulkan and CUDA)");
    c->add_option("--kv-ram", e.kv_ram,
                  "Host RAM for KV blocks, e.g. 2G; older blocks beyond it spill to the SSD "
                  "(default: no limit, or half the free memory when the context would not fit)");
    c->add_option("--kv-dir", e.kv_dir,
                  "Folder for the KV spill file (default: $XDG_CACHE_HOME/loom/kv)");
    c->add_option("--kv-policy", e.kv_policy,
                  "Which KV blocks go to the SSD first: importance (least attention) | lru "
                  "(oldest)");
    c->add_option("--kv-spill-type", e.kv_spill_type,
                  "KV precision on the SSD: q8_0 (under an F16 cache) or fp8 (E4M3, a scale per "
                  "block) requantize blocks as they go down (about half the bytes to read "
                  "back); default: as in RAM");
    c->add_flag("--no-adapt", e.no_adapt,
                "With --strategy auto: keep the planned placement (by default auto measures "
                "decode steps and tries other placements between tokens, keeping the fastest)");
    c->add_option("--adapt-window", e.adapt_window,
                  "Decode tokens each placement runs while auto explores (default 8)");
    c->add_option("--gpu-keep-busy", e.gpu_keep_groups,
                  "Experimental: while the CPU works in a hybrid step, N workgroups spin on the "
                  "GPU so its clocks may stay up (one per SM keeps all busy and draws power "
                  "like it; default 0: the GPU idles)");
  };
  DevicesOptions dev;
  auto* c_dev = app.add_subcommand("devices", "List the compute devices Loom can use");
  ModelsOptions models;
  auto* c_models = app.add_subcommand(
      "models",
      "List the GGUF files and Hugging Face folders already on this machine (the Hugging Face "
      "cache, LM Studio, Ollama, llama.cpp's cache, and --dir folders)");
  c_models->add_option("--dir", models.dirs, "Also look in this folder (3 levels deep)");
  c_models->add_flag("--only-dirs", models.only_dirs, "Look only in the --dir folders");
  c_models->add_flag("--json", models.json, "Print JSON");
  RunOptions run;
  auto* c_run = app.add_subcommand(
      "run", "Generate text from a prompt (streams to stdout, timings to stderr)");
  engine_opts(c_run, run.engine);
  c_run->add_option("-p,--prompt", run.prompt, "Prompt (chat message, or raw text with --raw)");
  c_run->add_option("--system", run.system, "System prompt (chat mode)");
  c_run->add_flag("--raw", run.raw, "Feed the prompt as is, without the chat template");
  c_run->add_option("-n,--n-predict", run.n_predict,
                    "Tokens to generate (-1: until the context is full)");
  c_run->add_option("--temp", run.temp, "Temperature (0: greedy)");
  c_run->add_option("--top-k", run.top_k, "Top-k (0: off)");
  c_run->add_option("--top-p", run.top_p, "Top-p (1: off)");
  c_run->add_option("--min-p", run.min_p, "Min-p (0: off)");
  c_run->add_option("--repeat-penalty", run.repeat_penalty, "Repetition penalty (1: off)");
  c_run->add_option("-s,--seed", run.seed, "Random seed");
  c_run->add_flag("--context-shift", run.context_shift,
                  "When the context is full, drop its older half and go on");
  c_run->add_flag("--ignore-eos", run.ignore_eos, "Do not stop at end-of-generation tokens");

  PlanOptions plan;
  auto* c_plan = app.add_subcommand("plan",
                                    "Show the placement a strategy makes: per layer and op group, "
                                    "bytes per device, predicted step time");
  engine_opts(c_plan, plan.engine);
  c_plan->add_flag("--json", plan.json, "Print the placement as JSON");
  c_plan->add_option("--save", plan.save, "Write the placement JSON to this file");

  BenchOptions bench;
  auto* c_bench = app.add_subcommand("bench", "Measure prefill and decode speed");
  engine_opts(c_bench, bench.engine);
  c_bench->add_option("-p,--n-prompt", bench.n_prompt, "Prompt tokens");
  c_bench->add_option("-n,--n-gen", bench.n_gen, "Generated tokens");
  c_bench->add_option("-r,--reps", bench.reps, "Repetitions");
  c_bench->add_flag("--json", bench.json, "Print one JSON object on stdout");
  c_bench->add_flag("--gpu-profile", bench.engine.gpu_profile,
                    "Time every GPU dispatch (slower) and print the shaders' share");
  c_bench->add_option("--profile-every", bench.profile_every,
                      "Time op groups on one decode step in N (default: every step on the CPU, 1 "
                      "in 8 with the GPU)");
  c_bench->add_flag("--no-profiler", bench.no_profiler,
                    "Run without the per-layer profiler (to measure its overhead)");

  ServeOptions serve;
  auto* c_serve = app.add_subcommand("serve", "Serve the model over an OpenAI-compatible HTTP API");
  engine_opts(c_serve, serve.engine);
  c_serve->add_option("--host", serve.host, "Address to listen on (default: loopback only)");
  c_serve->add_option("--port", serve.port, "TCP port");
  c_serve->add_option("--api-key", serve.api_key,
                      "Require 'Authorization: Bearer KEY' on every route but /health");
  c_serve->add_option("--alias", serve.alias, "Model name in the API (default: the file name)");
  c_serve->add_option("--parallel", serve.parallel,
                      "Sequences generated at once (slots; each has its own KV cache)");
  c_serve->add_option("--queue", serve.queue, "Requests that may wait for a slot (then 429)");
  c_serve->add_option("--max-body", serve.max_body_kib, "Largest request body in KiB (then 413)");
  c_serve->add_option("--itl-factor", serve.itl_factor,
                      "While sequences decode, a step takes only the prompt tokens that keep it "
                      "within this many times a decode-only step (learned from the steps run; "
                      "1: prompts take whole steps)");

  PerplexityOptions ppl;
  auto* c_ppl = app.add_subcommand(
      "perplexity",
      "Perplexity of a text: windows of --ctx tokens, the second half of each scored (as "
      "llama.cpp's perplexity tool)");
  engine_opts(c_ppl, ppl.engine);
  c_ppl->add_option("-f,--file", ppl.file, "Text file")->required();
  c_ppl->add_option(
      "--stride", ppl.stride,
      "Tokens between the starts of consecutive windows (default: --ctx, no overlap)");
  c_ppl->add_option("--chunks", ppl.chunks, "Evaluate at most this many windows");

  KlOptions kl;
  auto* c_kl = app.add_subcommand(
      "kl",
      "KL divergence and top-1 agreement of a second model's token distributions against a base "
      "model's on a text, and the perplexity of each");
  engine_opts(c_kl, kl.engine);
  c_kl->add_option("--m2,--model2", kl.model2,
                   "The other model (default: the base model again, e.g. with --dtype)");
  c_kl->add_option("--dtype", kl.dtype2,
                   "Requantize the other model's weights to this type at load (f16 bf16 q8_0 "
                   "q4_0 q4_k ...)");
  c_kl->add_option("--placement2", kl.placement2,
                   "Placement JSON for the other model (its per-group precisions)");
  c_kl->add_option("-f,--file", kl.file, "Text file")->required();
  c_kl->add_option("--stride", kl.stride, "Tokens between the starts of consecutive windows");
  c_kl->add_option("--chunks", kl.chunks, "Evaluate at most this many windows");

  ConvertCliOptions conv;
  auto* c_conv = app.add_subcommand(
      "convert",
      "Write a GGUF from a GGUF file or Hugging Face folder, each matrix in --dtype or in its op "
      "group's precision from --plan (streaming: memory far below the model's size)");
  c_conv->add_option("input", conv.input, "GGUF file or Hugging Face model folder")->required();
  c_conv->add_option("-o,--out", conv.output, "Output .gguf")->required();
  c_conv->add_option("--dtype", conv.dtype,
                     "Matrices' type: f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k..q6_k, or keep "
                     "(default; vectors are always F32)");
  c_conv->add_option("--plan", conv.plan,
                     "Placement JSON (loom plan --save, or the app): each op group's precision, "
                     "over --dtype");
  c_conv->add_flag("--progress", conv.progress, "Print progress every 10%");

  VerifyOptions ver;
  auto* c_ver = app.add_subcommand(
      "verify",
      "Per layer and op group: the relative error of the layer's output with that group as "
      "placed (unit and precision), against the double-precision reference on the same input");
  engine_opts(c_ver, ver.engine);
  c_ver->add_option("-p,--prompt", ver.prompt, "Text whose tokens are the input");
  c_ver->add_option("-n,--n-tokens", ver.n_tokens, "At most this many tokens (1..256)");
  c_ver->add_flag("--json", ver.json, "Print JSON");
  c_ver->add_flag("--progress", ver.progress, "Say when each layer is done");

  ProbeOptions probe;
  auto* c_probe = app.add_subcommand(
      "probe",
      "Per layer: min, max, mean, std and outlier share (values with |x - mean| > 6 std) of the "
      "residual stream after the layer and of its attention and FFN matmuls' inputs (after the "
      "norms), computed in double on the CPU; also the embeddings and the final norm");
  engine_opts(c_probe, probe.engine);
  c_probe->add_option("-p,--prompt", probe.prompt, "Text whose tokens are the input");
  c_probe->add_option("-n,--n-tokens", probe.n_tokens, "At most this many tokens (1..256)");
  c_probe->add_flag("--json", probe.json, "Print JSON");
  c_probe->add_flag("--progress", probe.progress, "Say when each layer is done");

  LoadtestOptions lt;
  auto* c_lt = app.add_subcommand(
      "loadtest", "Load-test an OpenAI-compatible server: first request, steady, concurrency");
  c_lt->add_option("--url", lt.url, "Server address (http://host:port)");
  c_lt->add_option("--api-key", lt.api_key, "Sent as 'Authorization: Bearer KEY'");
  c_lt->add_option("--model", lt.model, "Model name in the requests (default: none)");
  c_lt->add_option("-p,--prompt", lt.prompt, "User message of every request");
  c_lt->add_option("-n,--max-tokens", lt.max_tokens, "Tokens per answer");
  c_lt->add_flag("!--stop-at-eos", lt.ignore_eos,
                 "Let answers end at an end-of-generation token (default: every answer is "
                 "--max-tokens long, sent as ignore_eos)");
  c_lt->add_option("--requests", lt.requests, "Sequential requests of the steady phase");
  c_lt->add_option("--levels", lt.levels, "Clients of each concurrency level, e.g. 1,8,32,64");
  c_lt->add_option("--seconds", lt.seconds, "Length of each concurrency level");
  c_lt->add_option("--server-cmd", lt.server_cmd,
                   "Shell command that starts the server at --url: the first phase then measures "
                   "from its start to the first token, and the server is stopped at the end");
  c_lt->add_flag("--json", lt.json, "Print JSON instead of a table");

  // `loom kl -m2 OTHER`, as llama.cpp's tools spell it: CLI11 takes only
  // one-letter short options, so -m2 is read as --m2.
  std::vector<std::string> args(argv, argv + argc);
  for (auto& a : args) {
    if (a == "-m2") a = "--m2";
  }
  std::vector<char*> argv2;
  for (auto& a : args) argv2.push_back(a.data());
  argv = argv2.data();
  CLI11_PARSE(app, argc, argv);
  if (c_serve->parsed()) return cmd_serve(serve);
  if (c_lt->parsed()) return cmd_loadtest(lt);
  if (c_run->parsed()) return cmd_run(run);
  if (c_dev->parsed()) return cmd_devices(dev);
  if (c_models->parsed()) return cmd_models(models);
  if (c_bench->parsed()) return cmd_bench(bench);
  if (c_plan->parsed()) return cmd_plan(plan);
  if (c_ppl->parsed()) return cmd_perplexity(ppl);
  if (c_kl->parsed()) return cmd_kl(kl);
  if (c_conv->parsed()) return cmd_convert(conv);
  if (c_ver->parsed()) return cmd_verify(ver);
  if (c_probe->parsed()) return cmd_probe(probe);

  if (c_info->parsed()) return cmd_info(info);
  if (c_tok->parsed()) return cmd_tokenize(tok);
  if (c_syn->parsed()) return cmd_synth(syn);
  return 2;
}
