#include "engine/model/model.h"

#include <cinttypes>
#include <cstdio>
#include <filesystem>
#include <optional>

#include "engine/model/arch/arch.h"
#include "engine/model/convert.h"
#include "engine/model/hf_model.h"
#include "engine/tokenizer/spm_model.h"
#include "engine/tokenizer/tokenizer_json.h"

namespace loom {

namespace {
const std::string kEmptyName;

// " (from model.safetensors: model.norm.weight)" for tensors of an assembled source.
std::string origin_note(const GgufTensor& t) {
  return t.origin.empty() ? "" : " (from " + t.origin + ")";
}
}  // namespace

const std::string& Weight::name() const {
  return tensor ? tensor->name : kEmptyName;
}

Weight Weight::rows(int64_t r0, int64_t n) const {
  Weight w = *this;
  w.data = static_cast<const uint8_t*>(data) + static_cast<size_t>(r0) * row_bytes;
  w.n_out = n;
  return w;
}

uint64_t Model::weight_bytes() const {
  uint64_t b = 0;
  for (const auto& t : file->tensors()) b += t.n_bytes;
  return b;
}

std::string Model::describe() const {
  char buf[256];
  std::snprintf(
      buf, sizeof buf,
      "%s, %" PRId64 " layers, dim %" PRId64 ", %" PRId64 "/%" PRId64 " heads, ffn %" PRId64
      ", vocab %" PRId64 ", weights %s",
      hp.arch.c_str(), hp.n_layer, hp.n_embd, hp.n_head, hp.n_head_kv, hp.n_ff, hp.n_vocab,
      std::string(dtype_name(layers.empty() ? tok_embd.dtype : layers[0].w_down.dtype)).c_str());
  return buf;
}

namespace detail {

Result<Weight> bind_weight(const GgufFile& f, const std::string& name, std::vector<int64_t> shape,
                           bool required) {
  const GgufTensor* t = f.find_tensor(name);
  if (!t) {
    if (!required) return Weight{};
    return make_error(ErrorCode::kFormat, "%s: missing tensor '%s'", f.path().c_str(),
                      name.c_str());
  }
  // Expected shape, innermost first; trailing 1s may be omitted in the file.
  bool match = t->n_dims <= 4 && shape.size() <= 4;
  for (size_t d = 0; d < 4 && match; ++d) {
    int64_t want = d < shape.size() ? shape[d] : 1;
    if (t->ne[d] != want) match = false;
  }
  if (!match) {
    std::string want = "[";
    for (size_t d = 0; d < shape.size(); ++d) want += (d ? ", " : "") + std::to_string(shape[d]);
    want += "]";
    return make_error(ErrorCode::kFormat, "%s: tensor '%s'%s has shape %s, expected %s",
                      f.path().c_str(), name.c_str(), origin_note(*t).c_str(),
                      t->shape_string().c_str(), want.c_str());
  }
  if (!traits(t->dtype).has_reference) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: tensor '%s'%s has dtype %s, which Loom cannot compute with yet",
                      f.path().c_str(), name.c_str(), origin_note(*t).c_str(),
                      std::string(dtype_name(t->dtype)).c_str());
  }
  Weight w;
  w.data = t->data;
  w.dtype = t->dtype;
  w.n_in = t->ne[0];
  w.n_out = t->ne[1] * t->ne[2] * t->ne[3];
  w.row_bytes = *dtype_row_bytes(t->dtype, static_cast<uint64_t>(t->ne[0]));
  w.tensor = t;
  return w;
}

