#include "engine/tokenizer/tokenizer_json.h"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/tokenizer/pretokenize.h"

namespace loom {

namespace {

using nlohmann::json;

constexpr const char* kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space
constexpr int64_t kMaxTokens = 16 << 20;

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return make_error(ErrorCode::kIo, "%s: cannot open: %s", path.c_str(), std::strerror(errno));
  }
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

Result<json> parse_json(std::string_view text, const std::string& name) {
  try {
    return json::parse(text.begin(), text.end());
  } catch (const json::exception& e) {
    return make_error(ErrorCode::kFormat, "%s: does not parse as JSON: %s", name.c_str(), e.what());
  }
}

// A special-token field: a string, or an AddedToken object {"content": ...}; "" when absent/null.
std::string token_field(const json& j, const char* key) {
  auto it = j.find(key);
  if (it == j.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object()) {
    auto c = it->find("content");
    if (c != it->end() && c->is_string()) return c->get<std::string>();
  }
  return "";
}

std::string type_of(const json& j) {
  auto t = j.is_object() ? j.find("type") : j.end();
  return t != j.end() && t->is_string() ? t->get<std::string>() : "";
}

// Every "type" of a component tree (Sequence nests others).
void collect_types(const json& j, std::vector<std::string>* out) {
  if (j.is_object()) {
    const std::string t = type_of(j);
    if (!t.empty()) out->push_back(t);
    for (const char* key : {"normalizers", "pretokenizers", "decoders", "processors"}) {
      auto it = j.find(key);
      if (it != j.end() && it->is_array()) {
        for (const json& c : *it) collect_types(c, out);
      }
    }
  }
}

bool contains(const std::vector<std::string>& v, const char* s) {
  for (const std::string& x : v) {
    if (x == s) return true;
  }
  return false;
}

// PCRE2 for a literal string: every character escaped as \x{...} where not alphanumeric.
std::string regex_literal(const std::string& s) {
  std::string out;
  for (unsigned char c : s) {
    if (std::isalnum(c) || c >= 0x80) {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x{%02X}", c);
      out += buf;
    }
  }
  return out;
}

struct Ctx {
  const std::string& name;
  std::vector<std::string>* notes;
};

// Byte-level pre-tokenizers -> PCRE2 expressions applied in order.
Status collect_regexes(const Ctx& ctx, const json& pt, std::vector<std::string>* regexes) {
  if (pt.is_null()) return {};
  const std::string type = type_of(pt);
  if (type == "Sequence") {
    auto it = pt.find("pretokenizers");
    if (it == pt.end() || !it->is_array()) {
      return make_error(ErrorCode::kFormat, "%s: pre_tokenizer Sequence without a list",
                        ctx.name.c_str());
    }
    for (const json& c : *it) LOOM_TRY(collect_regexes(ctx, c, regexes));
    return {};
  }
  if (type == "ByteLevel") {
    // use_regex (default true) is GPT-2's expression; the byte mapping itself
    // is what every byte-level vocabulary does anyway.
    if (pt.value("use_regex", true)) {
      for (const char* r : find_pre_tokenizer_spec("gpt-2")->regexes) regexes->push_back(r);
    }
    if (pt.value("add_prefix_space", false)) {
      ctx.notes->push_back("ByteLevel add_prefix_space is not applied");
    }
    return {};
  }
  if (type == "Split") {
    const std::string behavior = pt.value("behavior", "Isolated");
    if (behavior != "Isolated" || pt.value("invert", false)) {
      return make_error(ErrorCode::kUnsupported,
                        "%s: pre_tokenizer Split with behavior '%s'%s is not supported (only "
                        "Isolated)",
                        ctx.name.c_str(), behavior.c_str(),
                        pt.value("invert", false) ? " and invert" : "");
    }
    auto pat = pt.find("pattern");
    if (pat != pt.end() && pat->is_object()) {
      auto re = pat->find("Regex");
      if (re != pat->end() && re->is_string()) {
        regexes->push_back(re->get<std::string>());
        return {};
      }
      auto lit = pat->find("String");
      if (lit != pat->end() && lit->is_string()) {
        regexes->push_back(regex_literal(lit->get<std::string>()));
        return {};
      }
    }
    return make_error(ErrorCode::kFormat, "%s: pre_tokenizer Split without a pattern",
                      ctx.name.c_str());
  }
  if (type == "Digits") {
    regexes->push_back(pt.value("individual_digits", false) ? "\\p{N}" : "\\p{N}+");
    return {};
  }
  return make_error(ErrorCode::kUnsupported,
                    "%s: pre_tokenizer '%s' is not supported with a byte-level BPE (Split, "
                    "ByteLevel, Digits, Sequence)",
                    ctx.name.c_str(), type.c_str());
}

// SentencePiece-style: the space prefix comes from Prepend("▁") or Metaspace.
Status read_spm_flags(const Ctx& ctx, const json& root, bool* add_space_prefix, bool* split_words) {
  *add_space_prefix = false;
  *split_words = false;
  std::vector<const json*> parts;
  std::vector<const json*> stack;
  for (const char* key : {"normalizer", "pre_tokenizer"}) {
    auto it = root.find(key);
    if (it != root.end() && !it->is_null()) stack.push_back(&*it);
  }
  while (!stack.empty()) {
    const json* j = stack.back();
    stack.pop_back();
    const std::string type = type_of(*j);
    if (type == "Sequence") {
      for (const char* key : {"normalizers", "pretokenizers"}) {
        auto it = j->find(key);
        if (it != j->end() && it->is_array()) {
          for (const json& c : *it) stack.push_back(&c);
        }
      }
    } else if (type == "Prepend") {
      if (j->value("prepend", "") != kSpmSpace) {
        return make_error(ErrorCode::kUnsupported, "%s: normalizer Prepend of '%s' (only \"▁\")",
                          ctx.name.c_str(), j->value("prepend", "").c_str());
      }
      *add_space_prefix = true;
    } else if (type == "Replace") {
      auto pat = j->find("pattern");
      const bool space = pat != j->end() && pat->is_object() && pat->value("String", "") == " " &&
                         j->value("content", "") == kSpmSpace;
      if (!space) {
        return make_error(ErrorCode::kUnsupported,
                          "%s: normalizer Replace other than \" \" -> \"▁\" is not supported",
                          ctx.name.c_str());
      }
    } else if (type == "Metaspace") {
      // prepend_scheme "always" / "first" (newer files) or add_prefix_space (older).
      const std::string scheme = j->value("prepend_scheme", "");
      *add_space_prefix = scheme.empty() ? j->value("add_prefix_space", true) : scheme != "never";
      // Hugging Face splits at each "▁" (the word keeps it) unless split is false.
      *split_words = j->value("split", true);
      if (scheme == "first") {
        ctx.notes->push_back(
            "Metaspace prepend_scheme 'first': the space prefix is also added after special "
            "tokens");
      }
    } else if (type == "NFC" || type == "NFKC") {
      ctx.notes->push_back(type + " normalization is not applied (text is used as given)");
    } else {
      return make_error(ErrorCode::kUnsupported,
                        "%s: '%s' is not supported in a SentencePiece-style tokenizer "
                        "(Prepend, Replace, Metaspace, Sequence)",
                        ctx.name.c_str(), type.c_str());
    }
  }
  return {};
}

bool is_byte_token(const std::string& s) {
  return s.size() == 6 && s.compare(0, 3, "<0x") == 0 && s[5] == '>' &&
         std::isxdigit(static_cast<unsigned char>(s[3])) &&
         std::isxdigit(static_cast<unsigned char>(s[4]));
}

}  // namespace

