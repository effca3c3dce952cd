// Pre-tokenizer table and PCRE2-based splitting.
//
// The expressions are those of the models' Hugging Face tokenizer.json files,
// as llama.cpp lists them per `tokenizer.ggml.pre`. PCRE2 runs them natively
// (Unicode properties, lookahead, (?i:...)), so no hand-written emulation is needed.
#include "engine/tokenizer/pretokenize.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>

#include "engine/tokenizer/utf8.h"

namespace loom {
namespace {

// GPT-2's expression (also the ByteLevel default of HF tokenizers).
constexpr const char* kGpt2 =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// Llama 3: case-insensitive contractions (spelled out, so that Unicode case
// folding cannot widen them: (?i) would let "'ſ" match "'s"), digits in groups of up to three.
constexpr const char* kLlama3 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Qwen2: as Llama 3 but every digit on its own.
constexpr const char* kQwen2 =
    R"((?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// DeepSeek LLM's letter class: the cased letters (Lu, Ll, Lt) as its
// tokenizer.json spells them out. Written as escapes on purpose: several of the
// characters (U+212A KELVIN SIGN, U+2126 OHM SIGN, U+1FBE, ...) are turned into
// other characters by Unicode normalization when copied as text.
constexpr const char* kDeepseekLlmLetters =
    R"(\s?[\x{41}-\x{5A}\x{61}-\x{7A}\x{B5}\x{C0}-\x{D6}\x{D8}-\x{F6}\x{F8}-\x{1BA})"
    R"(\x{1BC}-\x{1BF}\x{1C4}-\x{293}\x{295}-\x{2AF}\x{370}-\x{373}\x{376}\x{377})"
    R"(\x{37B}-\x{37D}\x{37F}\x{386}\x{388}-\x{38A}\x{38C}\x{38E}-\x{3A1})"
    R"(\x{3A3}-\x{3F5}\x{3F7}-\x{481}\x{48A}-\x{52F}\x{531}-\x{556}\x{10A0}-\x{10C5})"
    R"(\x{13A0}-\x{13F5}\x{13F8}-\x{13FD}\x{1C90}-\x{1CBA}\x{1CBD}-\x{1CBF})"
    R"(\x{1D00}-\x{1D2B}\x{1D6B}-\x{1D77}\x{1D79}-\x{1D9A}\x{1E00}-\x{1F15})"
    R"(\x{1F18}-\x{1F1D}\x{1F20}-\x{1F45}\x{1F48}-\x{1F4D}\x{1F50}-\x{1F57}\x{1F59})"
    R"(\x{1F5B}\x{1F5D}\x{1F5F}-\x{1F7D}\x{1F80}-\x{1FB4}\x{1FB6}-\x{1FBC}\x{1FBE})"
    R"(\x{1FC2}-\x{1FC4}\x{1FC6}-\x{1FCC}\x{1FD0}-\x{1FD3}\x{1FD6}-\x{1FDB})"
    R"(\x{1FE0}-\x{1FEC}\x{1FF2}-\x{1FF4}\x{1FF6}-\x{1FFC}\x{2102}\x{2107})"
    R"(\x{210A}-\x{2113}\x{2115}\x{2119}-\x{211D}\x{2124}\x{2126}\x{2128})"
    R"(\x{212A}-\x{212D}\x{212F}-\x{2134}\x{2139}\x{213C}-\x{213F}\x{2145}-\x{2149})"
    R"(\x{214E}\x{2183}\x{2184}\x{2C00}-\x{2C7B}\x{2C7E}-\x{2CE4}\x{2CEB}-\x{2CEE})"
    R"(\x{2CF2}\x{2CF3}\x{A640}-\x{A66D}\x{A680}-\x{A69B}\x{A722}-\x{A76F})"
    R"(\x{A771}-\x{A787}\x{A78B}-\x{A78E}\x{AB70}-\x{ABBF}\x{FB00}-\x{FB06})"
    R"(\x{FB13}-\x{FB17}\x{FF21}-\x{FF3A}\x{FF41}-\x{FF5A}\x{10400}-\x{1044F})"
    R"(\x{104B0}-\x{104D3}\x{104D8}-\x{104FB}\x{10C80}-\x{10CB2}\x{10CC0}-\x{10CF2})"
    R"(\x{118A0}-\x{118DF}\x{1E900}-\x{1E943}]+)";

// CJK ideographs (U+4E00-U+9FA5), U+0800-U+4E00 and Hangul, as DeepSeek's tokenizer.json has them.
constexpr const char* kDeepseekCjk = R"([\x{4E00}-\x{9FA5}\x{0800}-\x{4E00}\x{AC00}-\x{D7FF}]+)";

constexpr const char* kBloom =
    R"( ?[^(\s|.,!?\x{2026}\x{3002}\x{FF0C}\x{3001}\x{0964}\x{06D4}\x{060C})]+)";

const std::vector<PreTokenizerSpec>& pre_tokenizer_specs() {
  static const std::vector<PreTokenizerSpec> specs = {
      {"gpt-2",
       {"default", "mpt", "olmo", "jais", "phi-2", "roberta-bpe", "jina-es", "jina-de", "gigachat",
        "jina-v1-en", "jina-v2-es", "jina-v2-de", "jina-v2-code"},
       {kGpt2}},
      {"llama3", {"llama-bpe", "llama-v3", "falcon3", "dbrx", "smaug-bpe"}, {kLlama3}, true, true},
      {"qwen2", {"stablelm2", "megrez"}, {kQwen2}},
      {"chatglm-bpe", {}, {kLlama3}},
      {"deepseek-llm",
       {},
       {"[\r\n]", kDeepseekLlmLetters,
        R"(\s?[\x{21}-\x{2F}\x{3A}-\x{7E}\x{FF01}-\x{FF0F}\x{FF1A}-\x{FF5E}\x{2018}-\x{201F}\x{3000}-\x{3002}]+)",
        R"(\s+$)", kDeepseekCjk, R"(\p{N}+)"}},
      {"deepseek-coder", {}, {"[\r\n]", R"(\s?\p{L}+)", R"(\s?\p{P}+)", kDeepseekCjk, R"(\p{N})"}},
      {"deepseek-v3",
       {},
       {R"(\p{N}{1,3})", R"([\x{4E00}-\x{9FA5}\x{3040}-\x{309F}\x{30A0}-\x{30FF}]+)",
        R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}},
      {"falcon", {}, {R"([\p{P}\$\+<=>\^~\|`]+)", kGpt2, "[0-9][0-9][0-9]"}},
      {"starcoder",
       {"refact", "command-r", "smollm", "codeshell", "exaone", "minerva-7b"},
       {R"(\p{N})", kGpt2}},
      {"bloom", {"poro-chat", "gpt3-finnish"}, {kBloom}},
      {"viking", {}, {kBloom, R"(\p{N})"}},
      {"tekken",
       {},
       {R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
       true,
       true},
  };
  return specs;
}

}  // namespace

const PreTokenizerSpec* find_pre_tokenizer_spec(std::string_view name) {
  for (const PreTokenizerSpec& spec : pre_tokenizer_specs()) {
    if (name == spec.name) return &spec;
    for (const char* alias : spec.aliases) {
      if (name == alias) return &spec;
    }
  }
  return nullptr;
}

struct PreTokenizer::Regex {
  pcre2_code* code = nullptr;
  ~Regex() { pcre2_code_free(code); }
};

PreTokenizer::PreTokenizer() = default;
PreTokenizer::PreTokenizer(PreTokenizer&&) noexcept = default;
PreTokenizer& PreTokenizer::operator=(PreTokenizer&&) noexcept = default;
PreTokenizer::~PreTokenizer() = default;

Result<PreTokenizer> PreTokenizer::from_regexes(const std::vector<std::string>& regexes,
                                                bool ignore_merges) {
  PreTokenizer pt;
  pt.name_ = "custom";
  pt.ignore_merges_ = ignore_merges;
  for (const std::string& pattern : regexes) {
    int error_code = 0;
    PCRE2_SIZE error_offset = 0;
    // MATCH_INVALID_UTF: the text may hold invalid UTF-8 (byte-level BPE must
    // still encode it); such bytes never match and end up between matches.
    auto regex = std::make_unique<Regex>();
    regex->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.c_str()), pattern.size(),
                                PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error_code,
                                &error_offset, nullptr);
    if (!regex->code) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error_code, message, sizeof(message));
      return make_error(ErrorCode::kInvalidArgument,
                        "pre-tokenizer expression '%s' does not compile at offset %zu: %s",
                        pattern.c_str(), static_cast<size_t>(error_offset),
                        reinterpret_cast<const char*>(message));
    }
    // JIT is an optimisation only; without it (no JIT support) the interpreter runs.
    (void)pcre2_jit_compile(regex->code, PCRE2_JIT_COMPLETE);
    pt.regexes_.push_back(std::move(regex));
  }
  return pt;
}