Status read_common_hparams(const GgufFile& f, HParams* hp) {
  const std::string a = hp->arch + ".";
  auto need_int = [&](const std::string& key, int64_t* out) -> Status {
    auto v = f.get_int(a + key);
    if (!v.ok()) return v.error();
    if (!*v)
      return make_error(ErrorCode::kFormat, "%s: missing metadata key '%s%s'", f.path().c_str(),
                        a.c_str(), key.c_str());
    if (**v <= 0 || **v > (int64_t{1} << 40)) {
      return make_error(ErrorCode::kFormat, "%s: '%s%s' = %" PRId64 " is out of range",
                        f.path().c_str(), a.c_str(), key.c_str(), **v);
    }
    *out = **v;
    return {};
  };
  auto opt_int = [&](const std::string& key, int64_t* out) -> Status {
    auto v = f.get_int(a + key);
    if (!v.ok()) return v.error();
    if (*v) *out = **v;
    return {};
  };
  auto opt_float = [&](const std::string& key, float* out) -> Status {
    auto v = f.get_float(a + key);
    if (!v.ok()) return v.error();
    if (*v) *out = static_cast<float>(**v);
    return {};
  };
  LOOM_TRY(need_int("block_count", &hp->n_layer));
  LOOM_TRY(need_int("embedding_length", &hp->n_embd));
  LOOM_TRY(need_int("feed_forward_length", &hp->n_ff));
  LOOM_TRY(need_int("attention.head_count", &hp->n_head));
  hp->n_head_kv = hp->n_head;
  LOOM_TRY(opt_int("attention.head_count_kv", &hp->n_head_kv));
  hp->n_ctx_train = 2048;
  LOOM_TRY(opt_int("context_length", &hp->n_ctx_train));
  LOOM_TRY(opt_float("attention.layer_norm_rms_epsilon", &hp->rms_eps));
  if (hp->n_head_kv <= 0 || hp->n_head % hp->n_head_kv != 0) {
    return make_error(ErrorCode::kFormat,
                      "%s: head_count %" PRId64 " is not a multiple of head_count_kv %" PRId64,
                      f.path().c_str(), hp->n_head, hp->n_head_kv);
  }
  hp->head_dim = hp->n_embd / hp->n_head;
  LOOM_TRY(opt_int("attention.key_length", &hp->head_dim));
  hp->n_rot = hp->head_dim;
  LOOM_TRY(opt_int("rope.dimension_count", &hp->n_rot));
  if (hp->n_rot > hp->head_dim || hp->n_rot % 2 != 0) {
    return make_error(ErrorCode::kFormat,
                      "%s: rope.dimension_count %" PRId64 " must be even and <= head size %" PRId64,
                      f.path().c_str(), hp->n_rot, hp->head_dim);
  }
  LOOM_TRY(opt_float("rope.freq_base", &hp->rope_freq_base));

  // Context extension: rope.scaling.type (linear | yarn | none), or the older rope.scale_linear.
  auto type = f.get_string(a + "rope.scaling.type");
  if (!type.ok()) return type.error();
  float factor = 0.0f;
  LOOM_TRY(opt_float("rope.scaling.factor", &factor));
  float linear = 0.0f;
  LOOM_TRY(opt_float("rope.scale_linear", &linear));
  if (*type) {
    const std::string& s = **type;
    if (s == "linear")
      hp->rope_scaling = RopeScaling::kLinear;
    else if (s == "yarn")
      hp->rope_scaling = RopeScaling::kYarn;
    else if (s == "llama3")
      hp->rope_scaling = RopeScaling::kLlama3;
    else if (s != "none") {
      return make_error(ErrorCode::kUnsupported,
                        "%s: rope scaling type '%s' is not supported (none, linear, yarn, llama3)",
                        f.path().c_str(), s.c_str());
    }
  } else if (linear > 0.0f && linear != 1.0f) {
    hp->rope_scaling = RopeScaling::kLinear;
    factor = linear;
  }
  if (hp->rope_scaling == RopeScaling::kLinear || hp->rope_scaling == RopeScaling::kYarn) {
    hp->rope_scale_factor = factor > 0.0f ? factor : 1.0f;
  }
  hp->rope_n_ctx_orig = hp->n_ctx_train;
  LOOM_TRY(opt_int("rope.scaling.original_context_length", &hp->rope_n_ctx_orig));
  LOOM_TRY(opt_float("rope.scaling.attn_factor", &hp->yarn_attn_factor));
  LOOM_TRY(opt_float("rope.scaling.yarn_beta_fast", &hp->yarn_beta_fast));
  LOOM_TRY(opt_float("rope.scaling.yarn_beta_slow", &hp->yarn_beta_slow));
  return {};
}

}  // namespace detail