Result<HfTokenizerConfig> parse_hf_tokenizer_config(std::string_view text,
                                                    const std::string& name) {
  LOOM_ASSIGN_OR_RETURN(json j, parse_json(text, name));
  if (!j.is_object()) return make_error(ErrorCode::kFormat, "%s: not a JSON object", name.c_str());
  HfTokenizerConfig c;
  for (auto [key, out] : {std::pair{"add_bos_token", &c.add_bos}, {"add_eos_token", &c.add_eos}}) {
    auto it = j.find(key);
    if (it != j.end() && it->is_boolean()) *out = it->get<bool>();
  }
  c.bos_token = token_field(j, "bos_token");
  c.eos_token = token_field(j, "eos_token");
  auto t = j.find("chat_template");
  if (t != j.end()) {
    if (t->is_string()) {
      c.chat_template = t->get<std::string>();
    } else if (t->is_array()) {
      for (const json& e : *t) {
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") &&
            e["template"].is_string()) {
          c.chat_template = e["template"].get<std::string>();
        }
      }
    }
  }
  return c;
}

Result<HfTokenizerConfig> load_hf_tokenizer_config(const std::string& path) {
  LOOM_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_hf_tokenizer_config(text, path);
}

Status apply_hf_tokenizer_config(Vocab& vocab, const HfTokenizerConfig* config, const char* file) {
  SpecialTokens& sp = vocab.special();
  if (config) {
    if (!config->bos_token.empty()) {
      const int32_t id = vocab.find(config->bos_token);
      if (id < 0) {
        return make_error(ErrorCode::kFormat,
                          "%s: bos_token '%s' of tokenizer_config.json is "
                          "not a token",
                          file, config->bos_token.c_str());
      }
      sp.bos = id;
    }
    if (!config->eos_token.empty()) {
      const int32_t id = vocab.find(config->eos_token);
      if (id < 0) {
        return make_error(ErrorCode::kFormat,
                          "%s: eos_token '%s' of tokenizer_config.json is "
                          "not a token",
                          file, config->eos_token.c_str());
      }
      sp.eos = id;
    }
    if (config->add_bos) vocab.set_add_bos(*config->add_bos && sp.bos >= 0);
    if (config->add_eos) vocab.set_add_eos(*config->add_eos && sp.eos >= 0);
  }
  sp.eot = find_eot_by_text(vocab);
  if (sp.eot == sp.eos) sp.eot = -1;
  sp.eom = vocab.find("<|eom_id|>");
  return {};
}

