#include "engine/tokenizer/vocab_writer.h"

#include <cstdint>
#include <string_view>

#include "engine/model/gguf_writer.h"
#include "engine/tokenizer/pretokenize.h"

namespace loom {

namespace {

// Loom's pre-tokenizer names, in the order a match is looked for (the first
// with the same expressions and ignore_merges wins: "llama3" before
// "chatglm-bpe", which shares its expression).
constexpr const char* kPreNames[] = {
    "llama3",      "qwen2",  "gpt-2",     "tekken", "deepseek-llm", "deepseek-coder",
    "deepseek-v3", "falcon", "starcoder", "bloom",  "viking",       "chatglm-bpe",
};

// Hugging Face files spell the contractions case-insensitively, where Loom's
// table spells the cases out (so that Unicode case folding cannot widen them):
// the same expression for naming purposes.
std::string canonical_expression(std::string re) {
  static constexpr std::string_view kHf = "(?i:'s|'t|'re|'ve|'m|'ll|'d)";
  static constexpr std::string_view kLoom =
      "(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])";
  for (size_t at = re.find(kHf); at != std::string::npos; at = re.find(kHf, at + kLoom.size())) {
    re.replace(at, kHf.size(), kLoom);
  }
  return re;
}

// llama.cpp's name for a Loom pre-tokenizer name (the same but for Llama 3's).
std::string llama_cpp_pre_name(const std::string& name) {
  return name == "llama3" ? "llama-bpe" : name;
}

}  // namespace

std::string gguf_pre_tokenizer_name(const Vocab& vocab) {
  if (!vocab.has_pre_regexes()) {
    const PreTokenizerSpec* spec = find_pre_tokenizer_spec(vocab.pre());
    return spec ? llama_cpp_pre_name(spec->name) : vocab.pre();
  }
  for (const char* name : kPreNames) {
    const PreTokenizerSpec* spec = find_pre_tokenizer_spec(name);
    if (!spec || spec->ignore_merges != vocab.pre_ignore_merges() ||
        spec->regexes.size() != vocab.pre_regexes().size()) {
      continue;
    }
    bool same = true;
    for (size_t i = 0; i < spec->regexes.size() && same; ++i) {
      same = canonical_expression(vocab.pre_regexes()[i]) == spec->regexes[i];
    }
    if (same) return llama_cpp_pre_name(spec->name);
  }
  return "default";
}

std::vector<float> spm_scores(const Vocab& vocab) {
  const auto n = static_cast<size_t>(vocab.n_tokens());
  std::vector<float> scores(n);
  if (vocab.n_merges() == 0) {
    for (size_t i = 0; i < n; ++i) scores[i] = vocab.score(static_cast<int32_t>(i));
    return scores;
  }
  // Ranks below 2^24 are exact in a float.
  constexpr float kNoMerge = -1e9f;
  scores.assign(n, kNoMerge);
  for (int32_t r = vocab.n_merges() - 1; r >= 0; --r) {  // the lowest rank writes last
    scores[static_cast<size_t>(vocab.merge(r).result)] = -static_cast<float>(r);
  }
  return scores;
}

void write_vocab_metadata(const Vocab& vocab, GgufWriter* w) {
  const bool spm = vocab.model() == TokenizerModel::kSpm;
  w->set_string("tokenizer.ggml.model", tokenizer_model_name(vocab.model()));
  if (!spm) w->set_string("tokenizer.ggml.pre", gguf_pre_tokenizer_name(vocab));

  const auto n = static_cast<size_t>(vocab.n_tokens());
  std::vector<std::string> tokens(n);
  std::vector<int32_t> types(n);
  for (size_t i = 0; i < n; ++i) {
    tokens[i] = vocab.text(static_cast<int32_t>(i));
    types[i] = static_cast<int32_t>(vocab.type(static_cast<int32_t>(i)));
  }
  w->set_string_array("tokenizer.ggml.tokens", std::move(tokens));
  if (spm) w->set_f32_array("tokenizer.ggml.scores", spm_scores(vocab));
  w->set_i32_array("tokenizer.ggml.token_type", types);
  if (!spm) {
    std::vector<std::string> merges(static_cast<size_t>(vocab.n_merges()));
    for (int32_t r = 0; r < vocab.n_merges(); ++r) {
      const BpeMerge& m = vocab.merge(r);
      merges[static_cast<size_t>(r)] = vocab.text(m.left) + " " + vocab.text(m.right);
    }
    w->set_string_array("tokenizer.ggml.merges", std::move(merges));
  }

  // Ids as u32, as llama.cpp reads them; only those the vocabulary has.
  const SpecialTokens& sp = vocab.special();
  const std::pair<const char*, int32_t> ids[] = {
      {"tokenizer.ggml.bos_token_id", sp.bos},       {"tokenizer.ggml.eos_token_id", sp.eos},
      {"tokenizer.ggml.eot_token_id", sp.eot},       {"tokenizer.ggml.eom_token_id", sp.eom},
      {"tokenizer.ggml.unknown_token_id", sp.unk},   {"tokenizer.ggml.padding_token_id", sp.pad},
      {"tokenizer.ggml.seperator_token_id", sp.sep},
  };
  for (const auto& [key, id] : ids) {
    if (vocab.is_valid_id(id)) w->set_u32(key, static_cast<uint32_t>(id));
  }
  w->set_bool("tokenizer.ggml.add_bos_token", vocab.add_bos());
  w->set_bool("tokenizer.ggml.add_eos_token", vocab.add_eos());
  if (spm) w->set_bool("tokenizer.ggml.add_space_prefix", vocab.add_space_prefix());
  // Added tokens' lstrip / rstrip: no GGUF key has them; Loom's two arrays
  // (vocab.cpp reads them back).
  const auto strips = vocab.strips();
  if (!strips.empty()) {
    std::vector<int32_t> strip_ids, flags;
    for (const auto& [id, f] : strips) {
      strip_ids.push_back(id);
      flags.push_back(f);
    }
    w->set_i32_array(Vocab::kStripIdsKey, strip_ids);
    w->set_i32_array(Vocab::kStripFlagsKey, flags);
  }
}

}  // namespace loom