namespace {
// A GGUF written by `loom convert` from a Hugging Face folder carries the
// folder's tokenizer.json (and tokenizer_config.json) verbatim.
Result<std::optional<TokenizerSource>> embedded_hf_tokenizer(const GgufFile& f) {
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> json, f.get_string(kHfTokenizerJsonKey));
  if (!json) return std::optional<TokenizerSource>();
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> cfg_text, f.get_string(kHfTokenizerConfigKey));
  HfTokenizerConfig config;
  if (cfg_text) {
    LOOM_ASSIGN_OR_RETURN(
        config, parse_hf_tokenizer_config(*cfg_text, f.path() + ": " + kHfTokenizerConfigKey));
  }
  LOOM_ASSIGN_OR_RETURN(
      HfVocab hv, parse_tokenizer_json(*json, f.path() + ": " + kHfTokenizerJsonKey, &config));
  TokenizerSource out;
  out.vocab = std::move(hv.vocab);
  out.notes = std::move(hv.notes);
  out.chat_template = config.chat_template;
  return std::optional<TokenizerSource>(std::move(out));
}
}  // namespace

Result<TokenizerSource> load_tokenizer_source(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code ec;
  TokenizerSource out;
  // A folder's tokenizer.json, else its tokenizer.model; or such a file.
  fs::path json_path, spm_path;
  if (fs::is_directory(path, ec)) {
    json_path = fs::path(path) / "tokenizer.json";
    if (!fs::is_regular_file(json_path, ec) &&
        fs::is_regular_file(fs::path(path) / "tokenizer.model", ec)) {
      spm_path = fs::path(path) / "tokenizer.model";
      json_path.clear();
    }
  } else if (fs::path(path).extension() == ".json") {
    json_path = path;
  } else if (fs::path(path).extension() == ".model") {
    spm_path = path;
  }
  if (!json_path.empty() || !spm_path.empty()) {
    HfTokenizerConfig config;
    const fs::path config_path =
        (json_path.empty() ? spm_path : json_path).parent_path() / "tokenizer_config.json";
    if (fs::is_regular_file(config_path, ec)) {
      LOOM_ASSIGN_OR_RETURN(config, load_hf_tokenizer_config(config_path.string()));
    }
    if (!spm_path.empty()) {
      LOOM_ASSIGN_OR_RETURN(out.vocab, load_spm_model(spm_path.string(), &config));
    } else {
      LOOM_ASSIGN_OR_RETURN(HfVocab hv, load_tokenizer_json(json_path.string(), &config));
      out.vocab = std::move(hv.vocab);
      out.notes = std::move(hv.notes);
    }
    out.chat_template = config.chat_template;
    return out;
  }
  LOOM_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> f, GgufFile::open(path));
  LOOM_ASSIGN_OR_RETURN(std::optional<TokenizerSource> hf, embedded_hf_tokenizer(*f));
  if (hf) return std::move(*hf);
  LOOM_ASSIGN_OR_RETURN(out.vocab, load_vocab(*f));
  LOOM_ASSIGN_OR_RETURN(std::optional<std::string> t, f->get_string("tokenizer.chat_template"));
  out.chat_template = t.value_or("");
  return out;
}

std::string Model::host_attention_reason() const {
  if (hp.attn_softcap > 0 || hp.sliding_window > 0) {
    return hp.arch + ": soft-capped and sliding-window attention is not on the GPU backends yet";
  }
  return "";
}

Result<std::unique_ptr<Model>> load_model(const std::string& path) {
  return load_model(path, LoadOptions{});
}