Result<HfVocab> parse_tokenizer_json(std::string_view text, const std::string& name,
                                     const HfTokenizerConfig* config) {
  LOOM_ASSIGN_OR_RETURN(json root, parse_json(text, name));
  const char* file = name.c_str();
  if (!root.is_object()) return make_error(ErrorCode::kFormat, "%s: not a JSON object", file);
  auto mit = root.find("model");
  if (mit == root.end() || !mit->is_object()) {
    return make_error(ErrorCode::kFormat, "%s: no \"model\" object", file);
  }
  const json& model = *mit;
  std::string model_type = type_of(model);
  if (model_type.empty() && model.contains("merges")) model_type = "BPE";  // older files
  if (model_type != "BPE") {
    return make_error(ErrorCode::kUnsupported,
                      "%s: tokenizer model type '%s' is not supported (only BPE: byte-level, or "
                      "SentencePiece-style with byte fallback)",
                      file, model_type.c_str());
  }
  if (model.contains("dropout") && model["dropout"].is_number() &&
      model["dropout"].get<double>() > 0.0) {
    return make_error(ErrorCode::kUnsupported, "%s: BPE dropout is not supported", file);
  }

  // Which BPE: byte-level when a ByteLevel component is present, else
  // SentencePiece-style (byte fallback, "▁" for spaces).
  std::vector<std::string> types;
  for (const char* key : {"normalizer", "pre_tokenizer", "decoder"}) {
    auto it = root.find(key);
    if (it != root.end()) collect_types(*it, &types);
  }
  const bool byte_level = contains(types, "ByteLevel");
  const bool byte_fallback = model.value("byte_fallback", false);
  const bool spm =
      !byte_level && (byte_fallback || contains(types, "Metaspace") || contains(types, "Prepend"));
  if (!byte_level && !spm) {
    return make_error(ErrorCode::kUnsupported,
                      "%s: a BPE model with neither ByteLevel nor SentencePiece-style (Metaspace, "
                      "Prepend, byte_fallback) components is not supported",
                      file);
  }

  HfVocab out{Vocab(spm ? TokenizerModel::kSpm : TokenizerModel::kBpe), {}};
  Vocab& vocab = out.vocab;
  const Ctx ctx{name, &out.notes};

  // Tokens: model.vocab (text -> id) and added_tokens (id, content, special);
  // together they must number the ids 0..n-1 densely.
  auto vit = model.find("vocab");
  if (vit == model.end() || !vit->is_object()) {
    return make_error(ErrorCode::kFormat, "%s: model has no \"vocab\" object", file);
  }
  struct Slot {
    std::string text;
    TokenType type = TokenType::kUndefined;
    bool set = false;
  };
  std::vector<Slot> slots;
  std::vector<std::pair<int64_t, uint8_t>> strips;  ///< added tokens' lstrip / rstrip
  // Ids are dense, so none can reach the number of entries: this bounds the
  // table before any id is trusted.
  auto ait = root.find("added_tokens");
  const int64_t n_ids_max = std::min<int64_t>(
      kMaxTokens,
      static_cast<int64_t>(vit->size()) +
          (ait != root.end() && ait->is_array() ? static_cast<int64_t>(ait->size()) : 0));
  auto place = [&](int64_t id, const std::string& token, TokenType type,
                   const char* where) -> Status {
    if (id < 0 || id >= n_ids_max) {
      return make_error(ErrorCode::kFormat, "%s: %s token '%s' has id %lld, out of range", file,
                        where, token.c_str(), static_cast<long long>(id));
    }
    if (static_cast<size_t>(id) >= slots.size()) slots.resize(static_cast<size_t>(id) + 1);
    Slot& s = slots[static_cast<size_t>(id)];
    if (s.set && s.text != token) {
      return make_error(ErrorCode::kFormat, "%s: id %lld is both '%s' and '%s'", file,
                        static_cast<long long>(id), s.text.c_str(), token.c_str());
    }
    s.text = token;
    s.type = type;
    s.set = true;
    return {};
  };
  for (auto it = vit->begin(); it != vit->end(); ++it) {
    if (!it.value().is_number_integer()) {
      return make_error(ErrorCode::kFormat, "%s: vocab entry '%s' has no integer id", file,
                        it.key().c_str());
    }
    TokenType type = TokenType::kNormal;
    if (spm && byte_fallback && is_byte_token(it.key())) type = TokenType::kByte;
    LOOM_TRY(place(it.value().get<int64_t>(), it.key(), type, "vocab"));
  }
  if (ait != root.end() && ait->is_array()) {
    for (const json& a : *ait) {
      if (!a.is_object() || !a.contains("id") || !a["id"].is_number_integer() ||
          !a.contains("content") || !a["content"].is_string()) {
        return make_error(ErrorCode::kFormat, "%s: an added_tokens entry lacks id or content",
                          file);
      }
      const TokenType type =
          a.value("special", false) ? TokenType::kControl : TokenType::kUserDefined;
      LOOM_TRY(place(a["id"].get<int64_t>(), a["content"].get<std::string>(), type, "added"));
      const uint8_t strip = static_cast<uint8_t>((a.value("lstrip", false) ? Vocab::kLstrip : 0) |
                                                 (a.value("rstrip", false) ? Vocab::kRstrip : 0));
      if (strip) strips.emplace_back(a["id"].get<int64_t>(), strip);
    }
  }
  if (slots.empty()) return make_error(ErrorCode::kFormat, "%s: the vocabulary is empty", file);
  for (const auto& [id, flags] : strips) vocab.set_strip(static_cast<int32_t>(id), flags);
  const std::string unk = model.contains("unk_token") && model["unk_token"].is_string()
                              ? model["unk_token"].get<std::string>()
                              : "";
  for (size_t id = 0; id < slots.size(); ++id) {
    if (!slots[id].set) {
      return make_error(ErrorCode::kFormat, "%s: no token has id %zu (ids must be 0..%zu)", file,
                        id, slots.size() - 1);
    }
    TokenType type = slots[id].type;
    if (!unk.empty() && slots[id].text == unk) type = TokenType::kUnknown;
    vocab.add_token(std::move(slots[id].text), 0.0f, type);
  }
  if (!unk.empty()) vocab.special().unk = vocab.find(unk);

  // Merges: "a b" strings (older files) or ["a", "b"] pairs.
  auto mg = model.find("merges");
  if (mg == model.end() || !mg->is_array()) {
    return make_error(ErrorCode::kFormat, "%s: model has no \"merges\" list", file);
  }
  size_t rank = 0;
  for (const json& m : *mg) {
    std::string left, right;
    if (m.is_string()) {
      const std::string& s = m.get_ref<const std::string&>();
      const size_t space = s.find(' ', 1);
      if (space == std::string::npos) {
        return make_error(ErrorCode::kFormat, "%s: merges[%zu] '%s' is not 'A B'", file, rank,
                          s.c_str());
      }
      left = s.substr(0, space);
      right = s.substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      left = m[0].get<std::string>();
      right = m[1].get<std::string>();
    } else {
      return make_error(ErrorCode::kFormat, "%s: merges[%zu] is neither 'A B' nor [A, B]", file,
                        rank);
    }
    Status s = vocab.add_merge(left, right);
    if (!s.ok()) {
      return make_error(s.error().code(), "%s: merges[%zu]: %s", file, rank, s.message().c_str());
    }
    ++rank;
  }

  if (byte_level) {
    std::vector<std::string> regexes;
    auto pt = root.find("pre_tokenizer");
    if (pt != root.end()) LOOM_TRY(collect_regexes(ctx, *pt, &regexes));
    auto norm = root.find("normalizer");
    if (norm != root.end() && !norm->is_null()) {
      std::vector<std::string> ntypes;
      collect_types(*norm, &ntypes);
      for (const std::string& t : ntypes) {
        if (t == "NFC" || t == "NFKC") {
          out.notes.push_back(t + " normalization is not applied (text is used as given)");
        } else if (t != "Sequence") {
          return make_error(ErrorCode::kUnsupported,
                            "%s: normalizer '%s' is not supported with a byte-level BPE", file,
                            t.c_str());
        }
      }
    }
    vocab.set_pre("custom");
    vocab.set_pre_regexes(std::move(regexes), model.value("ignore_merges", false));
  } else {
    bool prefix = false, split = false;
    LOOM_TRY(read_spm_flags(ctx, root, &prefix, &split));
    vocab.set_add_space_prefix(prefix);
    vocab.set_spm_split_words(split);
  }

  // BOS from the post-processor (TemplateProcessing starting with a special
  // token: Llama 3), or SentencePiece's habit; tokenizer_config.json overrides.
  SpecialTokens& sp = vocab.special();
  auto pp = root.find("post_processor");
  std::vector<const json*> processors;
  if (pp != root.end() && pp->is_object()) {
    processors.push_back(&*pp);
    auto list = pp->find("processors");
    if (list != pp->end() && list->is_array()) {
      for (const json& p : *list) processors.push_back(&p);
    }
  }
  for (const json* p : processors) {
    if (type_of(*p) != "TemplateProcessing") continue;
    auto single = p->find("single");
    if (single == p->end() || !single->is_array() || single->empty()) continue;
    const json& first = (*single)[0];
    if (first.is_object() && first.contains("SpecialToken")) {
      const std::string bos = first["SpecialToken"].value("id", "");
      if (vocab.find(bos) >= 0) {
        sp.bos = vocab.find(bos);
        vocab.set_add_bos(true);
      }
    }
  }
  if (spm && sp.bos < 0) {
    sp.bos = vocab.find("<s>");
    vocab.set_add_bos(sp.bos >= 0);
  }
  if (spm) sp.eos = vocab.find("</s>");
  if (sp.eos < 0) {
    for (const char* t : {"<|end_of_text|>", "<|endoftext|>", "</s>"}) {
      if ((sp.eos = vocab.find(t)) >= 0) break;
    }
  }
  LOOM_TRY(apply_hf_tokenizer_config(vocab, config, file));
  LOOM_TRY(vocab.validate());
  return out;
}

Result<HfVocab> load_tokenizer_json(const std::string& path, const HfTokenizerConfig* config) {
  LOOM_ASSIGN_OR_RETURN(std::string text, read_text_file(path));
  return parse_tokenizer_json(text, path, config);
}

}  // namespace loom
