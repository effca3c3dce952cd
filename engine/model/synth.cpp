// Writes synthetic models. Weights are uniform random numbers scaled by
// 1/sqrt(fan_in), generated per row from (seed, tensor, row) so the bytes do
// not depend on the thread count; rows are quantized with the cpu/ref
// quantizers and streamed to the file batch by batch.
#include "engine/model/synth.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <thread>

#include "cpu/ref/quants.h"
#include "engine/model/gguf.h"
#include "engine/model/gguf_writer.h"

namespace loom {
namespace {

uint64_t splitmix64(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// How the values of a tensor are drawn.
enum class Fill { kMatrix, kNorm, kBias, kEmbedding };

struct PlannedTensor {
  std::string name;
  std::vector<int64_t> shape;  // shape[0] contiguous
  DType dtype;
  Fill fill;
};

struct WeightFormat {
  DType base;
  DType more_bits;  // for the _M mixtures; equal to base otherwise
  uint32_t file_type;
};

Result<WeightFormat> parse_weight_type(const std::string& s) {
  // general.file_type values (llama_ftype) of the matching llama.cpp outputs.
  struct Entry {
    const char* name;
    DType base, more;
    uint32_t ftype;
  };
  static const Entry kTypes[] = {
      {"f32", DType::kF32, DType::kF32, 0},       {"f16", DType::kF16, DType::kF16, 1},
      {"q4_0", DType::kQ4_0, DType::kQ4_0, 2},    {"q4_1", DType::kQ4_1, DType::kQ4_1, 3},
      {"q8_0", DType::kQ8_0, DType::kQ8_0, 7},    {"q5_0", DType::kQ5_0, DType::kQ5_0, 8},
      {"q5_1", DType::kQ5_1, DType::kQ5_1, 9},    {"q2_k", DType::kQ2_K, DType::kQ2_K, 10},
      {"q3_k", DType::kQ3_K, DType::kQ3_K, 11},   {"q4_k", DType::kQ4_K, DType::kQ4_K, 14},
      {"q5_k", DType::kQ5_K, DType::kQ5_K, 16},   {"q6_k", DType::kQ6_K, DType::kQ6_K, 18},
      {"bf16", DType::kBF16, DType::kBF16, 32},   {"q4_k_m", DType::kQ4_K, DType::kQ6_K, 15},
      {"q5_k_m", DType::kQ5_K, DType::kQ6_K, 17},
  };
  std::string lower = s;
  for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  for (const Entry& e : kTypes) {
    if (lower == e.name) return WeightFormat{e.base, e.more, e.ftype};
  }
  return make_error(ErrorCode::kInvalidArgument,
                    "unknown weight type '%s' (f32 f16 bf16 q8_0 q4_0 q4_1 q5_0 q5_1 q2_k q3_k "
                    "q4_k q5_k q6_k q4_k_m q5_k_m)",
                    s.c_str());
}

// llama.cpp's _M mixtures give these layers more bits: the first and last
// eighth, and every third layer in between.
bool use_more_bits(int64_t layer, int64_t n_layer) {
  return layer < n_layer / 8 || layer >= 7 * n_layer / 8 || (layer - n_layer / 8) % 3 == 2;
}

// The dtype a matrix with rows of `ne0` elements can be stored in: `want`
// when its block size divides the rows, otherwise the nearest format that fits.
DType fit_dtype(DType want, int64_t ne0) {
  if (ne0 % traits(want).block_size == 0) return want;
  if (want == DType::kF32 || want == DType::kF16 || want == DType::kBF16) return want;
  if (ne0 % 32 == 0) return DType::kQ8_0;
  return DType::kF16;
}

Status validate(const SynthSpec& s) {
  if (s.arch != "llama" && s.arch != "qwen2" && s.arch != "phi3" && s.arch != "qwen3" &&
      s.arch != "gemma2") {
    return make_error(ErrorCode::kUnsupported,
                      "synth: unknown architecture '%s' (llama, qwen2, phi3, qwen3, gemma2)",
                      s.arch.c_str());
  }
  if (s.n_layer < 1 || s.n_embd < 1 || s.n_ff < 1 || s.n_head < 1 || s.n_head_kv < 1 ||
      s.n_ctx < 1) {
    return make_error(ErrorCode::kInvalidArgument,
                      "synth: layers, dim, ffn, heads, kv-heads and ctx must be positive");
  }
  if (s.n_embd % s.n_head != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "synth: dim %lld is not a multiple of heads %lld",
                      static_cast<long long>(s.n_embd), static_cast<long long>(s.n_head));
  }
  if (s.n_head % s.n_head_kv != 0) {
    return make_error(ErrorCode::kInvalidArgument,
                      "synth: heads %lld is not a multiple of kv-heads %lld",
                      static_cast<long long>(s.n_head), static_cast<long long>(s.n_head_kv));
  }
  const int64_t hd = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  if (hd % 2 != 0 || s.head_dim < 0) {
    return make_error(ErrorCode::kInvalidArgument, "synth: head size %lld must be even (RoPE)",
                      static_cast<long long>(hd));
  }
  return {};
}

std::vector<PlannedTensor> plan_tensors(const SynthSpec& s, const WeightFormat& wf, int64_t n_vocab,
                                        std::vector<std::string>* notes) {
  const int64_t head_dim = s.head_dim > 0 ? s.head_dim : s.n_embd / s.n_head;
  const int64_t q_dim = s.n_head * head_dim;
  const int64_t kv_dim = s.n_head_kv * head_dim;
  std::vector<PlannedTensor> out;
  auto matrix = [&](std::string name, int64_t ne0, int64_t ne1, DType want,
                    Fill fill = Fill::kMatrix) {
    DType got = fit_dtype(want, ne0);
    if (got != want) {
      notes->push_back(name + ": rows of " + std::to_string(ne0) + " are not a multiple of " +
                       std::string(dtype_name(want)) + "'s block size; stored as " +
                       std::string(dtype_name(got)));
    }
    out.push_back({std::move(name), {ne0, ne1}, got, fill});
  };
  auto vec = [&](std::string name, int64_t n, Fill fill) {
    out.push_back({std::move(name), {n}, DType::kF32, fill});
  };

  matrix("token_embd.weight", s.n_embd, n_vocab, wf.base, Fill::kEmbedding);
  for (int64_t l = 0; l < s.n_layer; ++l) {
    const std::string p = "blk." + std::to_string(l) + ".";
    const DType more = use_more_bits(l, s.n_layer) ? wf.more_bits : wf.base;
    vec(p + "attn_norm.weight", s.n_embd, Fill::kNorm);
    if (s.arch == "phi3") {
      matrix(p + "attn_qkv.weight", s.n_embd, q_dim + 2 * kv_dim, wf.base);
    } else {
      matrix(p + "attn_q.weight", s.n_embd, q_dim, wf.base);
      matrix(p + "attn_k.weight", s.n_embd, kv_dim, wf.base);
      matrix(p + "attn_v.weight", s.n_embd, kv_dim, more);
      if (s.arch == "qwen2") {
        vec(p + "attn_q.bias", q_dim, Fill::kBias);
        vec(p + "attn_k.bias", kv_dim, Fill::kBias);
        vec(p + "attn_v.bias", kv_dim, Fill::kBias);
      }
      if (s.arch == "qwen3") {
        vec(p + "attn_q_norm.weight", head_dim, Fill::kNorm);
        vec(p + "attn_k_norm.weight", head_dim, Fill::kNorm);
      }
    }
    matrix(p + "attn_output.weight", q_dim, s.n_embd, wf.base);
    if (s.arch == "gemma2") vec(p + "post_attention_norm.weight", s.n_embd, Fill::kNorm);
    vec(p + "ffn_norm.weight", s.n_embd, Fill::kNorm);
    if (s.arch == "phi3") {
      matrix(p + "ffn_up.weight", s.n_embd, 2 * s.n_ff, wf.base);  // gate and up, fused
    } else {
      matrix(p + "ffn_gate.weight", s.n_embd, s.n_ff, wf.base);
      matrix(p + "ffn_up.weight", s.n_embd, s.n_ff, wf.base);
    }
    matrix(p + "ffn_down.weight", s.n_ff, s.n_embd, more);
    if (s.arch == "gemma2") vec(p + "post_ffw_norm.weight", s.n_embd, Fill::kNorm);
  }
  vec("output_norm.weight", s.n_embd, Fill::kNorm);
  if (!s.tied_output) matrix("output.weight", s.n_embd, n_vocab, wf.more_bits);
  return out;
}

// One row of values for tensor `t`, row `r`.
void fill_row(const PlannedTensor& t, uint64_t seed, size_t tensor_index, int64_t row, float* y) {
  uint64_t state = seed * 0x100000001B3ull ^ (static_cast<uint64_t>(tensor_index) << 40) ^
                   static_cast<uint64_t>(row) * 0x9E3779B97F4A7C15ull;
  const int64_t n = t.shape[0];
  float scale = 0.0f, offset = 0.0f;
  switch (t.fill) {
    case Fill::kMatrix:
      scale = std::sqrt(3.0f / static_cast<float>(n));
      break;  // unit-variance outputs
    case Fill::kEmbedding: scale = 1.0f; break;
    case Fill::kNorm:
      scale = 0.1f;
      offset = 1.0f;
      break;
    case Fill::kBias: scale = 0.1f; break;
  }
  for (int64_t i = 0; i < n; ++i) {
    double u = static_cast<double>(splitmix64(state) >> 11) * (1.0 / 9007199254740992.0);  // [0,1)
    y[i] = offset + scale * static_cast<float>(2.0 * u - 1.0);
  }
}

Status copy_tokenizer(const std::string& from, GgufWriter* w, int64_t* n_vocab) {
  auto src = GgufFile::open(from);
  if (!src.ok()) return src.error();
  auto tokens = (*src)->get_string_array("tokenizer.ggml.tokens");
  if (!tokens.ok()) return tokens.error();
  if (!*tokens) {
    return make_error(ErrorCode::kInvalidArgument, "%s: has no tokenizer (tokenizer.ggml.tokens)",
                      from.c_str());
  }
  for (const auto& [key, v] : (*src)->metadata()) {
    if (key.rfind("tokenizer.", 0) != 0) continue;
    if (v.is_array() && v.elem_type == GgufType::kArray) continue;
    w->set_value(key, v);
  }
  *n_vocab = static_cast<int64_t>((*tokens)->size());
  return {};
}

constexpr const char* kChatMLTemplate =
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] "
    "+ "
    "'<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' "
    "}}"
    "{% endif %}";

}  // namespace

