#include "engine/model/hf_model.h"

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "cpu/ref/fp16.h"
#include "engine/model/safetensors.h"
#include "engine/tokenizer/spm_model.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace loom {

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// config.json's model_type / architectures[0] -> the engine's architecture,
// and whether its q/k rows are in HF's rotate_half order.
struct HfArch {
  const char* model_type;
  const char* class_name;
  const char* arch;
  bool rotate_half_qk;
};
const HfArch kHfArchs[] = {
    {"llama", "LlamaForCausalLM", "llama", true},
    {"mistral", "MistralForCausalLM", "llama", true},
    {"qwen2", "Qwen2ForCausalLM", "qwen2", false},  // NeoX RoPE in both formats
    {"phi3", "Phi3ForCausalLM", "phi3", false},
    {"qwen3", "Qwen3ForCausalLM", "qwen3", false},     // NeoX RoPE in both formats
    {"gemma2", "Gemma2ForCausalLM", "gemma2", false},  // likewise
};

// What the folder's weights are kept in: the shards' maps, plus the few small
// tensors converted to F32 (norms, biases, RoPE factors).
struct HfStorage {
  SafetensorsSet set;
  std::vector<std::vector<float>> owned;
};

Result<json> read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  try {
    return json::parse(ss.str());
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kFormat, "%s: does not parse as JSON: %s", path.c_str(), e.what());
  }
}

GgufValue int_value(int64_t v) {
  GgufValue g;
  g.type = GgufType::kI64;
  g.i = v;
  return g;
}
GgufValue float_value(double v) {
  GgufValue g;
  g.type = GgufType::kF64;
  g.f = v;
  return g;
}
GgufValue string_value(std::string v) {
  GgufValue g;
  g.type = GgufType::kString;
  g.s = std::move(v);
  return g;
}

// HF tensor name -> GGUF name; "" for tensors the engine does not use.
std::string gguf_name(const std::string& hf, const std::string& arch) {
  if (hf == "model.embed_tokens.weight") return "token_embd.weight";
  if (hf == "model.norm.weight") return "output_norm.weight";
  if (hf == "lm_head.weight") return "output.weight";
  const std::string prefix = "model.layers.";
  if (hf.compare(0, prefix.size(), prefix) != 0) return "";
  const size_t dot = hf.find('.', prefix.size());
  if (dot == std::string::npos || dot == prefix.size()) return "";
  const std::string layer = hf.substr(prefix.size(), dot - prefix.size());
  for (char c : layer) {
    if (c < '0' || c > '9') return "";
  }
  const std::string rest = hf.substr(dot + 1);
  // gemma2 norms around attention and the FFN (its post_attention_layernorm is
  // the attention output's norm, not the FFN's input norm as in llama).
  static const std::pair<const char*, const char*> kGemma2[] = {
      {"post_attention_layernorm.weight", "post_attention_norm.weight"},
      {"pre_feedforward_layernorm.weight", "ffn_norm.weight"},
      {"post_feedforward_layernorm.weight", "post_ffw_norm.weight"},
  };
  if (arch == "gemma2") {
    for (const auto& [from, to] : kGemma2) {
      if (rest == from) return "blk." + layer + "." + to;
    }
  }
  static const std::pair<const char*, const char*> kParts[] = {
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},  // qwen3
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},  // phi3: q, k, v rows
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},  // phi3: gate rows, then up rows
  };
  for (const auto& [from, to] : kParts) {
    if (rest == from) return "blk." + layer + "." + to;
  }
  return "";
}

// The number at `key`, or an error naming config.json and the key.
Result<std::optional<double>> config_number(const json& c, const std::string& path, const char* key,
                                            bool integer) {
  auto it = c.find(key);
  if (it == c.end() || it->is_null()) return std::optional<double>();
  if (!it->is_number() || (integer && !it->is_number_integer())) {
    return make_error(ErrorCode::kFormat, "%s: \"%s\" is %s, expected %s", path.c_str(), key,
                      it->dump().c_str(), integer ? "an integer" : "a number");
  }
  return std::optional<double>(it->get<double>());
}

