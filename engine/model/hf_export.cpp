#include "engine/model/hf_export.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/model/model.h"
#include "engine/model/safetensors_writer.h"
#include "engine/tokenizer/pretokenize.h"

namespace loom {

namespace {

namespace fs = std::filesystem;
using nlohmann::ordered_json;

// GGUF tensor name -> HF name for `arch`; "" when it has none.
std::string hf_name(const std::string& name, const std::string& arch) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.compare(0, 4, "blk.") != 0) return "";
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos) return "";
  const std::string layer = name.substr(4, dot - 4), rest = name.substr(dot + 1);
  const bool phi3 = arch == "phi3";
  if (arch == "gemma2") {
    if (rest == "post_attention_norm.weight")
      return "model.layers." + layer + ".post_attention_layernorm.weight";
    if (rest == "ffn_norm.weight")
      return "model.layers." + layer + ".pre_feedforward_layernorm.weight";
    if (rest == "post_ffw_norm.weight")
      return "model.layers." + layer + ".post_feedforward_layernorm.weight";
  }
  static const std::pair<const char*, const char*> kParts[] = {
      {"attn_q_norm.weight", "self_attn.q_norm.weight"},
      {"attn_k_norm.weight", "self_attn.k_norm.weight"},
      {"attn_norm.weight", "input_layernorm.weight"},
      {"ffn_norm.weight", "post_attention_layernorm.weight"},
      {"attn_q.weight", "self_attn.q_proj.weight"},
      {"attn_k.weight", "self_attn.k_proj.weight"},
      {"attn_v.weight", "self_attn.v_proj.weight"},
      {"attn_q.bias", "self_attn.q_proj.bias"},
      {"attn_k.bias", "self_attn.k_proj.bias"},
      {"attn_v.bias", "self_attn.v_proj.bias"},
      {"attn_output.weight", "self_attn.o_proj.weight"},
      {"attn_qkv.weight", "self_attn.qkv_proj.weight"},
      {"ffn_gate.weight", "mlp.gate_proj.weight"},
      {"ffn_down.weight", "mlp.down_proj.weight"},
  };
  if (rest == "ffn_up.weight") {
    return "model.layers." + layer + (phi3 ? ".mlp.gate_up_proj.weight" : ".mlp.up_proj.weight");
  }
  for (const auto& [from, to] : kParts) {
    if (rest == from) return "model.layers." + layer + "." + to;
  }
  return "";
}

Status write_text(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary);
  out << text;
  if (!out) return make_error(ErrorCode::kIo, "%s: write failed", path.string().c_str());
  return {};
}

Result<std::string> tokenizer_json(const Vocab& v) {
  if (v.model() != TokenizerModel::kBpe) {
    return make_error(ErrorCode::kUnsupported,
                      "writing tokenizer.json for a SentencePiece vocabulary (scores, no "
                      "merges) is not supported");
  }
  std::vector<std::string> regexes;
  bool ignore_merges = false;
  if (v.has_pre_regexes()) {
    regexes = v.pre_regexes();
    ignore_merges = v.pre_ignore_merges();
  } else {
    const PreTokenizerSpec* spec = find_pre_tokenizer_spec(v.pre());
    if (!spec) spec = find_pre_tokenizer_spec("gpt-2");
    for (const char* r : spec->regexes) regexes.push_back(r);
    ignore_merges = spec->ignore_merges;
  }
  ordered_json pre = {{"type", "Sequence"}, {"pretokenizers", ordered_json::array()}};
  for (const std::string& r : regexes) {
    pre["pretokenizers"].push_back({{"type", "Split"},
                                    {"pattern", {{"Regex", r}}},
                                    {"behavior", "Isolated"},
                                    {"invert", false}});
  }
  pre["pretokenizers"].push_back({{"type", "ByteLevel"},
                                  {"add_prefix_space", false},
                                  {"trim_offsets", true},
                                  {"use_regex", false}});
  ordered_json vocab = ordered_json::object(), added = ordered_json::array();
  for (int32_t id = 0; id < v.n_tokens(); ++id) {
    const TokenType t = v.type(id);
    if (t == TokenType::kControl || t == TokenType::kUserDefined || t == TokenType::kUnknown) {
      added.push_back({{"id", id},
                       {"content", v.text(id)},
                       {"single_word", false},
                       {"lstrip", false},
                       {"rstrip", false},
                       {"normalized", false},
                       {"special", t != TokenType::kUserDefined}});
    } else {
      vocab[v.text(id)] = id;
    }
  }
  ordered_json merges = ordered_json::array();
  for (int32_t r = 0; r < v.n_merges(); ++r) {
    merges.push_back(ordered_json::array({v.text(v.merge(r).left), v.text(v.merge(r).right)}));
  }
  ordered_json post = nullptr;
  if (v.add_bos() && v.is_valid_id(v.special().bos)) {
    post = {{"type", "TemplateProcessing"},
            {"single",
             {{{"SpecialToken", {{"id", v.text(v.special().bos)}, {"type_id", 0}}}},
              {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}}},
            {"pair", ordered_json::array()},
            {"special_tokens", ordered_json::object()}};
  }
  ordered_json root = {{"version", "1.0"},
                       {"truncation", nullptr},
                       {"padding", nullptr},
                       {"added_tokens", added},
                       {"normalizer", nullptr},
                       {"pre_tokenizer", pre},
                       {"post_processor", post},
                       {"decoder", {{"type", "ByteLevel"}}},
                       {"model",
                        {{"type", "BPE"},
                         {"dropout", nullptr},
                         {"unk_token", nullptr},
                         {"byte_fallback", false},
                         {"ignore_merges", ignore_merges},
                         {"vocab", vocab},
                         {"merges", merges}}}};
  return root.dump(1);
}

}  // namespace