Status apply_synth_preset(const std::string& preset, SynthSpec* s) {
  struct P {
    const char* name;
    const char* arch;
    int64_t layers, dim, ffn, heads, kv, vocab, ctx;
    float rope;
    bool tied;
    int64_t head_dim = 0;
  };
  static const P kPresets[] = {
      {"stories-like", "llama", 5, 64, 172, 8, 4, 0, 2048, 10000.0f, false},
      {"tinyllama-1.1b", "llama", 22, 2048, 5632, 32, 4, 32000, 2048, 10000.0f, false},
      {"qwen2-0.5b", "qwen2", 24, 896, 4864, 14, 2, 151936, 32768, 1000000.0f, true},
      {"phi3-mini", "phi3", 32, 3072, 8192, 32, 32, 32064, 4096, 10000.0f, false},
      {"llama3-8b", "llama", 32, 4096, 14336, 32, 8, 128256, 8192, 500000.0f, false},
      {"qwen3-0.6b", "qwen3", 28, 1024, 3072, 16, 8, 151936, 40960, 1000000.0f, true, 128},
      {"gemma2-2b", "gemma2", 26, 2304, 9216, 8, 4, 256000, 8192, 10000.0f, true, 256},
  };
  for (const P& p : kPresets) {
    if (preset != p.name) continue;
    s->arch = p.arch;
    s->name = std::string("synthetic ") + p.name;
    s->n_layer = p.layers;
    s->n_embd = p.dim;
    s->n_ff = p.ffn;
    s->n_head = p.heads;
    s->n_head_kv = p.kv;
    s->n_vocab = p.vocab;
    s->n_ctx = p.ctx;
    s->rope_freq_base = p.rope;
    s->tied_output = p.tied;
    s->head_dim = p.head_dim;
    s->rms_eps = p.arch == std::string("llama") ? 1e-5f : 1e-6f;
    return {};
  }
  return make_error(
      ErrorCode::kInvalidArgument,
      "unknown preset '%s' (stories-like, tinyllama-1.1b, qwen2-0.5b, phi3-mini, llama3-8b, "
      "qwen3-0.6b, gemma2-2b)",
      preset.c_str());
}