Result<std::unique_ptr<Model>> load_model(const std::string& path, const LoadOptions& options) {
  // Two sources, one path: a GGUF file, or a Hugging Face folder presented as
  // GGUF metadata and tensor names (engine/model/hf_model.h).
  auto m = std::make_unique<Model>();
  std::optional<Vocab> vocab;
  std::optional<std::string> tmpl;
  bool rope_neox_layout = false;
  if (!options.tokenizer.empty()) {
    auto src = load_tokenizer_source(options.tokenizer);
    if (!src.ok()) {
      return make_error(src.error().code(), "tokenizer %s: %s", options.tokenizer.c_str(),
                        src.message().c_str());
    }
    vocab = std::move(src->vocab);
    tmpl = std::move(src->chat_template);
    for (std::string& n : src->notes) m->warnings.push_back("tokenizer.json: " + n);
  }
  if (is_hf_folder(path)) {
    LOOM_ASSIGN_OR_RETURN(HfFolder hf, open_hf_folder(path, /*need_tokenizer=*/!vocab));
    m->file = std::move(hf.file);
    rope_neox_layout = hf.rope_neox_layout;
    if (!vocab) {
      vocab = std::move(hf.vocab);
      tmpl = std::move(hf.chat_template);
      for (std::string& n : hf.notes) m->warnings.push_back("tokenizer.json: " + n);
    }
  } else {
    auto file = GgufFile::open(path);
    if (!file.ok()) {
      std::error_code ec;
      if (std::filesystem::is_directory(path, ec)) {
        return make_error(ErrorCode::kFormat,
                          "%s: a folder without config.json: neither a GGUF file nor a Hugging "
                          "Face model folder",
                          path.c_str());
      }
      return file.error();
    }
    m->file = std::move(file).value();
  }
  const GgufFile& f = *m->file;
  m->hp.arch = f.architecture();
  if (m->hp.arch.empty()) {
    return make_error(ErrorCode::kFormat, "%s: no general.architecture key: not a model file?",
                      path.c_str());
  }
  const Architecture* arch = find_architecture(m->hp.arch);
  if (!arch) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: architecture '%s' is not supported (supported: %s)", path.c_str(),
                      m->hp.arch.c_str(), supported_architectures().c_str());
  }
  LOOM_TRY(detail::read_common_hparams(f, &m->hp));

  // Tokenizer first: the vocabulary size shapes the embedding.
  if (!vocab) {
    LOOM_ASSIGN_OR_RETURN(std::optional<TokenizerSource> hf, embedded_hf_tokenizer(f));
    if (hf) {
      vocab = std::move(hf->vocab);
      if (!hf->chat_template.empty()) tmpl = std::move(hf->chat_template);
      for (std::string& n : hf->notes) m->warnings.push_back("tokenizer.json: " + n);
    }
  }
  if (!vocab) {
    auto v = load_vocab(f);
    if (!v.ok()) return v.error();
    vocab = std::move(v).value();
  }
  auto tok = Tokenizer::create(std::move(*vocab));
  if (!tok.ok()) return tok.error();
  m->tokenizer = std::make_unique<Tokenizer>(std::move(tok).value());
  const GgufTensor* emb = f.find_tensor("token_embd.weight");
  if (!emb)
    return make_error(ErrorCode::kFormat, "%s: missing tensor 'token_embd.weight'", path.c_str());
  m->hp.n_vocab = emb->ne[1];
  if (m->hp.n_vocab < m->tokenizer->vocab().n_tokens()) {
    return make_error(ErrorCode::kFormat,
                      "%s: token_embd.weight has %" PRId64 " rows but the tokenizer has %d tokens",
                      path.c_str(), m->hp.n_vocab, m->tokenizer->vocab().n_tokens());
  }

  LOOM_TRY(arch->bind(f, m.get()));
  // HF's llama-family q/k rows pair dims (i, i + d/2) (rotate_half), where a
  // GGUF conversion pairs (2i, 2i + 1): the NeoX order rotates the HF pairs.
  if (rope_neox_layout) m->hp.rope_neox = true;

  // Chat template (absent: the ChatML-like fallback, with its warning).
  if (!tmpl) {
    auto t = f.get_string("tokenizer.chat_template");
    if (!t.ok()) return t.error();
    tmpl = t->value_or("");
  }
  const Vocab& v = m->tokenizer->vocab();
  std::string bos = v.is_valid_id(v.special().bos) ? v.text(v.special().bos) : "";
  std::string eos = v.is_valid_id(v.special().eos) ? v.text(v.special().eos) : "";
  m->chat_template = make_chat_template(*tmpl, bos, eos);
  if (!m->chat_template.warning().empty()) m->warnings.push_back(m->chat_template.warning());
  return m;
}

}  // namespace loom
