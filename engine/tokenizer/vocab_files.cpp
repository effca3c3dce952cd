// GPT-2 style vocabulary files: encoder.json + vocab.bpe.
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/tokenizer/vocab.h"

namespace loom {
namespace {

Result<std::string> read_text_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return make_error(ErrorCode::kIo, "%s: cannot open", path.c_str());
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return make_error(ErrorCode::kIo, "%s: read failed", path.c_str());
  return ss.str();
}

}  // namespace

Result<Vocab> load_vocab_gpt2_files(const std::string& encoder_json_path,
                                    const std::string& vocab_bpe_path) {
  LOOM_ASSIGN_OR_RETURN(std::string encoder_text, read_text_file(encoder_json_path));
  nlohmann::json encoder = nlohmann::json::parse(encoder_text, nullptr, /*allow_exceptions=*/false);
  if (encoder.is_discarded() || !encoder.is_object()) {
    return make_error(ErrorCode::kFormat, "%s: not a JSON object of token -> id",
                      encoder_json_path.c_str());
  }
  const size_t n = encoder.size();
  if (n == 0 || n > static_cast<size_t>(INT32_MAX)) {
    return make_error(ErrorCode::kFormat, "%s: %zu tokens", encoder_json_path.c_str(), n);
  }
  std::vector<std::string> texts(n);
  std::vector<bool> seen(n, false);
  for (auto it = encoder.begin(); it != encoder.end(); ++it) {
    if (!it.value().is_number_integer()) {
      return make_error(ErrorCode::kFormat, "%s: the id of '%s' is not an integer",
                        encoder_json_path.c_str(), it.key().c_str());
    }
    const auto id = it.value().get<int64_t>();
    if (id < 0 || static_cast<uint64_t>(id) >= n || seen[static_cast<size_t>(id)]) {
      return make_error(
          ErrorCode::kFormat, "%s: token '%s' has id %lld; ids must be 0..%zu, each used once",
          encoder_json_path.c_str(), it.key().c_str(), static_cast<long long>(id), n - 1);
    }
    seen[static_cast<size_t>(id)] = true;
    texts[static_cast<size_t>(id)] = it.key();
  }

  Vocab vocab(TokenizerModel::kBpe);
  for (std::string& t : texts) vocab.add_token(std::move(t));

  LOOM_ASSIGN_OR_RETURN(std::string merges_text, read_text_file(vocab_bpe_path));
  size_t pos = 0;
  size_t line_no = 0;
  while (pos < merges_text.size()) {
    size_t end = merges_text.find('\n', pos);
    if (end == std::string::npos) end = merges_text.size();
    std::string_view line(merges_text.data() + pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty() || (line_no == 1 && line.rfind("#version", 0) == 0)) continue;
    const size_t space = line.find(' ', 1);
    if (space == std::string_view::npos) {
      return make_error(ErrorCode::kFormat, "%s:%zu: '%.*s' is not two tokens separated by a space",
                        vocab_bpe_path.c_str(), line_no, static_cast<int>(line.size()),
                        line.data());
    }
    Status s = vocab.add_merge(line.substr(0, space), line.substr(space + 1));
    if (!s.ok()) {
      return make_error(s.error().code(), "%s:%zu: %s", vocab_bpe_path.c_str(), line_no,
                        s.message().c_str());
    }
  }
  return vocab;
}

}  // namespace loom