Result<SynthReport> write_synthetic_model(const SynthSpec& spec, const std::string& path,
                                          const std::function<void(uint64_t, uint64_t)>& progress) {
  LOOM_TRY(validate(spec));
  LOOM_ASSIGN_OR_RETURN(WeightFormat wf, parse_weight_type(spec.weight_type));
  SynthReport report;
  GgufWriter w;
  const std::string& a = spec.arch;
  w.set_string("general.architecture", a);
  w.set_string("general.name", spec.name);
  w.set_u32("general.file_type", wf.file_type);
  w.set_string("general.description", "Loom synthetic model: random weights, not a trained model");
  w.set_u32(a + ".context_length", static_cast<uint32_t>(spec.n_ctx));
  w.set_u32(a + ".embedding_length", static_cast<uint32_t>(spec.n_embd));
  w.set_u32(a + ".block_count", static_cast<uint32_t>(spec.n_layer));
  w.set_u32(a + ".feed_forward_length", static_cast<uint32_t>(spec.n_ff));
  w.set_u32(a + ".attention.head_count", static_cast<uint32_t>(spec.n_head));
  w.set_u32(a + ".attention.head_count_kv", static_cast<uint32_t>(spec.n_head_kv));
  w.set_f32(a + ".attention.layer_norm_rms_epsilon", spec.rms_eps);
  const int64_t head_dim = spec.head_dim > 0 ? spec.head_dim : spec.n_embd / spec.n_head;
  w.set_u32(a + ".rope.dimension_count", static_cast<uint32_t>(head_dim));
  if (spec.head_dim > 0) {
    w.set_u32(a + ".attention.key_length", static_cast<uint32_t>(head_dim));
    w.set_u32(a + ".attention.value_length", static_cast<uint32_t>(head_dim));
  }
  if (a == "gemma2") {  // as llama.cpp's converter writes them (query_pre_attn_scalar: Loom's)
    w.set_f32(a + ".attn_logit_softcapping", 50.0f);
    w.set_f32(a + ".final_logit_softcapping", 30.0f);
    w.set_u32(a + ".attention.sliding_window",
              static_cast<uint32_t>(spec.sliding_window > 0 ? spec.sliding_window : 4096));
    w.set_f32(a + ".attention.query_pre_attn_scalar", static_cast<float>(head_dim));
  }
  w.set_f32(a + ".rope.freq_base", spec.rope_freq_base);

  int64_t n_vocab = spec.n_vocab;
  if (!spec.vocab_from.empty()) {
    int64_t from_n = 0;
    LOOM_TRY(copy_tokenizer(spec.vocab_from, &w, &from_n));
    if (n_vocab != 0 && n_vocab != from_n) {
      return make_error(
          ErrorCode::kInvalidArgument, "synth: --vocab %lld differs from the %lld tokens of %s",
          static_cast<long long>(n_vocab), static_cast<long long>(from_n), spec.vocab_from.c_str());
    }
    n_vocab = from_n;
  } else {
    SynthVocab v = builtin_synth_vocab(n_vocab);
    if (n_vocab != 0 && static_cast<int64_t>(v.tokens.size()) != n_vocab) {
      return make_error(
          ErrorCode::kInvalidArgument,
          "synth: --vocab %lld is smaller than the %zu tokens the built-in vocabulary needs",
          static_cast<long long>(n_vocab), v.tokens.size());
    }
    n_vocab = static_cast<int64_t>(v.tokens.size());
    w.set_string("tokenizer.ggml.model", "gpt2");
    w.set_string("tokenizer.ggml.pre", "gpt-2");
    w.set_string_array("tokenizer.ggml.tokens", v.tokens);
    w.set_i32_array("tokenizer.ggml.token_type", v.token_types);
    w.set_string_array("tokenizer.ggml.merges", v.merges);
    w.set_u32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(v.bos));
    w.set_u32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(v.eos));
    w.set_u32("tokenizer.ggml.eot_token_id", static_cast<uint32_t>(v.eot));
    w.set_u32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(v.eos));
    w.set_bool("tokenizer.ggml.add_bos_token", true);
    w.set_bool("tokenizer.ggml.add_eos_token", false);
    w.set_string("tokenizer.chat_template", kChatMLTemplate);
  }
  w.set_u32(a + ".vocab_size", static_cast<uint32_t>(n_vocab));
  report.n_vocab = n_vocab;

  std::vector<PlannedTensor> tensors = plan_tensors(spec, wf, n_vocab, &report.notes);
  for (const PlannedTensor& t : tensors) {
    LOOM_TRY(w.add_tensor(t.name, t.shape, t.dtype));
  }
  for (size_t i = 0; i < tensors.size(); ++i) report.n_bytes += w.tensor_bytes(i);
  LOOM_TRY(w.open(path));

  // Rows are made and quantized in batches of about 8 MiB of output, each batch
  // split across the hardware threads.
  const unsigned n_threads = std::max(1u, std::min(16u, std::thread::hardware_concurrency()));
  std::vector<uint8_t> out;
  uint64_t done = 0;
  for (size_t ti = 0; ti < tensors.size(); ++ti) {
    const PlannedTensor& t = tensors[ti];
    const int64_t ne0 = t.shape[0];
    const int64_t rows = t.shape.size() > 1 ? t.shape[1] : 1;
    const uint64_t row_bytes = *dtype_row_bytes(t.dtype, static_cast<uint64_t>(ne0));
    const int64_t batch_rows = std::max<int64_t>(1, static_cast<int64_t>((8u << 20) / row_bytes));
    report.n_params += static_cast<uint64_t>(ne0 * rows);
    for (int64_t r0 = 0; r0 < rows; r0 += batch_rows) {
      const int64_t nr = std::min(batch_rows, rows - r0);
      out.resize(static_cast<size_t>(nr) * row_bytes);
      std::vector<Status> status(n_threads);
      auto work = [&](unsigned k) {
        std::vector<float> row(static_cast<size_t>(ne0));
        for (int64_t r = k; r < nr; r += n_threads) {
          fill_row(t, spec.seed, ti, r0 + r, row.data());
          Status s = ref::quantize_row(t.dtype, row.data(),
                                       out.data() + static_cast<size_t>(r) * row_bytes, ne0);
          if (!s.ok()) {
            status[k] = s;
            return;
          }
        }
      };
      if (nr * ne0 < 65536 || n_threads == 1) {
        for (unsigned k = 0; k < n_threads; ++k) work(k);
      } else {
        std::vector<std::thread> pool;
        for (unsigned k = 0; k < n_threads; ++k) pool.emplace_back(work, k);
        for (auto& th : pool) th.join();
      }
      for (const Status& s : status) LOOM_TRY(s);
      LOOM_TRY(w.write_data(out.data(), out.size()));
      done += out.size();
      if (progress) progress(done, report.n_bytes);
    }
  }
  LOOM_TRY(w.close());
  auto check = GgufFile::open(path);  // what we wrote must read back
  if (!check.ok()) return check.error();
  report.file_bytes = (*check)->file_size();
  return report;
}

}  // namespace loom