Status write_hf_folder(const std::string& gguf_path, const std::string& dir,
                       const HfExportOptions& options) {
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<Model> m, load_model(gguf_path));
  const GgufFile& f = *m->file;
  const HParams& hp = m->hp;
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) {
    return make_error(ErrorCode::kIo, "%s: cannot create the folder: %s", dir.c_str(),
                      ec.message().c_str());
  }

  // Tensors, in file order; llama's q/k rows back in HF's rotate_half order:
  // within each head, GGUF row 2j + s is HF row s * d/2 + j.
  std::vector<SafetensorsEntry> entries;
  for (const GgufTensor& t : f.tensors()) {
    const std::string name = hf_name(t.name, hp.arch);
    if (name.empty()) continue;
    const char* dt = t.dtype == DType::kF32    ? "F32"
                     : t.dtype == DType::kF16  ? "F16"
                     : t.dtype == DType::kBF16 ? "BF16"
                                               : nullptr;
    if (!dt) {
      return make_error(ErrorCode::kUnsupported,
                        "%s: tensor '%s' is %s; a Hugging Face folder holds F32, F16 or BF16",
                        gguf_path.c_str(), t.name.c_str(),
                        std::string(dtype_name(t.dtype)).c_str());
    }
    SafetensorsEntry e;
    e.name = name;
    e.dtype = dt;
    for (uint32_t d = t.n_dims; d-- > 0;) e.shape.push_back(t.ne[d]);
    const bool permute = hp.arch == "llama" &&
                         (t.name.ends_with(".attn_q.weight") || t.name.ends_with(".attn_k.weight"));
    if (hp.arch == "gemma2" && t.n_dims == 1 && t.name.ends_with("norm.weight") &&
        t.dtype == DType::kF32) {
      // GGUF keeps gemma's 1 + w; HF keeps w.
      e.owned.resize(t.n_bytes);
      for (int64_t i = 0; i < t.ne[0]; ++i) {
        float x;
        std::memcpy(&x, t.data + 4 * i, 4);
        x -= 1.0f;
        std::memcpy(e.owned.data() + 4 * i, &x, 4);
      }
    } else if (permute) {
      const size_t row = t.n_bytes / static_cast<size_t>(t.ne[1]);
      const int64_t d = hp.head_dim, n_heads = t.ne[1] / d;
      e.owned.resize(t.n_bytes);
      for (int64_t h = 0; h < n_heads; ++h) {
        for (int64_t j = 0; j < d / 2; ++j) {
          for (int64_t s = 0; s < 2; ++s) {
            const int64_t src = h * d + 2 * j + s, dst = h * d + s * (d / 2) + j;
            std::memcpy(e.owned.data() + dst * row, t.data + src * row, row);
          }
        }
      }
    } else {
      e.data = t.data;
      e.n_bytes = t.n_bytes;
    }
    entries.push_back(std::move(e));
  }

  // Shards.
  std::vector<std::vector<SafetensorsEntry>> shards(1);
  uint64_t in_shard = 0;
  for (SafetensorsEntry& e : entries) {
    const uint64_t n = e.data ? e.n_bytes : e.owned.size();
    if (options.shard_bytes > 0 && in_shard > 0 && in_shard + n > options.shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(std::move(e));
    in_shard += n;
  }
  const std::map<std::string, std::string> meta = {{"format", "pt"}};
  if (shards.size() == 1) {
    LOOM_TRY(write_safetensors((fs::path(dir) / "model.safetensors").string(), shards[0], meta));
  } else {
    ordered_json map = ordered_json::object();
    uint64_t total = 0;
    for (size_t i = 0; i < shards.size(); ++i) {
      char name[64];
      std::snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", i + 1, shards.size());
      LOOM_TRY(write_safetensors((fs::path(dir) / name).string(), shards[i], meta));
      for (const SafetensorsEntry& e : shards[i]) {
        map[e.name] = name;
        total += e.data ? e.n_bytes : e.owned.size();
      }
    }
    ordered_json index = {{"metadata", {{"total_size", total}}}, {"weight_map", map}};
    LOOM_TRY(write_text(fs::path(dir) / "model.safetensors.index.json", index.dump(2)));
  }

  // config.json.
  static const std::map<std::string, std::pair<const char*, const char*>> kClass = {
      {"llama", {"LlamaForCausalLM", "llama"}},
      {"qwen2", {"Qwen2ForCausalLM", "qwen2"}},
      {"phi3", {"Phi3ForCausalLM", "phi3"}},
      {"qwen3", {"Qwen3ForCausalLM", "qwen3"}},
      {"gemma2", {"Gemma2ForCausalLM", "gemma2"}}};
  auto cls = kClass.find(hp.arch);
  if (cls == kClass.end()) {
    return make_error(ErrorCode::kUnsupported, "%s: no Hugging Face class for architecture '%s'",
                      gguf_path.c_str(), hp.arch.c_str());
  }
  const Vocab& v = m->tokenizer->vocab();
  ordered_json config = {
      {"architectures", {cls->second.first}},
      {"model_type", cls->second.second},
      {"hidden_size", hp.n_embd},
      {"intermediate_size", hp.n_ff},
      {"num_hidden_layers", hp.n_layer},
      {"num_attention_heads", hp.n_head},
      {"num_key_value_heads", hp.n_head_kv},
      {"head_dim", hp.head_dim},
      {"max_position_embeddings", hp.n_ctx_train},
      {"rms_norm_eps", hp.rms_eps},
      {"rope_theta", hp.rope_freq_base},
      {"vocab_size", hp.n_vocab},
      {"tie_word_embeddings", f.find_tensor("output.weight") == nullptr},
      {"torch_dtype", m->tok_embd.dtype == DType::kBF16  ? "bfloat16"
                      : m->tok_embd.dtype == DType::kF16 ? "float16"
                                                         : "float32"},
      {"bos_token_id", v.special().bos >= 0 ? ordered_json(v.special().bos) : ordered_json()},
      {"eos_token_id", v.special().eos >= 0 ? ordered_json(v.special().eos) : ordered_json()},
      // Written even when absent (null): transformers' phi3 defaults it to 32000, past
      // a small vocabulary's end, and then refuses the folder.
      {"pad_token_id", v.special().pad >= 0 ? ordered_json(v.special().pad) : ordered_json()}};
  if (hp.arch == "gemma2") {
    config["hidden_activation"] = "gelu_pytorch_tanh";
    config["sliding_window"] = hp.sliding_window;
    config["attn_logit_softcapping"] = hp.attn_softcap;
    config["final_logit_softcapping"] = hp.final_softcap;
    // An integer where it is one (transformers 5 checks the type: gemma2's is an int).
    const double qpas = 1.0 / (static_cast<double>(hp.attn_scale) * hp.attn_scale);
    const double rounded = std::round(qpas);
    config["query_pre_attn_scalar"] = std::abs(qpas - rounded) < 1e-3 * rounded
                                          ? ordered_json(static_cast<int64_t>(rounded))
                                          : ordered_json(qpas);
  }
  LOOM_TRY(write_text(fs::path(dir) / "config.json", config.dump(2)));

  LOOM_ASSIGN_OR_RETURN(std::string tok, tokenizer_json(v));
  LOOM_TRY(write_text(fs::path(dir) / "tokenizer.json", tok));
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> tmpl, f.get_string("tokenizer.chat_template"));
  ordered_json tc = {
      {"add_bos_token", v.add_bos()},
      {"add_eos_token", v.add_eos()},
      {"bos_token",
       v.is_valid_id(v.special().bos) ? ordered_json(v.text(v.special().bos)) : ordered_json()},
      {"eos_token",
       v.is_valid_id(v.special().eos) ? ordered_json(v.text(v.special().eos)) : ordered_json()}};
  if (tmpl) tc["chat_template"] = *tmpl;
  return write_text(fs::path(dir) / "tokenizer_config.json", tc.dump(2));
}

}  // namespace loom