Result<PreTokenizer> PreTokenizer::create(std::string_view name) {
  const PreTokenizerSpec* spec = find_pre_tokenizer_spec(name);
  std::string warning;
  if (!spec) {
    spec = find_pre_tokenizer_spec("gpt-2");
    warning = "unknown pre-tokenizer '" + std::string(name) +
              "': using the GPT-2 expression; tokens may differ from the model's own tokenizer";
  }
  std::vector<std::string> regexes(spec->regexes.begin(), spec->regexes.end());
  LOOM_ASSIGN_OR_RETURN(PreTokenizer pt, from_regexes(regexes));
  pt.name_ = spec->name;
  pt.warning_ = std::move(warning);
  pt.ignore_merges_ = spec->ignore_merges;
  return pt;
}

namespace {

// Splits one piece by one expression into matches and the gaps between them.
void split_piece(const pcre2_code* code, pcre2_match_data* match_data, std::string_view piece,
                 std::vector<std::string_view>* out) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(piece.data());
  size_t pos = 0;        // where the next search starts
  size_t gap_start = 0;  // start of text not yet emitted
  while (pos < piece.size()) {
    int rc = pcre2_match(code, subject, piece.size(), pos, 0, match_data, nullptr);
    if (rc < 0 && rc != PCRE2_ERROR_NOMATCH) {
      // JIT stack or match limit on a pathological input: retry with the interpreter.
      rc = pcre2_match(code, subject, piece.size(), pos, PCRE2_NO_JIT, match_data, nullptr);
    }
    if (rc < 0) break;  // no match, or still failing: the rest is one gap
    const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(match_data);
    const size_t start = ovector[0];
    const size_t end = ovector[1];
    if (end <= start) {
      // An empty match splits nothing; step over one character and search on.
      pos = start + utf8_char_length(piece, start);
      continue;
    }
    if (start > gap_start) out->push_back(piece.substr(gap_start, start - gap_start));
    out->push_back(piece.substr(start, end - start));
    pos = gap_start = end;
  }
  if (gap_start < piece.size()) out->push_back(piece.substr(gap_start));
}

}  // namespace

void PreTokenizer::split(std::string_view text, std::vector<std::string_view>* words) const {
  words->clear();
  if (text.empty()) return;
  words->push_back(text);
  std::vector<std::string_view> next;
  for (const auto& regex : regexes_) {
    pcre2_match_data* match_data = pcre2_match_data_create_from_pattern(regex->code, nullptr);
    if (!match_data) continue;  // out of memory: leave the pieces as they are
    next.clear();
    next.reserve(words->size() * 2);
    for (std::string_view piece : *words) split_piece(regex->code, match_data, piece, &next);
    pcre2_match_data_free(match_data);
    words->swap(next);
  }
}

}  // namespace loom