// Llama 3's RoPE frequency divisors (rope_scaling type llama3), as GGUF
// converters store them in rope_freqs.weight: wavelengths shorter than
// original_ctx / high_freq_factor keep their frequency, longer than
// original_ctx / low_freq_factor are divided by `factor`, and those between
// are blended smoothly.
std::vector<float> llama3_rope_factors(int64_t n_rot, double base, double factor, double low,
                                       double high, double n_ctx_orig) {
  std::vector<float> f(static_cast<size_t>(n_rot / 2));
  const double low_wavelen = n_ctx_orig / low, high_wavelen = n_ctx_orig / high;
  for (int64_t i = 0; i < n_rot / 2; ++i) {
    const double freq = std::pow(base, -2.0 * static_cast<double>(i) / static_cast<double>(n_rot));
    const double wavelen = 2.0 * M_PI / freq;
    double d = 1.0;
    if (wavelen > low_wavelen) {
      d = factor;
    } else if (wavelen >= high_wavelen && high != low) {
      const double smooth = (n_ctx_orig / wavelen - low) / (high - low);
      d = 1.0 / ((1.0 - smooth) / factor + smooth);
    }
    f[static_cast<size_t>(i)] = static_cast<float>(d);
  }
  return f;
}

}  // namespace

bool is_hf_folder(const std::string& path) {
  std::error_code ec;
  return fs::is_directory(path, ec) && fs::is_regular_file(fs::path(path) / "config.json", ec);
}

std::string hf_supported_architectures() {
  std::string s;
  for (const HfArch& a : kHfArchs) s += (s.empty() ? "" : ", ") + std::string(a.model_type);
  return s;
}

