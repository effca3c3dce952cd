// Subcommands of the `loom` CLI. main.cpp parses arguments (CLI11) into these
// plain structs; each command lives in its own cmd_*.cpp and returns the exit status.
#pragma once

#include <cstdint>
#include <string>

namespace loom::cli {

struct InfoOptions {
  std::string model;  ///< GGUF file
  bool list_tensors = false;
  bool list_metadata = false;
};
int cmd_info(const InfoOptions& o);

struct TokenizeOptions {
  std::string model;  ///< GGUF file with tokenizer metadata
  std::string prompt;
  bool no_bos = false;
  bool parse_special = false;
  bool pieces = false;  ///< print "id 'piece'" pairs instead of ids only
};
int cmd_tokenize(const TokenizeOptions& o);

struct SynthOptions {
  std::string out;
  std::string preset;  ///< stories-like | tinyllama-1.1b | qwen2-0.5b | phi3-mini | llama3-8b
  std::string arch = "llama";
  int64_t layers = 2;
  int64_t dim = 64;
  int64_t ffn = 172;
  int64_t heads = 4;
  int64_t kv_heads = 2;
  int64_t vocab = 0;  ///< 0: size of the tokenizer used
  int64_t ctx = 512;
  std::string dtype = "f32";
  uint64_t seed = 1;
  std::string vocab_from;  ///< GGUF to copy the tokenizer from; empty: built-in byte-level vocab
  std::string format = "gguf";  ///< gguf | safetensors (a Hugging Face folder; f32/f16/bf16)
  uint64_t shard_mib = 0;       ///< safetensors: shards of about this size; 0: one file
  int64_t sliding_window = 0;   ///< gemma2: window of the even layers; 0: the preset's (4096)
  bool tied = false;            ///< no output.weight: the embedding is reused
  // Which of the above were given explicitly (they override a preset).
  bool set_arch = false, set_layers = false, set_dim = false, set_ffn = false, set_heads = false,
       set_kv_heads = false, set_vocab = false, set_ctx = false;
};
int cmd_synth(const SynthOptions& o);

/// Options shared by run and bench.
struct EngineOptions {
  std::string model;
  std::string tokenizer;  ///< another file's tokenizer (GGUF, tokenizer.json or folder)
  int threads = 0;        ///< 0: all cores
  int64_t ctx = 0;        ///< 0: the model's (capped at 4096)
  std::string kv_type = "f16";
  int64_t batch = 0;            ///< prefill chunk; 0: a GPU's default_prefill_chunk, else cpu_batch
  int64_t cpu_batch = 256;      ///< prefill chunk without a GPU, unless batch is set
  std::string backend = "cpu";  ///< cpu | vulkan | cuda
  int device = -1;              ///< GPU device index (loom devices); -1: the best
  std::string strategy;         ///< placement strategy; empty: gpu with a GPU --backend, else cpu
  std::string placement;        ///< placement JSON file (strategy custom)
  std::string vram_budget;      ///< "8G": the GPU behaves as if it had this much memory
  std::string cpu_dtype, gpu_dtype;  ///< requantize weights placed on that unit
  bool gpu_profile = false;      ///< timestamp every GPU dispatch (bench prints the shaders' times)
  uint32_t gpu_keep_groups = 0;  ///< VulkanOptions::keep_busy_groups (experimental; 0: off)
  std::string kv_gpu;            ///< "1G": GPU memory for KV blocks, the rest moves to host RAM
  std::string kv_ram;            ///< "2G": host RAM for KV blocks, the rest spills to the SSD
  std::string kv_dir;            ///< spill folder (default: the user cache folder)
  std::string kv_policy = "importance";  ///< lru | importance
  std::string kv_spill_type;             ///< precision on the SSD: the cache's, or q8_0
  bool no_adapt = false;  ///< strategy auto: keep the planned placement (no AdaptiveController)
  int adapt_window = 8;   ///< AdaptiveOptions::window_tokens
};

struct PlanOptions {
  EngineOptions engine;
  bool json = false;  ///< print the placement as JSON
  std::string save;   ///< write the placement JSON here
};
int cmd_plan(const PlanOptions& o);

struct DevicesOptions {};
int cmd_devices(const DevicesOptions& o);

struct ModelsOptions {
  std::vector<std::string> dirs;  ///< more folders to look in
  bool only_dirs = false;         ///< only those (not the other tools' places)
  bool json = false;
};
int cmd_models(const ModelsOptions& o);

struct RunOptions {
  EngineOptions engine;
  std::string prompt;
  std::string system;
  bool raw = false;  ///< no chat template
  int64_t n_predict = 256;
  float temp = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  uint64_t seed = 0xC0FFEE;
  bool context_shift = false;
  bool ignore_eos = false;
};
int cmd_run(const RunOptions& o);

struct BenchOptions {
  EngineOptions engine;
  int64_t n_prompt = 128;
  int64_t n_gen = 64;
  int reps = 3;
  bool json = false;
  bool no_profiler = false;
  int profile_every = 0;  ///< Profiler::set_sample_every (0: its default)
};
int cmd_bench(const BenchOptions& o);

struct ServeOptions {
  EngineOptions engine;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;  ///< empty: no authentication
  std::string alias;    ///< model name in the API; empty: the file's name
  int parallel = 1;     ///< slots (sequences generated at once)
  int64_t queue = 64;   ///< requests waiting for a slot; more get 429
  int64_t max_body_kib = 4096;
  double itl_factor = 1.5;  ///< SchedulerOptions::itl_factor
};
int cmd_serve(const ServeOptions& o);

struct PerplexityOptions {
  EngineOptions engine;  ///< engine.ctx: the window (default 512)
  std::string file;      ///< the text
  int64_t stride = 0;    ///< between windows' starts; 0: the window (no overlap)
  int64_t chunks = 0;    ///< at most this many windows; 0: all
};
int cmd_perplexity(const PerplexityOptions& o);

struct KlOptions {
  EngineOptions engine;    ///< the base model (-m) and the options both share
  std::string model2;      ///< the other model; empty: the base model again
  std::string dtype2;      ///< requantize the other model's weights to this at load
  std::string placement2;  ///< the other model's placement JSON (per-group precisions)
  std::string file;
  int64_t stride = 0;
  int64_t chunks = 0;
};
int cmd_kl(const KlOptions& o);

struct ConvertCliOptions {
  std::string input;   ///< GGUF file or Hugging Face folder
  std::string output;  ///< .gguf
  std::string dtype;   ///< every matrix; empty or "keep": the source's
  std::string plan;    ///< placement JSON: per-group precisions over --dtype
  bool progress = false;
};
int cmd_convert(const ConvertCliOptions& o);

struct VerifyOptions {
  EngineOptions engine;  ///< engine.placement: the placement to verify
  std::string prompt =
      "Once upon a time, in a small town by the sea, there lived an old clockmaker who";
  int64_t n_tokens = 32;  ///< at most this many tokens of the prompt
  bool json = false;
  bool progress = false;
};
int cmd_verify(const VerifyOptions& o);

struct ProbeOptions {
  EngineOptions engine;
  std::string prompt =
      "Once upon a time, in a small town by the sea, there lived an old clockmaker who";
  int64_t n_tokens = 32;  ///< at most this many tokens of the prompt
  bool json = false;
  bool progress = false;
};
int cmd_probe(const ProbeOptions& o);

struct LoadtestOptions {
  std::string url = "http://127.0.0.1:8080";
  std::string api_key;
  std::string model;   ///< "model" in requests; empty: left out
  std::string prompt;  ///< empty: a built-in one
  int64_t max_tokens = 64;
  int64_t requests = 20;          ///< sequential requests of the steady phase
  std::string levels = "1,8,32";  ///< clients of each concurrency level
  double seconds = 10;            ///< length of each concurrency level
  bool ignore_eos = true;         ///< every answer max_tokens long
  std::string server_cmd;         ///< starts the server (cold start measured); empty: running
  bool json = false;
};
int cmd_loadtest(const LoadtestOptions& o);

}  // namespace loom::cli