namespace {

Result<HfFolder> open_folder(const std::string& dir, bool need_tokenizer) {
  const fs::path root(dir);
  const std::string config_path = (root / "config.json").string();
  LOOM_ASSIGN_OR_RETURN(json config, read_json(config_path));
  if (!config.is_object()) {
    return make_error(ErrorCode::kFormat, "%s: not a JSON object", config_path.c_str());
  }

  // Architecture: model_type, else the first of "architectures".
  const std::string model_type = config.value("model_type", "");
  std::string class_name;
  auto archs = config.find("architectures");
  if (archs != config.end() && archs->is_array() && !archs->empty() && (*archs)[0].is_string()) {
    class_name = (*archs)[0].get<std::string>();
  }
  const HfArch* arch = nullptr;
  for (const HfArch& a : kHfArchs) {
    if ((!model_type.empty() && model_type == a.model_type) ||
        (model_type.empty() && class_name == a.class_name)) {
      arch = &a;
    }
  }
  if (!arch) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: unknown architecture '%s' (model_type '%s'): supported are %s",
                      config_path.c_str(), class_name.c_str(), model_type.c_str(),
                      hf_supported_architectures().c_str());
  }

  // transformers 5 writes the RoPE settings as "rope_parameters" (rope_theta and the
  // scaling's fields in one object; per layer type for some models), older versions as
  // "rope_theta" and "rope_scaling": read the new form as the old.
  if (auto rp = config.find("rope_parameters"); rp != config.end() && !rp->is_null()) {
    const json* p = &*rp;
    if (p->is_object() && !p->contains("rope_theta") && !p->contains("rope_type") &&
        p->contains("full_attention")) {
      p = &(*p)["full_attention"];
    }
    if (!p->is_object()) {
      return make_error(ErrorCode::kFormat, "%s: \"rope_parameters\" is not an object",
                        config_path.c_str());
    }
    const json params = *p;
    if (!config.contains("rope_theta") && params.contains("rope_theta")) {
      config["rope_theta"] = params["rope_theta"];
    }
    if (!config.contains("rope_scaling") || config["rope_scaling"].is_null()) {
      config["rope_scaling"] = params;  // type "default": no scaling
    }
  }

  HfFolder out;
  out.rope_neox_layout = arch->rotate_half_qk;
  std::vector<std::pair<std::string, GgufValue>> kv;
  const std::string a = std::string(arch->arch) + ".";
  kv.emplace_back("general.architecture", string_value(arch->arch));
  kv.emplace_back("general.name",
                  string_value(root.filename().empty() ? root.parent_path().filename().string()
                                                       : root.filename().string()));
  kv.emplace_back("general.source", string_value("huggingface"));

  struct Field {
    const char* hf;
    const char* gguf;
    bool integer;
    bool required;
  };
  const Field fields[] = {
      {"num_hidden_layers", "block_count", true, true},
      {"hidden_size", "embedding_length", true, true},
      {"intermediate_size", "feed_forward_length", true, true},
      {"num_attention_heads", "attention.head_count", true, true},
      {"num_key_value_heads", "attention.head_count_kv", true, false},
      {"max_position_embeddings", "context_length", true, false},
      {"rms_norm_eps", "attention.layer_norm_rms_epsilon", false, false},
      {"rope_theta", "rope.freq_base", false, false},
      {"head_dim", "attention.key_length", true, false},
      {"head_dim", "attention.value_length", true, false},
      // gemma2
      {"sliding_window", "attention.sliding_window", true, false},
      {"attn_logit_softcapping", "attn_logit_softcapping", false, false},
      {"final_logit_softcapping", "final_logit_softcapping", false, false},
      {"query_pre_attn_scalar", "attention.query_pre_attn_scalar", false, false},
  };
  for (const Field& f : fields) {
    LOOM_ASSIGN_OR_RETURN(std::optional<double> v,
                          config_number(config, config_path, f.hf, f.integer));
    if (!v) {
      if (f.required) {
        return make_error(ErrorCode::kFormat, "%s: no \"%s\"", config_path.c_str(), f.hf);
      }
      continue;
    }
    kv.emplace_back(a + f.gguf, f.integer ? int_value(static_cast<int64_t>(*v)) : float_value(*v));
  }
  const bool gemma = std::string(arch->arch) == "gemma2";
  if (gemma) {
    const std::string act = config.value("hidden_activation", config.value("hidden_act", ""));
    if (!act.empty() && act != "gelu_pytorch_tanh" && act != "gelu") {
      return make_error(ErrorCode::kUnsupported,
                        "%s: hidden_activation '%s' (gemma2 uses gelu_pytorch_tanh)",
                        config_path.c_str(), act.c_str());
    }
  }

  // RoPE scaling.
  std::vector<float> rope_factors;
  auto rs = config.find("rope_scaling");
  if (rs != config.end() && !rs->is_null()) {
    if (!rs->is_object()) {
      return make_error(ErrorCode::kFormat, "%s: \"rope_scaling\" is not an object",
                        config_path.c_str());
    }
    std::string type = rs->value("rope_type", rs->value("type", std::string()));
    const double factor = rs->value("factor", 1.0);
    const double n_ctx_orig =
        rs->value("original_max_position_embeddings",
                  static_cast<double>(config.value("max_position_embeddings", 8192)));
    if (type == "linear" || type == "yarn") {
      kv.emplace_back(a + "rope.scaling.type", string_value(type));
      kv.emplace_back(a + "rope.scaling.factor", float_value(factor));
      kv.emplace_back(a + "rope.scaling.original_context_length",
                      int_value(static_cast<int64_t>(n_ctx_orig)));
      if (type == "yarn") {
        if (rs->contains("beta_fast"))
          kv.emplace_back(a + "rope.scaling.yarn_beta_fast",
                          float_value(rs->value("beta_fast", 32.0)));
        if (rs->contains("beta_slow"))
          kv.emplace_back(a + "rope.scaling.yarn_beta_slow",
                          float_value(rs->value("beta_slow", 1.0)));
      }
    } else if (type == "llama3") {
      const int64_t n_embd = config.value("hidden_size", int64_t{0});
      const int64_t n_head = std::max<int64_t>(1, config.value("num_attention_heads", int64_t{1}));
      const int64_t head_dim = config.value("head_dim", n_embd / n_head);
      if (head_dim <= 0 || head_dim > 65536 || head_dim % 2 != 0) {
        return make_error(ErrorCode::kFormat, "%s: head size %lld does not allow llama3 RoPE",
                          config_path.c_str(), static_cast<long long>(head_dim));
      }
      rope_factors = llama3_rope_factors(head_dim, config.value("rope_theta", 10000.0), factor,
                                         rs->value("low_freq_factor", 1.0),
                                         rs->value("high_freq_factor", 4.0), n_ctx_orig);
    } else if (type != "default" && !type.empty()) {
      return make_error(ErrorCode::kUnsupported,
                        "%s: rope_scaling type '%s' is not supported yet (linear, yarn, llama3)",
                        config_path.c_str(), type.c_str());
    }
  }

  // Weights.
  auto storage = std::make_shared<HfStorage>();
  LOOM_ASSIGN_OR_RETURN(storage->set, SafetensorsSet::open_folder(dir));
  std::vector<GgufTensor> tensors;
  for (const std::string& hf_name : storage->set.tensor_names()) {
    const std::string name = gguf_name(hf_name, arch->arch);
    if (name.empty()) continue;  // not used by the engine (rotary inv_freq buffers, ...)
    const SafetensorsTensor& st = *storage->set.find_tensor(hf_name);
    const std::string file = fs::path(storage->set.file_of(hf_name)->path()).filename().string();
    if (!st.dtype) {
      return make_error(ErrorCode::kUnsupported,
                        "%s: tensor '%s' at byte %llu is %s; Loom computes in F32, F16 and BF16",
                        storage->set.file_of(hf_name)->path().c_str(), hf_name.c_str(),
                        static_cast<unsigned long long>(st.offset), st.dtype_name.c_str());
    }
    if (st.shape.empty() || st.shape.size() > 4) {
      return make_error(ErrorCode::kFormat, "%s: tensor '%s' has %zu dimensions (1 to 4 expected)",
                        storage->set.file_of(hf_name)->path().c_str(), hf_name.c_str(),
                        st.shape.size());
    }
    GgufTensor t;
    t.name = name;
    t.origin = file + ": " + hf_name;
    t.n_dims = static_cast<uint32_t>(st.shape.size());
    for (size_t d = 0; d < st.shape.size(); ++d) t.ne[d] = st.shape[st.shape.size() - 1 - d];
    t.dtype = *st.dtype;
    t.offset = st.offset;
    t.n_bytes = st.n_bytes;
    t.data = st.data;
    // Vectors (norms, biases) in F32, as GGUF files keep them: small, and what
    // every backend's norm and bias ops take.
    // gemma's RMS norms scale by (1 + w): GGUF stores 1 + w, so do we.
    const bool plus_one = gemma && t.n_dims == 1 && name.ends_with("norm.weight");
    if (t.n_dims == 1 && (t.dtype != DType::kF32 || plus_one)) {
      std::vector<float> f(static_cast<size_t>(t.ne[0]));
      const auto* h = reinterpret_cast<const uint8_t*>(st.data);
      for (size_t i = 0; i < f.size(); ++i) {
        if (t.dtype == DType::kF32) {
          std::memcpy(&f[i], h + 4 * i, 4);
        } else {
          uint16_t bits;
          std::memcpy(&bits, h + 2 * i, 2);
          f[i] = t.dtype == DType::kF16 ? ref::fp16_to_fp32(bits) : ref::bf16_to_fp32(bits);
        }
        if (plus_one) f[i] += 1.0f;
      }
      t.dtype = DType::kF32;
      t.n_bytes = f.size() * sizeof(float);
      t.data = reinterpret_cast<const uint8_t*>(f.data());
      storage->owned.push_back(std::move(f));
    }
    tensors.push_back(std::move(t));
  }
  if (!rope_factors.empty()) {
    GgufTensor t;
    t.name = "rope_freqs.weight";
    t.origin = "config.json: rope_scaling (llama3)";
    t.n_dims = 1;
    t.ne[0] = static_cast<int64_t>(rope_factors.size());
    t.dtype = DType::kF32;
    t.n_bytes = rope_factors.size() * sizeof(float);
    t.data = reinterpret_cast<const uint8_t*>(rope_factors.data());
    storage->owned.push_back(std::move(rope_factors));
    tensors.push_back(std::move(t));
  }

  // Tokenizer.
  HfTokenizerConfig tok_config;
  const fs::path tok_config_path = root / "tokenizer_config.json";
  std::error_code ec;
  if (fs::is_regular_file(tok_config_path, ec)) {
    LOOM_ASSIGN_OR_RETURN(tok_config, load_hf_tokenizer_config(tok_config_path.string()));
  }
  // tokenizer.json, else SentencePiece's tokenizer.model (Llama 2, Mistral).
  const fs::path tok_path = root / "tokenizer.json";
  const fs::path spm_path = root / "tokenizer.model";
  const bool has_json = fs::is_regular_file(tok_path, ec);
  const bool has_spm = !has_json && fs::is_regular_file(spm_path, ec);
  if (!has_json && !has_spm && !need_tokenizer) {
    const uint64_t n = storage->set.total_bytes();
    out.file = GgufFile::from_parts(dir, std::move(kv), std::move(tensors), std::move(storage), n);
    return out;
  }
  if (!has_json && !has_spm) {
    return make_error(ErrorCode::kFormat,
                      "%s: no tokenizer.json or tokenizer.model (give one with --tokenizer)",
                      dir.c_str());
  }
  if (has_json) {
    LOOM_ASSIGN_OR_RETURN(HfVocab hv, load_tokenizer_json(tok_path.string(), &tok_config));
    out.vocab = std::move(hv.vocab);
    out.notes = std::move(hv.notes);
  } else {
    LOOM_ASSIGN_OR_RETURN(out.vocab, load_spm_model(spm_path.string(), &tok_config));
  }
  out.chat_template = tok_config.chat_template;

  const uint64_t size = storage->set.total_bytes();
  out.file = GgufFile::from_parts(dir, std::move(kv), std::move(tensors), std::move(storage), size);
  return out;
}

}  // namespace

Result<HfFolder> open_hf_folder(const std::string& dir, bool need_tokenizer) {
  try {
    return open_folder(dir, need_tokenizer);
  } catch (const nlohmann::json::exception& e) {
    // A config value of the wrong type (json::value() throws on those).
    return make_error(ErrorCode::kFormat, "%s/config.json: %s", dir.c_str(), e.what());
  }
}

}  // namespace loom
